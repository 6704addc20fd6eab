"""Several spans of a sharded array in one call (formats/zarr/shard_spans.py): the values of
span-by-span reads, each shard file opened once per call, and damage still named."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import shardload
from _stores import check_values, make_store
from shardload.errors import ChunkReadError
from shardload.formats.zarr.chunks import ChunkLayout

pytest.importorskip("zarr")

ROWS, PER_SHARD = 7, 4  # inner chunk rows, inner chunks per shard: shards of 28 rows
N = 203  # 29 inner chunks in 8 shards (the last partial)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("spans")
    make_store(tmp, fmt="zarr", compression="zstd", n=N, chunk_rows=ROWS, shard_chunks=PER_SHARD)
    return tmp / "store"


@pytest.fixture
def opens(monkeypatch) -> Counter[str]:
    """Counts the shard files the native reader opens, by path."""
    seen: Counter[str] = Counter()
    real = ChunkLayout.open

    def spy(self: ChunkLayout, path: str):  # type: ignore[no-untyped-def]
        seen[path] += 1
        return real(self, path)

    monkeypatch.setattr(ChunkLayout, "open", spy)
    return seen


def _spans(rng: np.random.Generator) -> list[tuple[int, int]]:
    """Whole inner chunks in a shuffled order, and pieces: inside a chunk, across chunks and
    across shards, an empty one, the partial last chunk."""
    whole = [(c * ROWS, min((c + 1) * ROWS, N)) for c in rng.permutation(-(-N // ROWS))]
    return [*whole, (3, 5), (26, 58), (10, 10), (200, 203), (0, N)]


def test_spans_equal_span_by_span_reads(sharded):
    store = shardload.open_store(sharded)
    reader = store.reader
    for name in store.arrays:
        info = store.manifest.arrays[name]
        spans = _spans(np.random.default_rng(0))
        outs = [np.full((b - a, *info.row_shape), 7, info.dtype) for a, b in spans]
        reader.read_spans_into(name, spans, outs)  # type: ignore[attr-defined]
        for (a, b), out in zip(spans, outs, strict=True):
            want = np.empty_like(out)
            reader.read_into(name, a, b, want)
            np.testing.assert_array_equal(out, want)
            np.testing.assert_array_equal(out, reader._read_zarr(name, a, b))  # type: ignore[attr-defined]


def test_a_call_opens_each_shard_file_once(sharded, opens):
    """The default load reads a group's whole inner chunks from all over a few shards: one
    open per shard and call, not one per inner chunk (45-50 us of CPU each, issue 25)."""
    store = shardload.open_store(sharded)
    info = store.manifest.arrays["x"]
    spans = _spans(np.random.default_rng(1))
    outs = [np.empty((b - a, *info.row_shape), info.dtype) for a, b in spans]
    store.reader.read_spans_into("x", spans, outs)  # type: ignore[attr-defined]
    shards = -(-N // (ROWS * PER_SHARD))
    assert len(opens) == shards and set(opens.values()) == {1}, opens


def test_default_epoch_opens_each_shard_once_per_task(sharded, opens, monkeypatch):
    """Through the loader's gather reader (without the compiled kernel, which decodes into the
    batches: tests/test_decode_rows.py): the store's one shuffle group is one read task per
    array, so an epoch opens each shard file once per array (it opened it once per inner
    chunk)."""
    from shardload.formats.zarr import shard_rows

    monkeypatch.setattr(shard_rows, "KERNEL", None)
    store = shardload.open_store(sharded)
    batches = list(shardload.iter_batches(store, batch_size=16, seed=5))
    seen = dict(opens)
    assert sorted(np.concatenate([b["index"] for b in batches]).tolist()) == list(range(N))
    for b in batches:
        check_values(store, b)
    shards = -(-N // (ROWS * PER_SHARD))
    assert len(seen) == shards * len(store.arrays), seen
    assert set(seen.values()) == {1}, seen


def test_default_epoch_makes_no_segment_object_per_chunk(sharded, monkeypatch):
    """The gather reader hands a group's whole inner chunks to the reader as row ranges taken
    from the plan's arrays: no ``Segment`` object per chunk (a default group holds over a
    thousand; building them was most of the main thread's work). Batches are unchanged: the
    plan's rows, in its order, with the store's values."""
    from shardload.plan import spans as spans_mod
    from shardload.plan.groups import worker_rows

    made = Counter[str]()

    class Counted(spans_mod.Segment):
        def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
            made["segments"] += 1
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(spans_mod, "Segment", Counted)
    store = shardload.open_store(sharded)
    batches = list(shardload.iter_batches(store, batch_size=16, seed=5, epoch=2))
    assert made["segments"] == 0
    got = np.concatenate([b["index"] for b in batches])
    bounds = store.manifest.chunk_bounds
    assert len(bounds) - 1 == -(-N // ROWS)
    for b in batches:
        check_values(store, b)
    from shardload.load.spec import LoadSpec  # the rows, in the order of the loader's plan

    plan = LoadSpec.build(store, batch_size=16, seed=5).plan(world_size=1, num_workers=1, epoch=2)
    assert got.tolist() == worker_rows(plan, 0, 0).tolist()


@pytest.mark.parametrize("damage", ["header", "truncated", "deleted"])
def test_damage_is_named_by_a_spans_read(sharded, tmp_path, damage):
    """Errors are built only when a check fails, and name the inner chunk, shard and file as
    the one-span path does. ``truncated``: the shard shrinks after its index was read and
    kept; the file being another version, its index is read again and found short."""
    root = tmp_path / "store"
    shutil.copytree(sharded, root)
    store = shardload.open_store(root, verify="never")
    reader = store.reader
    info = store.manifest.arrays["x"]
    path = root / "x" / "c" / "1" / "0"  # rows 28..55: inner chunks 4..7
    raw = path.read_bytes()
    first = int(np.frombuffer(raw[-68:-4], "<u8")[0])  # inner chunk 0's offset
    spans = [(c * ROWS, (c + 1) * ROWS) for c in (9, 4, 0, 5, 6, 7)]
    outs = [np.empty((ROWS, *info.row_shape), info.dtype) for _ in spans]
    reader.read_into("x", 0, 1, outs[0][:1])  # shard 0's index read and kept
    reader.read_into("x", 28, 29, outs[0][:1])  # shard 1's too
    if damage == "header":
        with open(path, "r+b") as f:
            f.seek(first + 5)  # the Blosc header's decoded size
            byte = f.read(1)[0]
            f.seek(first + 5)
            f.write(bytes([byte ^ 0x10]))
        want = "inner chunk 0 of shard 1"
    elif damage == "truncated":
        path.write_bytes(raw[: first + 10])
        want = "shard 1"
    else:
        path.unlink()
        want = "shard 1"
    with pytest.raises(ChunkReadError) as err:
        reader.read_spans_into("x", spans, outs)  # type: ignore[attr-defined]
    msg = str(err.value)
    assert str(path) in msg and "'x'" in msg and want in msg, msg
    if damage == "truncated":
        assert "truncated" in msg
    if damage == "deleted":
        assert "missing" in msg


def test_an_unexpected_error_in_a_spans_read_names_the_chunks(sharded, monkeypatch):
    from shardload.formats.zarr import shard_rows
    from shardload.formats.zarr.read import ZarrReader

    monkeypatch.setattr(shard_rows, "KERNEL", None)  # the gather reader's spans reads

    def boom(self, name, spans, outs):  # type: ignore[no-untyped-def]
        raise RuntimeError("boom")

    monkeypatch.setattr(ZarrReader, "read_spans_into", boom)
    store = shardload.open_store(sharded)
    with pytest.raises(ChunkReadError) as err:
        list(shardload.iter_batches(store, batch_size=16, seed=5))
    msg = str(err.value)
    assert "boom" in msg and "one of chunks 0, 1, 2" in msg and "(29 chunks)" in msg, msg


@pytest.mark.parametrize("verify", ["never", None])
def test_by_url_a_call_reads_a_shards_chunks_with_few_requests(sharded, monkeypatch, verify):
    """By URL, a call's inner chunks of one shard are a few range requests (near ones
    coalesced), not one per inner chunk; with the default verify, the shard fetched whole for
    its checksum serves them (one request in all). Values as the local read's."""
    import shardload.move.remote as remote
    from shardload.move.serve import serving

    requests: list[tuple[str, int | None, int | None]] = []
    real = remote.RemoteFileSystem.cat_file  # every read by URL, as bytes or as a view

    def spy(fs, path, start=None, end=None, *args, **kw):  # type: ignore[no-untyped-def]
        requests.append((path, start, end))
        return real(fs, path, start, end, *args, **kw)

    monkeypatch.setattr(remote.RemoteFileSystem, "cat_file", spy)
    local = shardload.open_store(sharded)
    per_shard = ROWS * PER_SHARD
    # shard 1's inner chunks shuffled, and pieces inside and across them
    spans = [(per_shard + c * ROWS, per_shard + (c + 1) * ROWS) for c in (2, 0, 3, 1)]
    spans += [(per_shard + 3, per_shard + 5), (per_shard + 6, per_shard + 17)]
    with serving(sharded.parent) as url:
        store = shardload.open_store(f"{url}/{sharded.name}", verify=verify)
        for name in store.arrays:
            info = store.manifest.arrays[name]
            outs = [np.full((b - a, *info.row_shape), 7, info.dtype) for a, b in spans]
            requests.clear()
            store.reader.read_spans_into(name, spans, outs)  # type: ignore[attr-defined]
            shard_requests = [r for r in requests if "/c/" in r[0]]
            assert len(shard_requests) <= 2, shard_requests  # the index and one range
            if verify is None:
                assert len(shard_requests) == 1, shard_requests  # the whole shard, checked
            for (a, b), out in zip(spans, outs, strict=True):
                want = np.empty_like(out)
                local.reader.read_into(name, a, b, want)
                np.testing.assert_array_equal(out, want)
