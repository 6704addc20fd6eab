"""Raw Zarr chunk files by URL (issues 25 and 28): a call's pieces in one range request per
chunk file (near pieces merged), each file fetched whole once for its checksum and kept for the
later groups, as an npy stack by URL (tests/test_url_npy.py). Before, each piece of a row span
was its own range request (134 an epoch of a 2,000-row store of one 512 KB chunk file, against
6 requests for the same store compressed)."""

from __future__ import annotations

import collections
import doctest

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.move.serve import serving
from test_url_requests import access_log, assert_same_batches, spans_read_twice

pytestmark = pytest.mark.timeout(120)

KW = {"batch_size": 64, "seed": 5, "split": None}


def test_plan_runs_doctest() -> None:
    import shardload.formats.zarr.ranges

    result = doctest.testmod(shardload.formats.zarr.ranges)
    assert result.attempted > 0 and result.failed == 0


@pytest.fixture(scope="module")
def raw_store(tmp_path_factory):
    """Uncompressed Zarr, 16 chunk files of 64 rows per array (x: 16 bytes a row, y: 8)."""
    tmp = tmp_path_factory.mktemp("rawzarr")
    make_store(tmp, fmt="zarr", compression="none", n=1024, chunk_rows=64)
    return tmp


def chunk_files(root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.glob("[xy]/c/*/0"))


def test_an_epoch_fetches_each_chunk_file_once(raw_store) -> None:
    """First epoch (every file checked): each chunk file one request, whole, and no range
    request of any; a second epoch of the same store none (the checked files are kept)."""
    want = list(shardload.iter_batches(raw_store / "store", **KW))
    with access_log() as seen, serving(raw_store) as base:
        store = shardload.open_store(f"{base}store")
        got = list(shardload.iter_batches(store, **KW))
        first = list(seen)
        again = list(shardload.iter_batches(store, **KW))
    assert_same_batches(want, got, again)
    files = chunk_files(raw_store / "store")
    data = [(p.removeprefix("/store/"), s) for _, p, s in first if "/c/" in p]
    assert collections.Counter(data) == {(f, 200): 1 for f in files}, data
    assert seen[len(first) :] == []


@pytest.mark.parametrize("verify", ["never", "auto"])
def test_a_call_reads_a_chunk_file_in_one_request(raw_store, verify, monkeypatch) -> None:
    """96 one-row spans over 3 chunk files, twice (checked files not kept): one range request
    per file and call (its pieces lie within 1 MiB), or the file checked whole and then one
    range request; the rows those of the local store."""
    monkeypatch.setenv("SHARDLOAD_URL_KEEP_BYTES", "0")
    seen = spans_read_twice(raw_store, verify=verify)
    files = ["/store/x/c/0/0", "/store/x/c/1/0", "/store/x/c/2/0"]
    got = collections.Counter((p, s) for _, p, s in seen if p in files)
    assert [p for _, p, _ in seen if "/x/c/" in p and p not in files] == []
    if verify == "never":
        assert got == {(f, 206): 2 for f in files}, seen
    else:
        assert got == {**{(f, 200): 1 for f in files}, **{(f, 206): 1 for f in files}}, seen


def test_pieces_far_apart_are_separate_requests(raw_store, monkeypatch) -> None:
    """Pieces of one file farther apart than ``URL_GAP_BYTES`` are not merged (the bytes
    between them are not fetched): here a gap of 0 bytes, two pieces, two requests."""
    from shardload.formats.zarr import ranges

    monkeypatch.setattr(ranges, "URL_GAP_BYTES", 0)
    local = shardload.open_store(raw_store / "store")
    spans = [(0, 2), (10, 12), (2, 4)]  # the first and last adjoin: one request
    with access_log() as seen, serving(raw_store) as base:
        reader = shardload.open_store(f"{base}store", verify="never").reader
        outs = [np.full((2, 4), np.nan, "f4") for _ in spans]
        reader.read_spans_into("x", spans, outs)
    for (a, b), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, local.read("x", a, b))
    assert [(p, s) for _, p, s in seen if "/x/c/" in p] == [("/store/x/c/0/0", 206)] * 2


@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_pieces_farther_apart_than_the_gap_are_not_merged(tmp_path, fmt) -> None:
    """Two rows about 320 KB apart in one 640 KB chunk file: two range requests, not one of the
    bytes between (``URL_GAP_BYTES`` is 256 KiB: a default group's pieces of a large file lie a
    few hundred KB apart, and merging them fetched about 3 times the store an epoch)."""
    make_store(tmp_path, fmt=fmt, compression="none", n=40_000, chunk_rows=40_000)
    local = shardload.open_store(tmp_path / "store")
    spans = [(0, 1), (20_000, 20_001)]  # x: 16 bytes a row
    with access_log() as seen, serving(tmp_path) as base:
        reader = shardload.open_store(f"{base}store", verify="never").reader
        seen.clear()  # the open's reads
        outs = [np.full((1, 4), np.nan, "f4") for _ in spans]
        reader.read_spans_into("x", spans, outs)
    for (a, b), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, local.read("x", a, b))
    data = [(p, s) for _, p, s in seen if p.startswith("/store/x/") and "zarr.json" not in p]
    assert len(data) == 2, data  # (an npy header: read at the open)
    assert {s for _, s in data} == {206}, data


@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_a_thread_that_asked_before_a_check_ended_gets_the_kept_bytes(tmp_path, fmt) -> None:
    """Thread B saw chunk file 0 unchecked, then waited for its lock while thread A checked it
    and kept its bytes: B finds them kept, not a range request more. Before, A kept the bytes
    only after leaving the lock, so B (no one waiting any more when A left) got None and fetched
    its pieces again: a worker's data file asked for twice (a flaky
    ``test_url_open.py::test_a_forked_dataloader_worker_fetches_no_metadata[npy]``)."""
    make_store(tmp_path, fmt=fmt, compression="none", n=256, chunk_rows=64)
    with access_log() as seen, serving(tmp_path) as base:
        reader = shardload.open_store(f"{base}store").reader
        outs = [np.full((1, 4), np.nan, "f4")]
        reader.read_spans_into("x", [(0, 1)], outs)  # thread A: checks file 0, keeps it
        seen.clear()
        if fmt == "npy":
            got = reader._checked_whole("x", 0)  # thread B, once A's lock is free
        else:
            got = reader.raw_url._checked_whole(reader.ranged("x"), "x", 0)
    assert got is not None and len(got) >= 64 * 16, got
    assert seen == []
