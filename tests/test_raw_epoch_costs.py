"""What an epoch of a raw sharded store (the default layout of values lz4 cannot shrink) costs
beyond its reads, counted: Python and C calls that grow with the number of inner chunks, and
sorts in the epoch's plan (issue 25, "speed that follows the hardware")."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.load import files
from shardload.load.kinds import read_kind
from shardload.plan import shuffles

pytestmark = pytest.mark.timeout(300)

N, ROWS, PER_SHARD, FEATURES = 4096, 8, 128, 4  # 512 inner chunks in 4 shards


@pytest.fixture(scope="module")
def raw_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("rawcost")
    src = root / "src.nc"
    x = np.random.default_rng(0).normal(size=(N, FEATURES)).astype("f4")
    xr.Dataset({"a": (("time", "f"), x)}).to_netcdf(src)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "arrays": {"x": ["a"]},
            "chunk_rows": ROWS,
            "shard_chunks": PER_SHARD,
            "compression": "none",
            "out": str(root / "store"),
        }
    )
    return root / "store"


def _rounds_order(ids: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``shuffle_order`` as it was written first (rounds of one entry per chunk, by sorting)."""
    n = len(ids)
    pick, place = rng.random(n), rng.random(n)
    by_chunk = np.lexsort((pick, ids))
    sorted_ids = ids[by_chunk]
    first = np.flatnonzero(np.concatenate(([True], sorted_ids[1:] != sorted_ids[:-1])))
    round_ = np.empty(n, np.int64)
    round_[by_chunk] = np.arange(n) - np.repeat(first, np.diff(np.append(first, n)))
    return np.lexsort((place, round_))


def test_closing_the_open_shards_costs_calls_per_shard_not_per_inner_chunk(
    raw_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At an epoch's end the reader closes the shard files it kept open: Python lines run a
    few per file, where a loop over its table (an entry per inner chunk) ran one or more per
    inner chunk, 512 here (the default store: 8,192 an epoch, 1.3 ms)."""
    import os

    with shardload.open_store(raw_shards) as store:
        assert read_kind(store, ["x"]) == "scatter"
    counts: list[int] = []
    real = files.OpenChunks.close

    def counted(self: Any) -> None:
        n = [0]

        def trace(frame: Any, event: str, arg: Any) -> Any:
            n[0] += event == "line"
            return trace

        sys.settrace(trace)
        try:
            real(self)
        finally:
            sys.settrace(None)
        counts.append(n[0])

    monkeypatch.setattr(files.OpenChunks, "close", counted)
    fds = len(os.listdir("/proc/self/fd"))
    got = list(shardload.iter_batches(raw_shards, batch_size=64, epoch=1, threads=2))
    assert sorted(np.concatenate([b["index"] for b in got]).tolist()) == list(range(N))
    assert len(os.listdir("/proc/self/fd")) == fds  # every shard file closed
    assert counts and max(counts) < N // ROWS // 2, counts


def test_one_entry_per_chunk_is_ordered_with_one_sort(monkeypatch: pytest.MonkeyPatch) -> None:
    """A store of small chunks read whole has one chunk-table entry per chunk, in chunk order:
    its order is one round, ``place`` sorted once, with no ``lexsort`` of the entries (two,
    before: 1.6 of 3.1 ms an epoch of the default store's 8,192 chunks). The order is the one
    rounds give, for those tables and for tables with several entries per chunk."""
    g = np.random.default_rng(0)
    for t in range(200):
        n = int(g.integers(1, 2000))
        if t % 2:  # one entry per chunk, in chunk order (gaps: a split's chunks)
            ids = np.sort(g.choice(10 * n, n, replace=False))
        else:  # pieces: several entries per chunk
            ids = np.sort(g.integers(0, n // 3 + 1, n))
        got = shuffles.shuffle_order(ids, np.random.default_rng(t))
        np.testing.assert_array_equal(got, _rounds_order(ids, np.random.default_rng(t)))
    sorts: list[int] = []
    real = np.lexsort
    monkeypatch.setattr(np, "lexsort", lambda keys, *a, **k: (sorts.append(1), real(keys))[1])
    shuffles.shuffle_order(np.arange(8192), np.random.default_rng(1))
    assert sorts == []
    shuffles.shuffle_order(np.repeat(np.arange(100), 3), np.random.default_rng(1))
    assert len(sorts) == 2  # several entries per chunk: sorted into rounds as before


def test_the_chunk_bounds_become_an_array_once_per_store(
    raw_shards: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The load's numpy steps share one read-only array of the store's chunk bounds: an epoch
    of an open store converts its ``chunk_bounds`` (a tuple of thousands of ints) none more
    times (before, each step made its own: eight an epoch of the default store, 0.15 ms each).
    The array is not pickled with the manifest (a DataLoader worker's copy makes its own)."""
    import pickle

    store = shardload.open_store(raw_shards)
    bounds = store.manifest.chunk_bounds
    made: list[int] = []
    for fn in ("asarray", "array"):
        real = getattr(np, fn)

        def counted(a: Any, *args: Any, _real: Any = real, **kw: Any) -> Any:
            if a is bounds:
                made.append(1)
            return _real(a, *args, **kw)

        monkeypatch.setattr(np, fn, counted)
    for e in (1, 2):
        got = list(shardload.iter_batches(store, batch_size=64, epoch=e, threads=2))
        assert sorted(np.concatenate([b["index"] for b in got]).tolist()) == list(range(N))
    monkeypatch.undo()
    assert made == []
    m = store.manifest
    assert not m.bounds.flags.writeable
    np.testing.assert_array_equal(m.bounds, np.array(bounds))
    again = pickle.loads(pickle.dumps(m))
    assert "bounds" not in again.__dict__ and again == m
    assert len(pickle.dumps(m)) == len(pickle.dumps(again))
    store.close()
