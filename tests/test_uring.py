"""io_uring batches of reads (``loader/uring.py``) against plain ``preadv``, and the scatter
reader's fallback from one to the other."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError
from shardload.load import files as files_mod
from shardload.load import runs, uring


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("stores") / "npy", fmt="npy", compression="none")


@pytest.fixture
def ring():
    uring.reset_for_tests(None)
    r = uring.thread_ring()
    if r is None:
        pytest.skip("io_uring is not usable here (kernel, seccomp or SHARDLOAD_IO_URING=0)")
    yield r
    uring.reset_for_tests(None)


def test_ring_reads_what_preadv_reads_in_several_rounds(tmp_path, ring):
    """More entries than one round holds, scattered destinations, two files; a bad file
    descriptor gives ``-EBADF`` for its entry only."""
    rng = np.random.default_rng(0)
    data = [rng.integers(0, 255, 1 << 16, dtype=np.uint8) for _ in range(2)]
    fds = []
    for i, d in enumerate(data):
        p = tmp_path / f"f{i}"
        p.write_bytes(d.tobytes())
        fds.append(os.open(p, os.O_RDONLY))
    try:
        n = 3 * ring.depth + 5
        which = rng.integers(0, 2, n)
        lens = rng.integers(1, 300, n)
        offs = rng.integers(0, (1 << 16) - 300, n)
        out = np.zeros(int(lens.sum()), np.uint8)
        dst = np.concatenate(([0], np.cumsum(lens)[:-1]))
        iov = np.stack([out.ctypes.data + dst, lens], axis=1).astype(np.uint64)
        ptrs = (iov.ctypes.data + 16 * np.arange(n)).astype(np.uint64)
        fd = np.array(fds, np.int64)[which]
        fd[7] = 10**6  # no such descriptor
        res = ring.readv(fd, ptrs, np.ones(n, np.uint32), offs.astype(np.uint64))
        assert res[7] == -9  # EBADF
        ok = np.flatnonzero(np.arange(n) != 7)
        assert (res[ok] == lens[ok]).all()
        for i in ok.tolist():
            want = data[which[i]][offs[i] : offs[i] + lens[i]]
            assert (out[dst[i] : dst[i] + lens[i]] == want).all()
    finally:
        for f in fds:
            os.close(f)


@pytest.mark.parametrize("read_op", [True, False])
def test_one_iovec_entries_go_as_plain_reads(tmp_path, ring, monkeypatch, read_op):
    """``single`` given: entries of one iovec go as ``IORING_OP_READ`` into that buffer, the
    others as ``READV``, with the same bytes and results as ``preadv``; with plain reads off
    (a kernel without them, after one came back ``EINVAL``) every entry is a ``READV``."""
    rng = np.random.default_rng(2)
    data = rng.integers(0, 255, 1 << 16, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    if not read_op:
        monkeypatch.setitem(uring._STATE, "read_op", False)
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 2 * ring.depth + 3
        counts = rng.integers(1, 3, n).astype(np.uint32)  # 1 or 2 iovecs an entry
        lens = rng.integers(1, 200, (n, 2))
        offs = rng.integers(0, (1 << 16) - 400, n)
        out = np.zeros(int(lens.sum()), np.uint8)
        dst = np.concatenate(([0], np.cumsum(lens)[:-1])).reshape(n, 2)
        iov = np.stack([out.ctypes.data + dst.ravel(), lens.ravel()], axis=1).astype(np.uint64)
        ptrs = (iov.ctypes.data + 32 * np.arange(n)).astype(np.uint64)
        res = ring.readv(
            np.full(n, fd), ptrs, counts, offs.astype(np.uint64), (iov[::2, 0], iov[::2, 1])
        )
        want = np.where(counts == 1, lens[:, 0], lens.sum(axis=1))
        assert (res == want).all()
        for i in range(n):
            got = np.concatenate(
                [out[dst[i, j] : dst[i, j] + lens[i, j]] for j in range(counts[i])]
            )
            assert (got == data[offs[i] : offs[i] + want[i]]).all()
        m = min(100, ring.depth)  # entries that go into the ring in one slice
        ring.readv(
            np.full(m, fd),
            ptrs[:m],
            counts[:m],
            offs[:m].astype(np.uint64),
            (iov[: 2 * m : 2, 0], iov[: 2 * m : 2, 1]),
        )
        expect = np.where(counts[:m] == 1, 22, 1) if read_op else 1
        assert (ring.sqes["opcode"][:m] == expect).all()
    finally:
        os.close(fd)


def _epoch(store, **kw):
    return list(shardload.iter_batches(store, batch_size=8, split="train", threads=2, **kw))


@pytest.mark.parametrize("shuffle", [True, "uniform"])
def test_scatter_batches_are_equal_with_and_without_io_uring(npy, ring, shuffle, monkeypatch):
    monkeypatch.setattr(runs, "READ_ROWS", None)  # every call to io_uring, none staged
    got = _epoch(npy, shuffle=shuffle)
    uring.reset_for_tests(False)
    want = _epoch(npy, shuffle=shuffle)
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


def test_a_failed_ring_entry_is_read_again_and_named(npy, ring, monkeypatch):
    """Entries io_uring fails (here: all of them, as ``-EIO``) are read again with ``preadv``:
    a transient failure costs nothing, a real one raises ``ChunkReadError`` naming the file."""
    monkeypatch.setattr(runs, "READ_ROWS", None)  # every call to io_uring, none staged
    monkeypatch.setattr(uring.Ring, "readv", lambda self, fds, *a: np.full(len(fds), -5))
    want = _epoch(npy, shuffle=False)
    uring.reset_for_tests(False)
    ref = _epoch(npy, shuffle=False)
    assert all((a["x"] == b["x"]).all() for a, b in zip(want, ref, strict=True))
    uring.reset_for_tests(None)

    monkeypatch.setattr(runs, "_preadv", lambda errno=False: lambda *a: -1)
    with pytest.raises(ChunkReadError, match=r"chunk \d+ of array .* could not be read"):
        _epoch(npy, shuffle=False)


def test_io_uring_can_be_turned_off_by_environment(monkeypatch):
    monkeypatch.setenv("SHARDLOAD_IO_URING", "0")
    uring.reset_for_tests(None)
    try:
        assert uring.thread_ring() is None
    finally:
        monkeypatch.delenv("SHARDLOAD_IO_URING")
        uring.reset_for_tests(None)


def test_open_chunks_looks_up_many_chunks_at_once_and_checks_their_sizes(tmp_path):
    """``OpenChunks.lookup``: every chunk's descriptor, data offset and row size per entry
    (repeats allowed), opened once while under the limit and by the caller past it (those are
    returned to be closed); a chunk too short for the rows wanted raises naming chunk and
    file, closing what it opened."""
    from shardload.formats.base import RawChunk

    paths = []
    for c in range(5):
        p = tmp_path / f"c{c}"
        p.write_bytes(bytes(16 + 10 * (c + 1)))  # header of 16 bytes, c + 1 rows of 10
        paths.append(str(p))

    def raw(c: int) -> RawChunk:
        return RawChunk(paths[c], 16, 10)

    files = files_mod.OpenChunks(limit=2)
    chunks = np.array([4, 0, 4, 3, 0])
    fd, off, row, owned = files.lookup(raw, "x", chunks, chunks + 1)
    assert off.tolist() == [16] * 5 and row.tolist() == [10] * 5
    assert fd[0] == fd[2] and fd[1] == fd[4] and len(set(fd.tolist())) == 3
    assert owned == [fd[0]]  # the limit: chunks 0 and 3 cached, 4 opened for this call
    for c, d in zip(chunks.tolist(), fd.tolist(), strict=True):
        assert os.path.samefile(os.readlink(f"/proc/self/fd/{d}"), paths[c])
    for d in owned:
        os.close(d)
    again, _, _, owned2 = files.lookup(raw, "x", np.array([3, 0]), np.array([1, 1]))
    assert again.tolist() == [fd[3], fd[1]] and owned2 == []  # the cached ones, not reopened
    with pytest.raises(ChunkReadError, match=r"chunk 1 of array 'x' is truncated .*c1 has 36"):
        files.lookup(raw, "x", np.array([0, 1]), np.array([1, 3]))
    files.close()
    for d in (fd[1], fd[3]):
        with pytest.raises(OSError):
            os.fstat(int(d))


def _read_rows(ring, fds, offs, nbytes, **kw):
    out = np.zeros((len(fds), nbytes), np.uint8)
    iov = np.stack(
        [out.ctypes.data + nbytes * np.arange(len(fds)), np.full(len(fds), nbytes)], axis=1
    ).astype(np.uint64)
    ptrs = (iov.ctypes.data + 16 * np.arange(len(fds))).astype(np.uint64)
    res = ring.readv(
        np.asarray(fds),
        ptrs,
        np.ones(len(fds), np.uint32),
        np.asarray(offs, np.uint64),
        (iov[:, 0], iov[:, 1]),
        **kw,
    )
    return res, out


def test_results_do_not_depend_on_the_depth(tmp_path, ring):
    rng = np.random.default_rng(3)
    data = rng.integers(0, 255, 1 << 18, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        n = 2 * ring.depth + 77
        offs = rng.integers(0, (1 << 18) - 600, n)
        runs = [_read_rows(ring, np.full(n, fd), offs, 600, depth=d) for d in (1, 7, None)]
        for res, out in runs:
            assert (res == 600).all()
            np.testing.assert_array_equal(out, data[offs[:, None] + np.arange(600)])
    finally:
        os.close(fd)


def test_a_slow_read_does_not_hold_up_the_others(tmp_path, ring):
    """Submission is continuous: while one read waits (a pipe nobody has written to yet), the
    reads after it go through the ring's other slots, where rounds of as many reads as the
    ring holds waited for their slowest one before submitting the next round."""
    import threading

    data = np.arange(4096, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    rfd, wfd = os.pipe()
    n = ring.depth + 40
    fds = np.full(n, fd)
    fds[0] = rfd
    offs = np.arange(n) * 8 % 4000
    offs[0] = 0
    out = np.zeros((n, 8), np.uint8)
    done_before_pipe: list[bool] = []

    def writer() -> None:
        import time

        t0 = time.monotonic()
        while time.monotonic() - t0 < 3 and not (out[1:, 1] != 0).all():
            time.sleep(0.005)
        done_before_pipe.append(bool((out[1:, 1] != 0).all()))
        os.write(wfd, b"abcdefgh")

    t = threading.Thread(target=writer)
    t.start()
    try:
        iov = np.stack([out.ctypes.data + 8 * np.arange(n), np.full(n, 8)], axis=1)
        iov = iov.astype(np.uint64)
        ptrs = (iov.ctypes.data + 16 * np.arange(n)).astype(np.uint64)
        res = ring.readv(
            fds, ptrs, np.ones(n, np.uint32), offs.astype(np.uint64), (iov[:, 0], iov[:, 1])
        )
    finally:
        t.join()
        for f in (fd, rfd, wfd):
            os.close(f)
    assert (res == 8).all()
    assert bytes(out[0]) == b"abcdefgh"
    np.testing.assert_array_equal(out[1:], data[offs[1:, None] + np.arange(8)])
    assert done_before_pipe == [True]


def test_direct_reads_deliver_what_preadv_reads(tmp_path, ring):
    """``Ring.read_direct``: unaligned byte ranges (one or two iovecs each) from an
    ``O_DIRECT`` descriptor, through aligned bounce slots, equal the file's bytes for any
    depth; a range past the end of the file comes back short (the caller reads it again)."""
    rng = np.random.default_rng(4)
    size = (1 << 18) + 123  # not a multiple of the alignment
    data = rng.integers(0, 255, size, dtype=np.uint8)
    path = tmp_path / "f"
    path.write_bytes(data.tobytes())
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        pytest.skip("this file system refuses O_DIRECT")
    try:
        n = 700
        lens = rng.integers(1, 9000, (n, 2))
        counts = rng.integers(1, 3, n)
        lens[counts == 1, 1] = 0
        total = lens.sum(axis=1)
        offs = rng.integers(0, size - 18000, n)
        offs[-1] = size - 10  # past the end
        out = np.zeros(int(lens.sum()), np.uint8)
        dst = np.concatenate(([0], np.cumsum(lens)[:-1])).reshape(n, 2)
        iov = np.stack([out.ctypes.data + dst.ravel(), lens.ravel()], axis=1).astype(np.uint64)
        ptrs = (iov.ctypes.data + 32 * np.arange(n)).astype(np.uint64)
        for depth, first in ((1, None), (5, iov[::2, 0]), (None, None)):
            out[:] = 0
            res = ring.read_direct(
                np.full(n, fd), offs, total, ptrs, counts, depth=depth, first=first
            )
            assert res[-1] == 10  # the 10 bytes there are
            assert (res[:-1] == total[:-1]).all()
            for i in range(n - 1):
                got = np.concatenate([out[dst[i, j] : dst[i, j] + lens[i, j]] for j in range(2)])
                np.testing.assert_array_equal(got, data[offs[i] : offs[i] + total[i]])
    finally:
        os.close(fd)


@pytest.fixture
def spy_direct(monkeypatch):
    calls: list[int] = []
    real = uring.Ring.read_direct

    def spy(self, fds, *a, **kw):
        calls.append(len(fds))
        return real(self, fds, *a, **kw)

    monkeypatch.setattr(uring.Ring, "read_direct", spy)
    return calls


def test_uniform_reads_past_the_page_cache_give_the_same_batches(
    npy, ring, monkeypatch, spy_direct
):
    """``SHARDLOAD_O_DIRECT=1`` (what a store larger than memory gets): a uniform epoch's rows
    go through ``O_DIRECT`` reads, and its batches equal those read through the page cache,
    with io_uring or with ``preadv``."""
    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "1")
    got = _epoch(npy, shuffle="uniform")
    if not spy_direct:
        pytest.skip("this file system refuses O_DIRECT")
    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "0")
    n = len(spy_direct)
    ref = _epoch(npy, shuffle="uniform")
    assert len(spy_direct) == n  # none with it off
    uring.reset_for_tests(False)
    ref2 = _epoch(npy, shuffle="uniform")
    for want in (ref, ref2):
        assert len(got) == len(want)
        for a, b in zip(got, want, strict=True):
            for k in a:
                np.testing.assert_array_equal(a[k], b[k])


def test_failed_direct_reads_are_read_again_and_named(npy, ring, monkeypatch):
    """A direct read that fails (``EINVAL``: a file system or alignment that refuses it) is
    read again through the page cache, with the same batches; where that fails too, the
    error names the chunk and its file."""
    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "0")
    ref = _epoch(npy, shuffle="uniform")
    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "1")
    seen: list[int] = []
    monkeypatch.setattr(
        uring.Ring,
        "read_direct",
        lambda self, fds, *a, **kw: (seen.append(1), np.full(len(fds), -22))[1],
    )
    got = _epoch(npy, shuffle="uniform")
    if not seen:
        pytest.skip("this file system refuses O_DIRECT")
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a["x"], b["x"])
    monkeypatch.setattr(runs, "_preadv", lambda errno=False: lambda *a: -1)
    with pytest.raises(ChunkReadError, match=r"chunk \d+ of array 'x' could not be read .*npy"):
        _epoch(npy, shuffle="uniform")


def test_direct_reads_are_chosen_for_stores_larger_than_memory(monkeypatch, ring):
    monkeypatch.delenv("SHARDLOAD_O_DIRECT", raising=False)
    monkeypatch.setattr(files_mod, "memory_bytes", lambda: 1000)
    big = files_mod.DIRECT_STORE_FACTOR * 1000
    assert files_mod.read_past_cache(big + 1) and not files_mod.read_past_cache(big)
    monkeypatch.setattr(files_mod, "memory_bytes", lambda: None)
    assert not files_mod.read_past_cache(1 << 40)
    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "1")
    assert files_mod.read_past_cache(1)
    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "0")
    monkeypatch.setattr(files_mod, "memory_bytes", lambda: 1000)
    assert not files_mod.read_past_cache(1 << 40)
    monkeypatch.delenv("SHARDLOAD_O_DIRECT")
    uring.reset_for_tests(False)  # no io_uring: the preadv path reads through the page cache
    assert not files_mod.read_past_cache(1 << 40)


def test_memory_bytes_is_at_most_what_is_available():
    got = files_mod.memory_bytes()
    if got is None:
        pytest.skip("no /proc/meminfo here")
    with open("/proc/meminfo") as f:
        avail = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("MemAvailable"))
    assert 0 < got <= avail * 1.5  # MemAvailable moves between the two reads


def _uniform_digest(store, direct: str, **kw):
    """(index, x) of a uniform epoch, in a process of its own (fork or spawn)."""
    os.environ["SHARDLOAD_O_DIRECT"] = direct
    got = list(shardload.iter_batches(store, batch_size=8, split="train", shuffle="uniform", **kw))
    return np.concatenate([b["index"] for b in got]), np.concatenate([b["x"] for b in got])


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_direct_reads_resume_and_run_in_worker_processes(
    npy, ring, monkeypatch, spy_direct, method
):
    """With ``O_DIRECT`` reads the batches do not depend on the thread count, a resumed epoch
    (``skip_batches``) gives the rest of them, and a forked child (this process's rings set
    up before the fork) or a spawned one reads the same: each process sets up its own rings
    and opens its own descriptors."""
    import multiprocessing

    monkeypatch.setenv("SHARDLOAD_O_DIRECT", "1")
    whole = _uniform_digest(npy, "1", threads=1)
    if not spy_direct:
        pytest.skip("this file system refuses O_DIRECT")
    more = _uniform_digest(npy, "1", threads=3)
    rest = _uniform_digest(npy, "1", threads=2, skip_batches=3)
    for a, b in zip(whole, more, strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(whole, rest, strict=True):
        np.testing.assert_array_equal(a[3 * 8 :], b)
    assert uring.thread_ring() is not None  # the parent holds a ring when it forks
    with multiprocessing.get_context(method).Pool(1) as pool:
        child = pool.apply(_uniform_digest, (npy, "1"))
    for a, b in zip(whole, child, strict=True):
        np.testing.assert_array_equal(a, b)
