"""Shards of raw inner chunks by URL (the default layout where lz4 does not shrink the data,
``compression: auto``; issues 25 and 28): read as shards of Blosc inner chunks are
(``formats/zarr/shard_fetch.py``): each shard fetched whole once for its checksum, the chunks
of later groups kept from those bytes, the first shards asked for at the plan (:mod:`.ahead`).
Before, every inner chunk a call read after the shard's check was its own range request: 4,108
requests in a first epoch of the default store of 16,384 noise rows (2 shards), 2-3 s against
0.15 s for a plain GET of its files (docs/benchmarks.md)."""

from __future__ import annotations

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError
from shardload.formats.zarr.chunks import ChunkLayout
from shardload.formats.zarr.shard_spans import _bytes_fetch, _read_runs
from shardload.move.serve import serving
from test_url_requests import access_log
from test_url_shard_fetch import KW, SHARDS, assert_corrupt_shard_named, data_requests, served_url

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def raw_sharded(tmp_path):
    store = make_store(
        tmp_path, fmt="zarr", compression="none", n=1024, chunk_rows=8, shard_chunks=32
    )
    layout = store.reader.layout("x")
    assert layout is not None and layout.shard is not None and not layout.blosc
    local = [b["index"] for b in shardload.iter_batches(store, **KW)]
    assert len(local) == 32
    return tmp_path, local


def epoch(store, local) -> None:
    got = list(shardload.iter_batches(store, **KW))
    assert len(got) == len(local)
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))


def test_first_epoch_fetches_each_raw_shard_once_and_nothing_else(raw_sharded) -> None:
    """A first epoch: each shard one whole GET (its check), no range request (before: one per
    inner chunk read by a group after the one that checked it)."""
    root, local = raw_sharded
    with served_url(root) as (url, seen):
        epoch(url, local)
    count = data_requests(seen)
    assert sorted(s for _, s in count) == [200] * (2 * SHARDS), count
    assert set(count.values()) == {1}, count


@pytest.mark.parametrize("verify", ["auto", "never"])
def test_later_or_unchecked_epochs_of_raw_shards_in_few_requests(raw_sharded, verify) -> None:
    """A second epoch of one opened store, and epochs without checks: the same batches, each
    shard in a few requests (before: 512 inner chunks, a request each)."""
    root, local = raw_sharded
    with served_url(root) as (url, seen):
        store = shardload.open_store(url, verify=verify)
        epoch(store, local)
        seen.clear()
        epoch(store, local)
    count = data_requests(seen)
    assert sum(count.values()) <= 4 * 2 * SHARDS, count


def test_unaligned_spans_of_raw_shards_by_url(raw_sharded) -> None:
    """Spans that start and end inside inner chunks: their rows copied out of the shard's
    checked bytes, as read from the folder."""
    root, _ = raw_sharded
    local = shardload.open_store(root / "store")
    spans = [(3, 21), (250, 251), (700, 777), (1000, 1024)]
    with access_log() as seen, serving(root) as base:
        reader = shardload.open_store(f"{base}store").reader
        outs = [np.full((b - a, 4), np.nan, "f4") for a, b in spans]
        reader.read_spans_into("x", spans, outs)
    for (a, b), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, local.read("x", a, b))
    assert not [p for m, p, s in seen if "/c/" in p and s != 200], seen


def test_a_corrupt_raw_shard_by_url_is_named(raw_sharded) -> None:
    assert_corrupt_shard_named(raw_sharded[0])


def _raw_layout(raw_sharded) -> ChunkLayout:
    layout = shardload.open_store(raw_sharded[0] / "store").reader.layout("x")
    assert layout is not None
    return layout


def test_a_raw_inner_chunk_of_the_wrong_size_is_corrupt(raw_sharded) -> None:
    """An index entry that does not hold exactly the chunk's rows is an error naming the chunk,
    never rows taken from the bytes around it."""
    layout = _raw_layout(raw_sharded)
    full = layout.chunk_rows * layout.row_bytes
    index = np.array([[0, full], [full, full - 4]], np.uint64)
    data = np.arange(2 * full, dtype=np.uint8)
    out = np.zeros(full, np.uint8)
    with pytest.raises(ChunkReadError, match=r"inner chunk 1 of shard 0\) .*'x' is corrupt"):
        _read_runs(
            layout, "x", 0, [(1, 0, layout.chunk_rows, out.data)], index, "p", _bytes_fetch(data)
        )
    rb = layout.row_bytes
    part = out[: 3 * rb].data  # rows 2-4 of inner chunk 0
    _read_runs(layout, "x", 0, [(0, 2, 5, part)], index, "p", _bytes_fetch(data))
    assert out[: 3 * rb].tolist() == data[2 * rb : 5 * rb].tolist()


def test_a_raw_inner_chunk_past_the_answer_is_truncated(raw_sharded) -> None:
    layout = _raw_layout(raw_sharded)
    full = layout.chunk_rows * layout.row_bytes
    index = np.array([[0, full], [full, full]], np.uint64)
    data = np.arange(2 * full - 1, dtype=np.uint8)  # the file ends a byte early
    out = np.zeros(full, np.uint8)
    with pytest.raises(ChunkReadError, match=r"inner chunk 1 of shard 0\) .*'x' is truncated"):
        _read_runs(
            layout, "x", 0, [(1, 0, layout.chunk_rows, out.data)], index, "p", _bytes_fetch(data)
        )
