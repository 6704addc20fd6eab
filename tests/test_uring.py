"""io_uring batches of reads (``loader/uring.py``) against plain ``preadv``, and the scatter
reader's fallback from one to the other."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError
from shardload.loader import scatter, uring


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
        n = 3 * ring.batch + 5
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
        n = 2 * ring.batch + 3
        counts = rng.integers(1, 3, n).astype(np.uint32)  # 1 or 2 iovecs an entry
        lens = rng.integers(1, 200, (n, 2))
        offs = rng.integers(0, (1 << 16) - 400, n)
        out = np.zeros(int(lens.sum()), np.uint8)
        dst = np.concatenate(([0], np.cumsum(lens)[:-1])).reshape(n, 2)
        iov = np.stack([out.ctypes.data + dst.ravel(), lens.ravel()], axis=1).astype(np.uint64)
        ptrs = (iov.ctypes.data + 32 * np.arange(n)).astype(np.uint64)
        res = ring.readv(np.full(n, fd), ptrs, counts, offs.astype(np.uint64),
                         (iov[::2, 0], iov[::2, 1]))  # fmt: skip
        want = np.where(counts == 1, lens[:, 0], lens.sum(axis=1))
        assert (res == want).all()
        for i in range(n):
            got = np.concatenate(
                [out[dst[i, j] : dst[i, j] + lens[i, j]] for j in range(counts[i])]
            )
            assert (got == data[offs[i] : offs[i] + want[i]]).all()
        last = ring.sqes["opcode"][: n % ring.batch]  # the last round's entries
        expect = np.where(counts[-len(last) :] == 1, 22, 1) if read_op else 1
        assert (last == expect).all()
    finally:
        os.close(fd)


def _epoch(store, **kw):
    return list(shardload.iter_batches(store, batch_size=8, split="train", threads=2, **kw))


@pytest.mark.parametrize("shuffle", [True, "uniform"])
def test_scatter_batches_are_equal_with_and_without_io_uring(npy, ring, shuffle):
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
    monkeypatch.setattr(uring.Ring, "readv", lambda self, fds, *a: np.full(len(fds), -5))
    want = _epoch(npy, shuffle=False)
    uring.reset_for_tests(False)
    ref = _epoch(npy, shuffle=False)
    assert all((a["x"] == b["x"]).all() for a, b in zip(want, ref, strict=True))
    uring.reset_for_tests(None)

    monkeypatch.setattr(scatter, "_preadv", lambda errno=False: lambda *a: -1)
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

    files = scatter.OpenChunks(limit=2)
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
