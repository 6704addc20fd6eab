"""The compute engine: bit-identical to dask's map_overlap / map_blocks, resumable, refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.blockwise.plan import (
    ensure_minimum_chunksize,
    normalize_chunks,
    plan_axis,
    plan_memory,
    runs,
)
from shardload.errors import ConfigError, NaNError, StoreExistsError

da = pytest.importorskip("dask.array")
zarr = pytest.importorskip("zarr")

SHAPE = (13, 11, 9)
BOUNDARIES: dict[str, Any] = {
    "reflect": "reflect",
    "periodic": "periodic",
    "nearest": "nearest",
    "none": "none",
    "const": 0.5,
    "mixed": {0: "periodic", 1: "nearest", 2: -1.5},  # one mode per axis
}
#: blocks that do not divide the shape (13, 11, 9); blocks smaller than the depth along axes
#: 1 and 2 (merged as dask merges them); the whole array as one block
CHUNKINGS = [
    {0: 5, 1: 4, 2: -1},
    {0: 7, 1: 8, 2: 5},
    {0: 5, 1: 3, 2: 2},
    pytest.param({0: -1}, marks=pytest.mark.slow),
]
CHUNKING_IDS = ["c5x4", "c7x8x5", "c5x3x2", "whole"]
DEPTHS = [{0: 2, 1: 1, 2: 3}, {0: 0, 1: 0, 2: 0}, {0: 3, 1: 3, 2: 0}]


def write_source(path: Path, data: np.ndarray, chunks: tuple[int, ...]) -> Path:
    g = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    arr = g.create_array("amp", shape=data.shape, chunks=chunks, dtype=data.dtype)
    arr[...] = data
    return path


@pytest.fixture(scope="module")
def cube() -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.standard_normal(SHAPE).astype(np.float32)


def dask_reference(
    x: np.ndarray, chunks: Any, func: Any, depth: dict[int, int], boundary: Any
) -> np.ndarray:
    d = da.from_array(x, chunks=normalize_chunks(chunks, x.shape))
    if not any(depth.values()):
        return d.map_blocks(func, dtype=x.dtype).compute(scheduler="sync")
    return da.map_overlap(
        func, d, depth=depth, boundary=boundary, trim=True, dtype=x.dtype
    ).compute(scheduler="sync")


@pytest.mark.parametrize("chunks", CHUNKINGS, ids=CHUNKING_IDS)
@pytest.mark.parametrize("depth", DEPTHS, ids=["d213", "d0", "d330"])
def test_bit_identical_to_dask(
    tmp_path: Path, cube: np.ndarray, chunks: dict[int, int], depth: dict[int, int]
) -> None:
    """Every boundary mode (one attribute each) on chunkings that do not divide the shape (the
    correctness matrix of docs/compute.md)."""
    src = write_source(tmp_path / "cube.zarr", cube, (4, 4, 4))  # the source's own chunks differ
    attrs = {
        name: {"function": "compute_funcs:block_position", "depth": depth, "boundary": b}
        for name, b in BOUNDARIES.items()
    }
    m = shardload.compute(
        {
            "source": {"paths": [str(src)], "variable": "amp"},
            "attributes": attrs,
            "chunks": chunks,
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
    )
    assert m.chunk_bounds[1] == (SHAPE[0] if chunks[0] == -1 else chunks[0])
    store = shardload.open_store(str(tmp_path / "attrs"))
    from compute_funcs import block_position

    for name, b in BOUNDARIES.items():
        ref = dask_reference(cube, chunks, block_position, depth, b)
        got = store.read(name, 0, SHAPE[0])
        assert got.dtype == ref.dtype
        np.testing.assert_array_equal(got, ref, err_msg=f"boundary {name}")
        assert got.tobytes() == ref.tobytes()
        # rows a:b along axis 0 of the full array
        np.testing.assert_array_equal(store.read(name, 3, 9), ref[3:9])


def test_source_chunks_and_threads_and_processes(tmp_path: Path, cube: np.ndarray) -> None:
    """chunks: source (the default) takes the Zarr chunks; threads and processes agree with dask."""
    src = write_source(tmp_path / "cube.zarr", cube, (5, 4, 9))
    from compute_funcs import box

    ref = dask_reference(cube, {0: 5, 1: 4}, box, {0: 1, 1: 1, 2: 1}, "periodic")
    for sched in ("threads", "processes") if _SLOW else ("threads",):
        shardload.compute(
            {
                "source": {"paths": [str(src)], "variable": "amp"},
                "attributes": {
                    "b": {"function": "compute_funcs:box", "depth": 1, "boundary": "periodic"}
                },
                "out": str(tmp_path / sched),
                "execution": {"scheduler": sched, "num_workers": 2},
            }
        )
        got = shardload.open_store(str(tmp_path / sched)).read("b", 0, SHAPE[0])
        assert got.tobytes() == ref.tobytes(), sched


_SLOW = False


@pytest.mark.slow
def test_processes_scheduler(tmp_path: Path, cube: np.ndarray) -> None:
    global _SLOW
    _SLOW = True
    try:
        test_source_chunks_and_threads_and_processes(tmp_path, cube)
    finally:
        _SLOW = False


def test_resume_after_failure_gives_the_same_store(tmp_path: Path, cube: np.ndarray) -> None:
    """A run that dies mid-way leaves recorded slabs; the re-run computes only the others."""
    import compute_funcs

    src = write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    cfg = _cfg(tmp_path, src, function="compute_funcs:flaky", depth=1, boundary="periodic")
    compute_funcs.CALLS.update(n=0, fail_at=3)  # slabs 0 and 1 written, slab 2 fails
    with pytest.raises(RuntimeError, match="injected"):
        shardload.compute(cfg)
    assert not (tmp_path / "attrs").exists()
    assert len(list((tmp_path / "attrs.partial" / "_progress").glob("block-*.npz"))) == 2
    compute_funcs.CALLS.update(n=0, fail_at=-1)
    shardload.compute(cfg)
    assert compute_funcs.CALLS["n"] == 1  # only the last slab
    got = shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 13)
    ref = dask_reference(cube, {0: 5}, compute_funcs.box, {0: 1, 1: 1, 2: 1}, "periodic")
    assert got.tobytes() == ref.tobytes()


def test_netcdf_source_via_xarray(tmp_path: Path, cube: np.ndarray) -> None:
    xr = pytest.importorskip("xarray")
    path = tmp_path / "cube.nc"
    xr.Dataset({"amp": (("x", "y", "z"), cube)}).to_netcdf(path, engine="h5netcdf")
    from compute_funcs import box

    shardload.compute(
        {
            "source": {"paths": [str(path)], "variable": "amp"},
            "attributes": {
                "b": {"function": "compute_funcs:box", "depth": {0: 2}, "boundary": "nearest"}
            },
            "chunks": {0: 5},
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
    )
    ref = dask_reference(cube, {0: 5}, box, {0: 2, 1: 0, 2: 0}, "nearest")
    got = shardload.open_store(str(tmp_path / "attrs")).read("b", 0, SHAPE[0])
    assert got.tobytes() == ref.tobytes()


# -- the planner --------------------------------------------------------------------------------
@pytest.mark.parametrize("boundary", ["reflect", "periodic", "nearest"])
def test_plan_axis_matches_numpy_pad(boundary: str) -> None:
    mode = {"reflect": "symmetric", "periodic": "wrap", "nearest": "edge"}[boundary]
    n, depth = 10, 3
    padded = np.pad(np.arange(n), depth, mode=mode)
    for a, b in [(0, 4), (4, 8), (8, 10)]:
        w = plan_axis(a, b, n, depth, boundary)
        assert list(w.index) == list(padded[a : b + 2 * depth])
        assert w.trim_left == depth


def test_plan_axis_none_and_constant() -> None:
    w = plan_axis(8, 10, 10, 3, "none")
    assert w.index == (5, 6, 7, 8, 9) and w.trim_left == 3
    w = plan_axis(0, 2, 10, 2, 0.0)
    assert w.index == (-1, -1, 0, 1, 2, 3) and w.trim_left == 2
    assert runs([8, 9, 0, 1, 2]) == [(0, 3), (8, 10)]


def test_memory_estimate_formula() -> None:
    chunks = normalize_chunks({0: 10}, (100, 20, 30))
    est = plan_memory(
        chunks, [(2, 0, 0)], itemsize=4, out_itemsizes=[4], work_bytes_per_element=[8], tasks=3
    )
    window = 14 * 20 * 30 * 4
    assert est.window_bytes == window
    assert est.per_task_bytes == 2 * window + 14 * 20 * 30 * 12 + 10 * 20 * 30 * 4
    assert est.total_bytes > 4 * est.per_task_bytes


# -- refusals -----------------------------------------------------------------------------------
def _cfg(tmp_path: Path, src: Path, **attr: Any) -> dict[str, Any]:
    return {
        "source": {"paths": [str(src)], "variable": "amp"},
        "attributes": {"a": {"function": "compute_funcs:box", **attr}},
        "chunks": {0: 5},
        "out": str(tmp_path / "attrs"),
        "execution": {"scheduler": "sync"},
    }


def test_refusals_before_any_write(tmp_path: Path, cube: np.ndarray) -> None:
    src = write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    out = tmp_path / "attrs"
    cases = [
        ({"function": "no_such_module:f"}, r"attributes\.a\.function.*cannot import"),
        ({"function": "compute_funcs:nothing"}, r"attributes\.a\.function.*has no"),
        (
            {"depth": {0: 4}},
            r"attributes\.a\.depth.*larger than the smallest block.*axis 0.*'chunks'",
        ),
        ({"depth": {1: 12}}, r"attributes\.a\.depth.*larger than the axis"),
        ({"boundary": "mirror"}, r"attributes\.a\.boundary.*unknown boundary"),
        ({"depth": {5: 1}}, r"attributes\.a\.depth.*axis 5"),
        ({"factr": 2}, r"attributes\.a.*does not accept"),
    ]
    for attr, match in cases:
        with pytest.raises(ConfigError, match=match):
            shardload.compute(_cfg(tmp_path, src, **attr))
        assert not out.exists() and not (tmp_path / "attrs.partial").exists()
    cfg = _cfg(tmp_path, src, depth=1)
    cfg["memory_limit"] = "1MiB"
    with pytest.raises(ConfigError, match=r"memory_limit.*'chunks'"):
        shardload.compute(cfg)
    assert not (tmp_path / "attrs.partial").exists()


def test_function_changing_shape_or_dtype(tmp_path: Path, cube: np.ndarray) -> None:
    src = write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    with pytest.raises(ConfigError, match=r"attributes\.a.*shape"):
        shardload.compute(_cfg(tmp_path, src, function="compute_funcs:shrink"))
    with pytest.raises(ConfigError, match=r"attributes\.a.*float64.*dtype: float64"):
        shardload.compute(_cfg(tmp_path, src, function="compute_funcs:to_float64"))
    with pytest.raises(ConfigError, match=r"attributes\.a.*writes into its input"):
        shardload.compute(_cfg(tmp_path, src, function="compute_funcs:inplace"))
    # declared: fine
    cfg = _cfg(tmp_path, src, function="compute_funcs:to_float64", dtype="float64", depth=1)
    cfg["overwrite"] = True
    shardload.compute(cfg)
    got = shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 13)
    assert got.dtype == np.float64 and np.array_equal(got, cube.astype(np.float64))


def test_nan_refused_unless_allowed(tmp_path: Path, cube: np.ndarray) -> None:
    data = cube.copy()
    data[7, 2, 3] = np.nan
    src = write_source(tmp_path / "cube.zarr", data, (5, 11, 9))
    with pytest.raises(NaNError, match=r"'amp'.*NaN.*allow_nan"):
        shardload.compute(_cfg(tmp_path, src, depth=1))
    cfg = _cfg(tmp_path, src, depth=1, boundary="reflect")
    cfg["allow_nan"] = True
    shardload.compute(cfg)
    from compute_funcs import box

    got = shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 13)
    ref = dask_reference(data, {0: 5}, box, {0: 1, 1: 1, 2: 1}, "reflect")
    np.testing.assert_array_equal(got, ref)  # NaN where dask has NaN


def test_existing_output_and_kwargs(tmp_path: Path, cube: np.ndarray) -> None:
    src = write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    cfg = _cfg(tmp_path, src, function="compute_funcs:scaled", factor=2.0)
    m = shardload.compute(cfg)
    assert m.arrays["a"].attrs["kwargs"] == {"factor": 2.0}
    assert m.stats["a"].count == cube.size
    np.testing.assert_array_equal(
        shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 13), cube * 2
    )
    with pytest.raises(StoreExistsError):
        shardload.compute(cfg)


def test_inner_axis_rechunked_as_dask(tmp_path: Path, cube: np.ndarray) -> None:
    """Depth larger than the last block along an inner axis: blocks merge as dask merges them."""
    from dask.array.overlap import ensure_minimum_chunksize as dask_emc

    for size, chunks in [(10, (20, 20, 1)), (3, (1, 1, 3)), (2, (4, 4, 3)), (3, (5, 1, 1, 5, 2))]:
        assert ensure_minimum_chunksize(size, chunks) == dask_emc(size, chunks)
    src = write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    from compute_funcs import block_position

    cfg = _cfg(
        tmp_path, src, function="compute_funcs:block_position", depth={1: 3}, boundary="none"
    )
    cfg["chunks"] = {0: 5, 1: 5}  # axis 1: (5, 5, 1)
    shardload.compute(cfg)
    got = shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 13)
    ref = dask_reference(cube, {0: 5, 1: 5}, block_position, {0: 0, 1: 3, 2: 0}, "none")
    assert got.tobytes() == ref.tobytes()


def test_cli_compute(tmp_path: Path, cube: np.ndarray, capsys: pytest.CaptureFixture[str]) -> None:
    from shardload.cli.app import main

    write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    cfg = tmp_path / "attrs.yaml"
    cfg.write_text(
        "source: {paths: [cube.zarr], variable: amp}\n"
        "attributes:\n"
        "  smooth: {function: 'compute_funcs:box', depth: {0: 1, 1: 1, 2: 1}, boundary: reflect}\n"
        "  env: {function: 'shardload.attributes:envelope', axis: -1, depth: {2: 0}, boundary: nearest}\n"
        "chunks: source\n"
        "out: attrs\n"
        "execution: {scheduler: threads, num_workers: 2}\n"
    )
    assert main(["compute", str(cfg), "--no-progress"]) == 0
    assert "computed 2 attribute(s)" in capsys.readouterr().out
    store = shardload.open_store(str(tmp_path / "attrs"))
    from compute_funcs import box

    ref = dask_reference(cube, {0: 5}, box, {0: 1, 1: 1, 2: 1}, "reflect")
    assert store.read("smooth", 2, 11).tobytes() == ref[2:11].tobytes()
    # bad input: exit 2, the option named, no traceback
    assert main(["compute", str(cfg), "--set", "attributes.smooth.depth.0=9", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "attributes.smooth.depth" in err and "Traceback" not in err


@pytest.mark.slow
def test_kill_9_and_rerun_gives_the_same_store(tmp_path: Path, cube: np.ndarray) -> None:
    import json
    import os
    import signal
    import subprocess
    import sys
    import time

    src = write_source(tmp_path / "cube.zarr", cube, (2, 11, 9))  # 7 slabs
    cfg = _cfg(tmp_path, src, function="compute_funcs:slow_box", depth=1, boundary="reflect")
    cfg["chunks"] = "source"
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    tests_dir = str(Path(__file__).parent)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([os.environ.get("PYTHONPATH", ""), tests_dir]),
    }
    code = (
        "import json, sys, shardload; "
        "shardload.compute(json.load(open(sys.argv[1])), progress=False)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "cfg.json")], env=env)
    progress = tmp_path / "attrs.partial" / "_progress"
    deadline = time.time() + 120
    while time.time() < deadline and len(list(progress.glob("block-*.npz"))) < 2:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done = len(list(progress.glob("block-*.npz")))
    assert 2 <= done < 7 and not (tmp_path / "attrs").exists()
    import compute_funcs

    compute_funcs.CALLS.update(n=0)
    shardload.compute(cfg)  # resumes
    assert compute_funcs.CALLS["n"] == 7 - done  # only the slabs not recorded
    got = shardload.open_store(str(tmp_path / "attrs")).read("a", 0, 13)
    ref = dask_reference(cube, {0: 2}, compute_funcs.box, {0: 1, 1: 1, 2: 1}, "reflect")
    assert got.tobytes() == ref.tobytes()


def test_pad_window_slice_copies_equal_a_gather() -> None:
    """The padded block built from slice pieces equals the direct gather, for any index map."""
    from shardload.blockwise.job import AttributePlan
    from shardload.blockwise.plan import AxisWindow
    from shardload.blockwise.window import pad_window

    rng = np.random.default_rng(5)
    buf = rng.standard_normal((6, 7, 5)).astype(np.float32)
    coords = [np.arange(n) for n in buf.shape]
    att = AttributePlan("a", "m:f", {}, (1, 1, 1), (2.5, 2.5, 2.5), "float32")
    for _ in range(200):
        wins, maps = [], []
        for n in buf.shape:
            size = int(rng.integers(1, 9))
            index = rng.integers(-1, n, size)  # -1: the constant
            wins.append(AxisWindow(0, 1, tuple(int(i) for i in index), 0))
            maps.append(index)
        got = pad_window(buf, coords, wins, att)
        ref = buf[np.ix_(*[np.maximum(m, 0) for m in maps])].copy()
        for k, m in enumerate(maps):
            ref[(slice(None),) * k + (m == -1,)] = 2.5
        np.testing.assert_array_equal(got, ref)


def test_memory_bound_logged_before_the_run(
    tmp_path: Path, cube: np.ndarray, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    src = write_source(tmp_path / "cube.zarr", cube, (5, 11, 9))
    cfg = _cfg(tmp_path, src, depth=1)
    cfg["execution"] = {"scheduler": "threads", "num_workers": 3}
    with caplog.at_level(logging.INFO, logger="shardload.blockwise.engine"):
        shardload.compute(cfg)
    line = next(r.getMessage() for r in caplog.records if "memory bound" in r.getMessage())
    assert "(3 concurrent task(s) + 1)" in line and "MiB" in line
