"""A sharded store by URL (the default layout): a group's inner chunks are fetched in few
requests planned over the whole group, and chunks fetched before this worker needs them are
kept until then (``formats/zarr/shard_fetch.py``, ``formats/zarr/kept.py``; issue 25).

Counted at ``shardload serve``'s access log behind a latency proxy (as tests/test_url_requests.py):
an epoch of the default layout made a range request per inner chunk or close run, about 6,000 for
8,192 chunks, and fetched every shard again after its check (the group that checked a shard
dropped the chunks later groups needed). Every epoch here is checked against the same epoch read
from the folder: the same batches, row for row."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError, ConfigError
from shardload.formats.zarr.kept import KEEP_ENV, KeptChunks, keep_bytes
from shardload.formats.zarr.shard_fetch import plan_runs
from shardload.formats.zarr.shard_local import DECOMPRESS_CTX
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy
from test_url_requests import access_log

pytestmark = pytest.mark.timeout(120)

#: 8 groups of 16 inner chunks of 8 rows, 4 shards of 32 inner chunks per array
KW = {"batch_size": 32, "seed": 3, "split": None, "shuffle_chunks": 16}
SHARDS = 4


@pytest.fixture
def sharded(tmp_path):
    store = make_store(
        tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32
    )
    local = [b["index"] for b in shardload.iter_batches(store, **KW)]
    assert len(local) == 32
    return tmp_path, local


@contextlib.contextmanager
def served_url(root) -> Iterator[tuple[str, list[tuple[str, str, int]]]]:
    """The store's URL behind a 10 ms proxy, and the requests answered meanwhile."""
    with access_log() as seen, serving(root) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.01) as (_, port):
            yield f"http://127.0.0.1:{port}/store", seen


def epoch(store, local) -> None:
    got = list(shardload.iter_batches(store, **KW))
    assert len(got) == len(local)
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))


def data_requests(seen) -> collections.Counter:
    return collections.Counter(
        (p.removeprefix("/store/"), s) for m, p, s in seen if "/c/" in p and m == "GET"
    )


def test_first_epoch_fetches_each_shard_once_and_nothing_else(sharded) -> None:
    """The checks fetch every shard whole (once per reader); the chunks of later groups are
    decoded from those bytes: no range request for data at all (before: one or more per shard
    and group, 8 groups)."""
    root, local = sharded
    with served_url(root) as (url, seen):
        epoch(url, local)
    count = data_requests(seen)
    assert sorted(s for _, s in count) == [200] * (2 * SHARDS), count
    assert set(count.values()) == {1}, count


def test_later_epoch_fetches_each_shard_in_few_requests(sharded) -> None:
    """Checks done (the same Store, a second epoch): each shard's chunks, within 1 MiB of each
    other, are most of the shard, so it is fetched whole again in one request (and checked
    again), its chunks kept for the later groups (before: a request per shard and group); the
    next group's call, planned once that request is answered, may make its own."""
    root, local = sharded
    with served_url(root) as (url, seen):
        store = shardload.open_store(url)
        epoch(store, local)
        seen.clear()
        epoch(store, local)
    count = data_requests(seen)
    assert {s for _, s in count} == {200}, count
    assert len(count) == 2 * SHARDS and max(count.values()) <= 2, count


def test_nothing_kept_with_a_zero_budget(sharded, monkeypatch) -> None:
    """``SHARDLOAD_URL_KEEP_BYTES=0``: each group fetches its own chunks (coalesced), the same
    batches."""
    root, local = sharded
    monkeypatch.setenv(KEEP_ENV, "0")
    with served_url(root) as (url, seen):
        store = shardload.open_store(url)
        epoch(store, local)
        seen.clear()
        epoch(store, local)
    assert sum(data_requests(seen).values()) > 2 * SHARDS


def test_verify_always_checks_each_read_and_keeps_nothing(sharded) -> None:
    """``verify="always"``: every group's read of a shard checks the whole shard again, so no
    chunk is served from bytes kept by an earlier group."""
    root, local = sharded
    with served_url(root) as (url, seen):
        epoch(shardload.open_store(url, verify="always"), local)
    whole = {p: n for (p, s), n in data_requests(seen).items() if s == 200}
    assert len(whole) == 2 * SHARDS and min(whole.values()) >= 4, whole  # 8 groups (kept: 2)


def test_a_shard_gone_after_its_check_is_an_error_naming_it(sharded) -> None:
    """A later epoch (the shard checked, its index kept) whose shard is gone from the server:
    the error names the shard, never the fill value."""
    root, local = sharded
    with served_url(root) as (url, _):
        store = shardload.open_store(url)
        epoch(store, local)
        (root / "store" / "x" / "c" / "2" / "0").unlink()
        with pytest.raises(ChunkReadError, match=r"shard 2 of array 'x' is missing"):
            list(shardload.iter_batches(store, **KW))


@pytest.mark.parametrize("into_bytes", [None, 1])  # 1: every answer read into one buffer
def test_a_corrupt_shard_by_url_is_named(sharded, into_bytes, monkeypatch) -> None:
    if into_bytes is not None:
        import shardload.move.pinned as pinned

        monkeypatch.setattr(pinned, "INTO_BYTES", into_bytes)
    assert_corrupt_shard_named(sharded[0])


def assert_corrupt_shard_named(root: Path) -> None:
    """One byte of shard 1 of ``x`` under ``root`` flipped: an epoch by URL names that shard."""
    path = root / "store" / "x" / "c" / "1" / "0"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    corrupt = pytest.raises(ChunkReadError, match=r"shard 1 of array 'x' is corrupt")
    with served_url(root) as (url, _), corrupt:
        list(shardload.iter_batches(url, **KW))


def test_plan_runs_merges_within_the_gap_and_bounds_each_request() -> None:
    offs, sizes = [200, 0, 100, 10_000], [100, 100, 100, 50]
    assert plan_runs(offs, sizes, gap_bytes=0, run_bytes=1 << 20) == [
        ([1, 2, 0], 0, 300),
        ([3], 10_000, 10_050),
    ]
    assert plan_runs(offs, sizes, gap_bytes=9_700, run_bytes=1 << 20) == [([1, 2, 0, 3], 0, 10_050)]
    assert plan_runs(offs, sizes, gap_bytes=9_700, run_bytes=250) == [
        ([1, 2], 0, 200),
        ([0], 200, 300),
        ([3], 10_000, 10_050),
    ]


def reads(ids: list[int]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Array ``x``'s reads, one a step, in the order given."""
    return {"x": (np.array(ids), np.arange(len(ids)))}


def test_kept_chunks_are_bounded_and_taken_once(monkeypatch) -> None:
    monkeypatch.setenv(KEEP_ENV, "10")
    kept = KeptChunks()
    kept.plan(reads([1, 1, 0, 1]))  # chunk 0 read once, chunk 1 three times, chunk 2 never
    assert kept.take("x", [0]) == {}  # read now: no read of chunk 0 left
    assert not kept.keep("x", 0, b"abc")  # read by no later call
    assert not kept.keep("x", 2, b"abc")  # never read by this worker
    assert kept.keep("x", 1, b"abcdef")
    assert not kept.keep("x", 1, b"abcdef")  # kept already
    assert kept.take("x", [1]) == {1: b"abcdef"}
    assert kept.keep("x", 1, b"0123456789")  # read once more later; fits the 10 bytes
    assert not kept.keep("x", 1, b"0123456789x")  # more than the bound: never kept
    assert kept.nbytes == 10
    kept.plan(reads([1, 1, 1]))  # a new epoch: nothing kept
    assert len(kept) == 0 and kept.nbytes == 0
    monkeypatch.setenv(KEEP_ENV, "lots")
    with pytest.raises(ConfigError, match=KEEP_ENV):
        keep_bytes()


def test_kept_chunks_keep_the_soonest_read_and_drop_the_farthest(monkeypatch) -> None:
    """Full, the kept store makes room for a chunk read sooner than its farthest-read chunk by
    dropping that one (Belady), and keeps no chunk read after all those kept."""
    monkeypatch.setenv(KEEP_ENV, "9")
    kept = KeptChunks()
    kept.plan(reads([0, 5, 3, 4, 2, 1]))  # chunk 5 read at step 1, ..., chunk 1 at step 5
    assert kept.take("x", [0]) == {}
    assert kept.keep("x", 1, b"111") and kept.keep("x", 2, b"222") and kept.keep("x", 4, b"444")
    assert kept.wanted("x", np.arange(6)).tolist() == [5, 3]  # the soonest read first
    assert kept.keep("x", 3, b"333")  # read at step 2: chunk 1 (step 5) dropped
    assert kept.nbytes == 9 and sorted(i for _, i in kept._data) == [2, 3, 4]
    assert kept.dropped == 1
    assert kept.keep("x", 5, b"555")  # read at step 1: chunk 2 (step 4) dropped
    assert sorted(i for _, i in kept._data) == [3, 4, 5]
    kept.plan(reads([0, 5, 3, 4, 2, 1]))
    assert kept.keep("x", 3, b"333") and kept.keep("x", 5, b"555") and kept.keep("x", 4, b"444")
    assert not kept.keep("x", 1, b"111")  # read after every kept chunk: not kept
    assert not kept.keep("x", 2, b"222")
    assert kept.nbytes == 9
    assert [kept.take("x", [i]) for i in (5, 3, 4)] == [{5: b"555"}, {3: b"333"}, {4: b"444"}]
    assert kept.nbytes == 0 and kept.keep("x", 2, b"222")


def test_an_epoch_keeps_within_a_small_bound_and_drops_the_farthest(sharded, monkeypatch) -> None:
    """A bound far below the chunks the first group's checked shards bring: kept bytes never
    exceed it, chunks read sooner replace those read later, the batches are the same."""
    root, local = sharded
    monkeypatch.setenv(KEEP_ENV, str(4 << 10))
    most, dropped = [0], [0]
    keep = KeptChunks.keep

    def counted(self: KeptChunks, name: str, i: int, view) -> bool:
        ok = keep(self, name, i, view)
        dropped[0] = max(dropped[0], self.dropped)
        most[0] = max(most[0], self.nbytes)
        assert self.nbytes <= self.max_bytes
        return ok

    monkeypatch.setattr(KeptChunks, "keep", counted)
    with served_url(root) as (url, _):
        store = shardload.open_store(url)
        epoch(store, local)
        epoch(store, local)
    assert 0 < most[0] <= 4 << 10 and dropped[0] > 0


def test_whole_inner_chunks_by_url_skip_numcodecs_destination_check(sharded, monkeypatch) -> None:
    """An epoch by URL decodes each whole inner chunk with c-blosc straight into the group (or,
    where that symbol is missing, into numcodecs' own buffer and copies it): numcodecs checks a
    destination it is given in Python (``ensure_contiguous_ndarray``, more CPU and GIL than
    decoding a chunk of a few KB), once per chunk before. Counted at that check and at numcodecs'
    decompress: none; the same batches."""
    from numcodecs import blosc

    calls = [0]
    check = blosc.ensure_contiguous_ndarray

    def counted(*args, **kw):  # type: ignore[no-untyped-def]
        calls[0] += 1
        return check(*args, **kw)

    decodes = [0]
    decompress = blosc.decompress

    def counted_decode(*args, **kw):  # type: ignore[no-untyped-def]
        decodes[0] += 1
        return decompress(*args, **kw)

    root, local = sharded
    with served_url(root) as (url, _):
        monkeypatch.setattr(blosc, "ensure_contiguous_ndarray", counted)
        monkeypatch.setattr(blosc, "decompress", counted_decode)
        epoch(url, local)
    assert calls[0] == 0, calls
    if DECOMPRESS_CTX is not None:  # c-blosc called straight into the group, no numcodecs call
        assert decodes[0] == 0, decodes


def test_a_call_that_saw_a_shard_unchecked_takes_what_its_check_kept(tmp_path, monkeypatch):
    """Call A checks shard 0 (fetched whole); call B, of a later group of the same worker, saw
    it unchecked while A was checking but came to its lock only after A left (no one waiting:
    the bytes gone). B's chunks, which A kept for it before leaving, are taken: no request
    more. Before, A kept them only after leaving the lock, once B had counted them as read, so
    B fetched them again (a range request for bytes the reader had just held)."""
    import threading

    import shardload.formats.zarr.shard_fetch as shard_fetch

    make_store(tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32)
    real = shard_fetch._checked_whole
    a_checks, b_asked, a_done = threading.Event(), threading.Event(), threading.Event()
    calls: list[int] = []

    def ordered(*args, **kw):  # type: ignore[no-untyped-def]
        calls.append(1)
        if len(calls) == 1:  # A: B asks (sees the shard unchecked) while A checks
            a_checks.set()
            assert b_asked.wait(10)
        else:  # B: at the lock once A has left and its call returned
            b_asked.set()
            assert a_done.wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(shard_fetch, "_checked_whole", ordered)
    with access_log() as seen, serving(tmp_path) as base:
        reader = shardload.open_store(f"{base}store").reader
        reader.plan_reads(["x"], np.array([0, 64]), np.array([8, 72]))  # A's chunk, then B's
        outs = {"A": np.zeros((8, 4), "f4"), "B": np.zeros((8, 4), "f4")}

        def call(who: str, start: int) -> None:
            if who == "B":
                assert a_checks.wait(10)
            reader.read_spans_into("x", [(start, start + 8)], [outs[who]])
            if who == "A":
                a_done.set()

        threads = [threading.Thread(target=call, args=a) for a in (("A", 0), ("B", 64))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    np.testing.assert_array_equal(outs["A"][:, 0], np.arange(0, 8, dtype="f4"))
    np.testing.assert_array_equal(outs["B"][:, 0], np.arange(64, 72, dtype="f4"))
    count = data_requests(seen)
    assert count == {("x/c/0/0", 200): 1}, count
