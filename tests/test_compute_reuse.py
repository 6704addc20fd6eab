"""Each source chunk decoded once: the reuse plan, the bounded cache of decoded chunks, and the
engine reading through them (issue 25 item 8)."""

from __future__ import annotations

import threading
import tracemalloc
from collections import Counter
from collections.abc import Sequence
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.blockwise.cache import ChunkCache, read_box
from shardload.blockwise.plan import BASE_BYTES, block_grid, normalize_chunks, plan_axis
from shardload.blockwise.reuse import ReusePlan, plan_reuse
from shardload.blockwise.source import SourceArray

zarr = pytest.importorskip("zarr")

BOUNDS = ["reflect", "periodic", "nearest", "none", 0.5]


def _edges(sizes: Sequence[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(sizes)])


def _brute_chunks(src, blocks, depths, bounds, block):  # type: ignore[no-untyped-def]
    """The chunks a block's window reads, element by element."""
    per_axis = []
    for k, (s, b) in enumerate(zip(src, blocks, strict=True)):
        e, be = _edges(s), _edges(b)
        idx = {
            i
            for d, bd in zip(depths, bounds, strict=True)
            for i in plan_axis(
                int(be[block[k]]), int(be[block[k] + 1]), int(sum(s)), d[k], bd[k]
            ).index
            if i >= 0
        }
        per_axis.append(sorted({int(np.searchsorted(e, i, side="right")) - 1 for i in idx}))
    return {tuple(c) for c in product(*per_axis)}


@pytest.mark.parametrize("seed", range(12))
def test_plan_matches_a_brute_force_count(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 4))
    shape = [int(rng.integers(4, 20)) for _ in range(ndim)]
    src = normalize_chunks({k: int(rng.integers(1, n + 1)) for k, n in enumerate(shape)}, shape)
    blocks = normalize_chunks({k: int(rng.integers(2, n + 1)) for k, n in enumerate(shape)}, shape)
    nattr = int(rng.integers(1, 3))
    depths = [[int(rng.integers(0, 3)) for _ in range(ndim)] for _ in range(nattr)]
    bounds = [[BOUNDS[int(rng.integers(len(BOUNDS)))] for _ in range(ndim)] for _ in range(nattr)]
    plan = plan_reuse(src, blocks, depths, bounds)
    uses: Counter[tuple[int, ...]] = Counter()
    for block in product(*[range(len(b)) for b in blocks]):
        want = _brute_chunks(src, blocks, depths, bounds, block)
        assert set(plan.block_chunks(block[0], block[1:])) == want
        uses.update(want)
    for chunk, n in uses.items():
        assert plan.uses(chunk) == n

    def reused_bytes(slabs: Any) -> int:
        return sum(
            int(np.prod([b - a for a, b in plan.chunk_box(c)]))
            for c, n in uses.items()
            if n > 1 and any(s in plan.readers[0][c[0]] for s in slabs)
        )

    per_slab = sorted(reused_bytes([s]) for s in range(len(blocks[0])))
    for tasks in (1, 2, 3):  # any `tasks` slabs in flight: the largest, at most all chunks
        want = min(sum(per_slab[-tasks:]), reused_bytes(range(len(blocks[0]))))
        assert plan.cache_bytes(itemsize=1, tasks=tasks) == want


def _run_blocks(plan: ReusePlan, cache: ChunkCache, data: np.ndarray, slabs: Sequence[int]) -> None:
    """What a task does with the cache: read every block's window (no halo here: the block's
    chunks' bounding box), check the values, release the block, finish the slab."""
    e0 = _edges(plan.blocks[0])
    for slab in slabs:
        for pos in product(*[range(len(b)) for b in plan.blocks[1:]]):
            chunks = plan.block_chunks(slab, pos)
            boxes = [plan.chunk_box(c) for c in chunks]
            box = [(min(b[k][0] for b in boxes), max(b[k][1] for b in boxes)) for k in range(2)]
            box[0] = (max(box[0][0], int(e0[slab]) - 1), box[0][1])
            got = read_box(cache, box, data.dtype, lambda b: data[tuple(slice(*x) for x in b)])
            np.testing.assert_array_equal(got, data[tuple(slice(*x) for x in box)])
            cache.release(chunks)
        cache.finish_slab(slab)


def test_cache_holds_when_one_slab_lags_far_behind() -> None:
    """Slab 1 stalls after its first block while slabs 2..7 run one after the other (two in
    flight, not neighbours after slab 2): still one decode per chunk within the capacity."""
    data = np.arange(32 * 24, dtype=np.float32).reshape(32, 24)
    plan = plan_reuse(((8,) * 4, (8,) * 3), ((4,) * 8, (4,) * 6), [(2, 2)], [("reflect",) * 2])
    capacity = plan.cache_bytes(itemsize=4, tasks=2)
    cache = ChunkCache(plan, capacity, _decoder(data, []))
    positions = list(product(range(6)))
    first, rest = positions[:1], positions[1:]

    def run(slab: int, todo: list[tuple[int, ...]], finish: bool) -> None:
        for pos in todo:
            chunks = plan.block_chunks(slab, pos)
            for c in chunks:
                box = plan.chunk_box(c)
                got = read_box(cache, box, data.dtype, lambda b: data[tuple(slice(*x) for x in b)])
                np.testing.assert_array_equal(got, data[tuple(slice(*x) for x in box)])
            cache.release(chunks)
        if finish:
            cache.finish_slab(slab)

    run(0, positions, True)
    run(1, first, False)
    for slab in range(2, 8):
        run(slab, positions, True)
    run(1, rest, True)
    assert cache.max_bytes_held <= capacity
    assert max(cache.decodes.values()) == 1 and len(cache.decodes) == 12
    assert cache.bytes_held == 0


def _decoder(data: np.ndarray, log: list[Any]) -> Any:
    def decode(box: Sequence[tuple[int, int]]) -> np.ndarray:
        log.append(tuple(box))
        return data[tuple(slice(a, b) for a, b in box)].copy()

    return decode


@pytest.mark.parametrize("tasks", [1, 2])
def test_cache_decodes_each_chunk_once_within_its_capacity(tasks: int) -> None:
    """Blocks 4 x 4 over chunks 8 x 8 and depth 2: every chunk is read by many blocks; with the
    planned capacity each is decoded once, held bytes never exceed it, and nothing is left.
    With two threads one may run slabs ahead of the other: the capacity does not assume the
    slabs in flight are neighbours."""
    data = np.arange(32 * 24, dtype=np.float32).reshape(32, 24)
    plan = plan_reuse(((8,) * 4, (8,) * 3), ((4,) * 8, (4,) * 6), [(2, 2)], [("reflect",) * 2])
    capacity = plan.cache_bytes(itemsize=4, tasks=tasks)
    assert capacity == 2 * tasks * 8 * 24 * 4  # two chunk rows per slab in flight
    log: list[Any] = []
    cache = ChunkCache(plan, capacity, _decoder(data, log))
    slabs = list(range(8))
    if tasks == 1:
        _run_blocks(plan, cache, data, slabs)
    else:  # two threads, slabs handed out in order as a thread pool of 2 does
        lock = threading.Lock()

        def worker() -> None:
            while True:
                with lock:
                    if not slabs:
                        return
                    slab = slabs.pop(0)
                _run_blocks(plan, cache, data, [slab])

        threads = [threading.Thread(target=worker) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert cache.max_bytes_held <= capacity
    assert max(cache.decodes.values()) == 1 and len(cache.decodes) == 12
    assert cache.bytes_held == 0  # every chunk dropped after its last block


def test_a_small_cache_stays_within_its_capacity_and_values_stay_right() -> None:
    """Half the planned capacity: chunks are decoded again (farthest next use evicted first),
    never more bytes held than the capacity, values unchanged."""
    data = np.arange(32 * 24, dtype=np.float32).reshape(32, 24)
    plan = plan_reuse(((8,) * 4, (8,) * 3), ((4,) * 8, (4,) * 6), [(2, 2)], [("periodic",) * 2])
    capacity = 8 * 8 * 4 * 2  # two chunks of 8 x 8
    cache = ChunkCache(plan, capacity, _decoder(data, []))
    _run_blocks(plan, cache, data, range(8))
    assert cache.max_bytes_held <= capacity
    assert sum(cache.decodes.values()) > 12


def _seismic_like(tmp_path: Path) -> Path:
    """A (64, 32, 32) float32 cube in chunks of 32 whole inlines, zstd (as `sample seismic`)."""
    from shardload.samples.seismic import write_seismic_sample

    return write_seismic_sample(tmp_path / "cube.zarr", (64, 32, 32), chunk_inlines=32)


def _config(src: Path, out: Path, **execution: Any) -> dict[str, Any]:
    return {
        "source": {"paths": [str(src)], "variable": "amp"},
        "attributes": {
            "b": {"function": "compute_funcs:box", "depth": 2, "boundary": "reflect"},
        },
        "chunks": {0: 8, 1: 8, 2: 8},
        "out": str(out),
        "execution": {"scheduler": "threads", "num_workers": 2, **execution},
    }


def test_engine_decodes_each_source_chunk_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Blocks 8^3 of a cube stored in chunks of 32 inlines: 16 blocks per slab read the same
    chunk; each chunk is read from the source once, and the values equal dask's."""
    import dask.array as da

    from compute_funcs import box

    src = _seismic_like(tmp_path)
    reads: Counter[tuple[int, ...]] = Counter()
    real = SourceArray.read
    lock = threading.Lock()

    def counting(self: SourceArray, b: Sequence[tuple[int, int]]) -> np.ndarray:
        with lock:
            for c in range(b[0][0] // 32, (b[0][1] - 1) // 32 + 1):
                reads[(c,)] += 1
        return real(self, b)

    monkeypatch.setattr(SourceArray, "read", counting)
    shardload.compute(_config(src, tmp_path / "attrs"))
    assert reads == {(0,): 1, (1,): 1}
    x = da.from_zarr(str(src), component="amp").rechunk((8, 8, 8))
    ref = da.map_overlap(box, x, depth=2, boundary="reflect", trim=True, dtype=x.dtype)
    got = shardload.open_store(str(tmp_path / "attrs")).read("b", 0, 64)
    assert got.tobytes() == ref.compute(scheduler="sync").tobytes()


def test_engine_memory_within_its_stated_bound(tmp_path: Path) -> None:
    """Allocations made during the run (numpy, codecs: tracemalloc) stay within the logged
    bound less its allowance for the interpreter and libraries, decoding included."""
    from shardload.blockwise.config import load_compute_config
    from shardload.blockwise.job import estimate_memory, plan_job

    src = _seismic_like(tmp_path)
    cfg = _config(src, tmp_path / "attrs")
    job = plan_job(
        load_compute_config(cfg), SourceArray(load_compute_config(cfg).source, "amp").info, "x"
    )
    bound = estimate_memory(job, 2).total_bytes - BASE_BYTES
    shardload.compute(_config(src, tmp_path / "warm"))  # imports and codec set-up, not measured
    tracemalloc.start()
    try:
        shardload.compute(cfg)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak <= bound, (peak / 2**20, bound / 2**20)


def test_resume_with_the_cache_gives_the_same_store(tmp_path: Path) -> None:
    """A run failing mid-way, re-run: only the slabs not recorded are computed (through a cache
    planned for them alone) and the store equals an uninterrupted run's."""
    import compute_funcs

    src = _seismic_like(tmp_path)
    cfg = _config(src, tmp_path / "attrs")
    cfg["attributes"]["b"]["function"] = "compute_funcs:flaky"
    compute_funcs.CALLS.update(n=0, fail_at=70)  # a block of slab 4 or so (16 blocks a slab)
    with pytest.raises(RuntimeError):
        shardload.compute(cfg, progress=False)
    compute_funcs.CALLS.update(n=0, fail_at=-1)
    shardload.compute(cfg, progress=False)
    assert 0 < compute_funcs.CALLS["n"] < 128  # only the slabs not recorded (128 blocks in all)
    whole = _config(src, tmp_path / "whole")
    whole["attributes"]["b"]["function"] = "compute_funcs:flaky"
    compute_funcs.CALLS.update(n=0, fail_at=-1)
    shardload.compute(whole, progress=False)
    a = shardload.open_store(str(tmp_path / "attrs")).read("b", 0, 64)
    b = shardload.open_store(str(tmp_path / "whole")).read("b", 0, 64)
    assert a.tobytes() == b.tobytes()


def test_block_grid_order_is_the_plans_inner_order() -> None:
    """run_slab pairs block_grid's boxes with the plan's inner positions in C order."""
    chunks = ((4, 4), (3, 3, 2), (5, 4))
    boxes = block_grid([(4,), *chunks[1:]])
    e = [_edges(c) for c in chunks[1:]]
    for bx, pos in zip(boxes, product(range(3), range(2)), strict=True):
        assert bx[1:] == tuple((int(e[k][p]), int(e[k][p + 1])) for k, p in enumerate(pos))


def test_memory_limit_below_the_planned_cache_shrinks_it(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A memory_limit the run fits only with a smaller cache: the cache is cut to fit (logged),
    the bound logged is within the limit, and the values equal an unlimited run's."""
    import logging

    from shardload.blockwise.config import load_compute_config
    from shardload.blockwise.job import estimate_memory, plan_job

    src = _seismic_like(tmp_path)
    cfg = _config(src, tmp_path / "limited")
    info = SourceArray(load_compute_config(cfg).source, "amp").info
    est = estimate_memory(plan_job(load_compute_config(cfg), info, "x"), 2)
    assert est.cache_bytes > 0
    cfg["memory_limit"] = est.total_bytes - est.cache_bytes // 2
    with caplog.at_level(logging.INFO, logger="shardload.blockwise.engine"):
        shardload.compute(cfg, progress=False)
    lines = [r.getMessage() for r in caplog.records]
    assert any("decoded-chunk cache cut from" in m for m in lines), lines
    bound = next(m for m in lines if "memory bound" in m)
    assert float(bound.rsplit("= ", 1)[1].split()[0]) * 2**20 <= cfg["memory_limit"] + 2**20
    shardload.compute(_config(src, tmp_path / "free"), progress=False)
    a = shardload.open_store(str(tmp_path / "limited")).read("b", 0, 64)
    b = shardload.open_store(str(tmp_path / "free")).read("b", 0, 64)
    assert a.tobytes() == b.tobytes()
