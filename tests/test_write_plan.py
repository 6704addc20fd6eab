"""Driver work per block is O(1): block spans, task size and bookkeeping do not grow with the
number of chunks (it was quadratic: ``tuple.index`` per block, every boundary shipped per task)."""

from __future__ import annotations

import itertools
import pickle
import time

import numpy as np
import pytest

from shardload.manifest.core import ArraySpec
from shardload.plan import chunks as chunks_mod
from shardload.plan.chunks import RegularBounds, block_span, plan_blocks, plan_chunk_bounds
from shardload.prep.config import PrepareConfig, SourceConfig
from shardload.prep.tasks import PrepareJob


def job(num_chunks: int, chunk_rows: int = 3, per_block: int = 1) -> PrepareJob:
    length = num_chunks * chunk_rows - 1  # last chunk short
    spec = ArraySpec("x", (length, 4), np.dtype("float32"), None, {})
    cfg = PrepareConfig(source=SourceConfig(paths=("src.nc",)), out="store")
    return PrepareJob(cfg, "store.partial", length, chunk_rows, per_block, {"x": spec}, "fp")


def driver_pass(j: PrepareJob) -> int:
    """What the driver does per block: span, task payload, progress-record bookkeeping."""
    done = frozenset(range(0, j.num_blocks, 2))
    todo = [i for i in range(j.num_blocks) if i not in done]
    rows = 0
    for i in todo:
        _, a, b = j.block(i)
        rows += b - a
    pickle.dumps((j, todo[-1]))
    return rows


@pytest.mark.parametrize("per_block", [1, 4])
def test_regular_bounds_equal_the_planned_tuple(per_block):
    for length, rows in [(1, 1), (10, 4), (12, 4), (1000, 7)]:
        b = RegularBounds(length, rows)
        want = plan_chunk_bounds(length, rows)
        assert tuple(b) == want and len(b) == len(want) and b == want
        assert [b.index(x) for x in want] == list(range(len(want)))
        blocks = plan_blocks(want, per_block)
        spans = [block_span(b, per_block, i) for i in range(len(blocks) - 1)]
        assert [(a, c) for _, a, c in spans] == list(itertools.pairwise(blocks))
        assert [k for k, _, _ in spans] == [want.index(a) for _, a, _ in spans]
        assert pickle.loads(pickle.dumps(b)) == b
    with pytest.raises(ValueError):
        RegularBounds(10, 4).index(5)


def test_task_size_does_not_grow_with_chunks():
    small, big = job(8192), job(65536)
    # equal up to the width of a few integers (it was 4+ bytes per chunk boundary)
    assert abs(len(pickle.dumps((big, 65535))) - len(pickle.dumps((small, 8191)))) < 16


@pytest.mark.parametrize("per_block", [1, 4])
def test_job_blocks_equal_the_planned_blocks(per_block):
    j = job(1000, chunk_rows=7, per_block=per_block)
    bounds = plan_chunk_bounds(j.length, 7)
    blocks = plan_blocks(bounds, per_block)
    assert j.num_blocks == len(blocks) - 1
    spans = [j.block(i) for i in range(j.num_blocks)]
    assert spans == [block_span(bounds, per_block, i) for i in range(j.num_blocks)]
    with pytest.raises(IndexError):
        j.block(j.num_blocks)


def test_driver_work_is_linear_in_blocks(monkeypatch):
    """No boundary is listed or searched per block (a block's span is arithmetic: 0 lookups),
    plus a coarse timing ratio: 8x the chunks costs ~8x, not ~64x (quadratic)."""
    calls = {"n": 0}
    real = RegularBounds.__getitem__

    def counting(self, i):
        calls["n"] += 1
        return real(self, i)

    monkeypatch.setattr(chunks_mod.RegularBounds, "__getitem__", counting)
    j = job(65536)
    assert driver_pass(j) == sum(min(3 * (i + 1), j.length) - 3 * i for i in range(1, 65536, 2))
    assert calls["n"] == 0
    monkeypatch.setattr(chunks_mod.RegularBounds, "__getitem__", real)

    def best(n: int) -> float:
        j = job(n)
        t = []
        for _ in range(5):  # this thread's CPU time: other processes' load does not count
            t0 = time.thread_time()
            driver_pass(j)
            t.append(time.thread_time() - t0)
        return min(t)

    t8, t64 = best(8192), best(65536)
    assert t64 / t8 < 24, (t8, t64)  # linear: ~8; quadratic: ~64


def test_tasks_do_not_carry_feature_names(tmp_path, monkeypatch):
    """Wide arrays have millions of feature names: they stay in the driver's manifest, not in
    every task shipped to a worker."""
    import xarray as xr

    import shardload
    from shardload.prep import tasks as pipeline

    xr.Dataset({"v": (("sample", "f"), np.zeros((20, 3000), "f4"))}).to_netcdf(tmp_path / "w.nc")
    sizes = []
    real = pipeline.run_block

    def spy(job, block):
        sizes.append(len(pickle.dumps(job)))
        assert all(s.features is None for s in job.specs.values())
        return real(job, block)

    monkeypatch.setattr(pipeline, "run_block", spy)
    s = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "w.nc")]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["v"]},
            "chunk_rows": 10,
            "out": str(tmp_path / "s"),
            "splits": {},
        }
    )
    assert len(s.manifest.arrays["x"].features) == 3000
    assert sizes and max(sizes) < 4000  # 3,000 names would be ~20 kB
