"""Whole inner chunks of a local sharded array read many at once
(formats/zarr/shard_local.py): the values of chunk-by-chunk reads, and a small, fixed Python
cost per chunk (the default load reads about 1,400 per shuffle group)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.formats.zarr.shard_local import read_whole_chunks

pytest.importorskip("zarr")

ROWS, PER_SHARD, N = 2, 256, 2048  # 1,024 inner chunks in 4 shards


@pytest.fixture(scope="module")
def many(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("local")
    make_store(tmp, fmt="zarr", compression="zstd", n=N, chunk_rows=ROWS, shard_chunks=PER_SHARD)
    return tmp / "store"


def _whole(chunks: np.ndarray) -> list[tuple[int, int]]:
    return [(int(c) * ROWS, int(c) * ROWS + ROWS) for c in chunks]


@pytest.mark.parametrize("run_bytes", [1, 1 << 20])
def test_whole_chunks_equal_chunk_by_chunk_reads(many, run_bytes):
    """Shuffled whole chunks, neighbours among them (runs read with one ``preadv``, cut at
    ``run_bytes``), every array: the values of one-span reads."""
    store = shardload.open_store(many)
    reader = store.reader
    rng = np.random.default_rng(3)
    chunks = np.concatenate([rng.permutation(300), 600 + rng.permutation(50)])
    for name in store.arrays:
        info = store.manifest.arrays[name]
        spans = _whole(chunks)
        outs = [np.full((ROWS, *info.row_shape), 7, info.dtype) for _ in spans]
        layout = reader.layout(name)  # type: ignore[attr-defined]
        assert read_whole_chunks(layout, name, spans, outs, None, None, run_bytes)
        for (a, b), out in zip(spans, outs, strict=True):
            want = np.empty_like(out)
            reader.read_into(name, a, b, want)
            np.testing.assert_array_equal(out, want)


def test_not_whole_chunks_are_left_to_the_general_path(many):
    store = shardload.open_store(many)
    layout = store.reader.layout("x")  # type: ignore[attr-defined]
    info = store.manifest.arrays["x"]
    out = np.empty((ROWS, *info.row_shape), info.dtype)
    for spans, outs in [
        ([(1, 3)], [out]),  # not at a chunk's start
        ([(0, 1)], [out[:1]]),  # part of a chunk
        ([(0, 2)], [np.empty((4, *info.row_shape), info.dtype)]),  # more than its bytes
        ([(0, 2)], [np.empty((2, 2, *info.row_shape), info.dtype)[:, 0]]),  # not contiguous
    ]:
        assert not read_whole_chunks(layout, "x", spans, outs, None, None, 1 << 20)


def _shardload_events(fn) -> int:  # type: ignore[no-untyped-def]
    """Python calls made by shardload's own code while ``fn`` runs (function calls into it and
    the C functions it calls), not those inside numpy or numcodecs."""
    src = str(Path(shardload.__file__).parent)
    seen = [0]

    def prof(frame, event, arg):  # type: ignore[no-untyped-def]
        if event in ("call", "c_call") and frame.f_code.co_filename.startswith(src):
            seen[0] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen[0]


def test_a_whole_chunk_costs_few_python_calls(many):
    """A group's scattered whole inner chunks: per chunk, shardload makes at most 6 Python
    calls (its ``preadv``, header check and ``decompress``; the rest per shard, in numpy). The
    piece-by-piece path made 18.6 here (a generator step, memoryviews, a tuple, a dict look-up),
    about 0.05-0.1 CPU s an epoch of the default store (docs/benchmarks.md)."""
    store = shardload.open_store(many)
    reader = store.reader
    info = store.manifest.arrays["x"]
    chunks = np.random.default_rng(4).choice(N // ROWS, 400, replace=False)
    spans = _whole(chunks)
    outs = [np.empty((ROWS, *info.row_shape), info.dtype) for _ in spans]
    reader.read_spans_into("x", spans, outs)  # type: ignore[attr-defined]  # indexes kept
    calls = _shardload_events(lambda: reader.read_spans_into("x", spans, outs))  # type: ignore[attr-defined]
    assert calls / len(spans) <= 6, calls / len(spans)


def test_unwritten_chunks_and_missing_shards_are_the_fill_value(many, tmp_path):
    """Outside shardload's strict stores (plain Zarr): an inner chunk the shard's index marks
    empty, and every chunk of a missing shard, read as the fill value; the others as stored."""
    import dataclasses
    import shutil

    import google_crc32c

    root = tmp_path / "store"
    shutil.copytree(many, root)
    store = shardload.open_store(root, verify="never")
    reader = store.reader
    layout = dataclasses.replace(reader.layout("x"), strict=False, fill_value=-3.0)  # type: ignore[attr-defined]
    assert layout.shard is not None and layout.shard.index_at_end and layout.shard.index_crc
    info = store.manifest.arrays["x"]
    spans = _whole(np.array([5, 300, 2 * PER_SHARD + 1, 7]))  # shard 0, 1, 2, 0
    want = [np.empty((ROWS, *info.row_shape), info.dtype) for _ in spans]
    for (a, b), w in zip(spans, want, strict=True):
        reader.read_into("x", a, b, w)
    shard0 = Path(layout.chunk_path(0))  # inner chunk 5 marked never written
    raw = bytearray(shard0.read_bytes())
    n = layout.shard.index_nbytes
    index = np.frombuffer(raw[-n:-4], "<u8").copy().reshape(-1, 2)
    index[5] = 2**64 - 1
    raw[-n:-4] = index.tobytes()
    raw[-4:] = int(google_crc32c.value(bytes(raw[-n:-4]))).to_bytes(4, "little")
    shard0.write_bytes(bytes(raw))
    Path(layout.chunk_path(2)).unlink()
    outs = [np.full((ROWS, *info.row_shape), 7, info.dtype) for _ in spans]
    assert read_whole_chunks(layout, "x", spans, outs, None, None, 1 << 20)
    assert (outs[0] == -3).all() and (outs[2] == -3).all()
    np.testing.assert_array_equal(outs[1], want[1])
    np.testing.assert_array_equal(outs[3], want[3])


def test_whole_chunks_decode_without_numcodecs_wrapping(many, monkeypatch):
    """Each whole chunk is decoded by c-blosc directly (``shard_local.DECOMPRESS_CTX``), not
    through ``numcodecs.blosc.decompress``, whose checks and buffer wrapping in Python cost
    about a quarter of an 8-row chunk's decode; the values are the one-span reads'."""
    from numcodecs import blosc

    store = shardload.open_store(many)
    reader = store.reader
    info = store.manifest.arrays["x"]
    spans = _whole(np.random.default_rng(5).choice(N // ROWS, 200, replace=False))
    want = [np.empty((ROWS, *info.row_shape), info.dtype) for _ in spans]
    for (a, b), w in zip(spans, want, strict=True):
        reader.read_into("x", a, b, w)
    wrapped = [0]
    decompress = blosc.decompress

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        wrapped[0] += 1
        return decompress(*args, **kwargs)

    monkeypatch.setattr(blosc, "decompress", counted)
    outs = [np.full((ROWS, *info.row_shape), 7, info.dtype) for _ in spans]
    layout = reader.layout("x")  # type: ignore[attr-defined]
    assert read_whole_chunks(layout, "x", spans, outs, None, None, 1 << 20)
    assert wrapped[0] == 0
    for out, w in zip(outs, want, strict=True):
        np.testing.assert_array_equal(out, w)
