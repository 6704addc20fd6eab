"""Steps after the attributes: standardisation and k-means facies labels (dask-ml KMeans)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import ConfigError, MissingDependencyError

da = pytest.importorskip("dask.array")
zarr = pytest.importorskip("zarr")


def _source(tmp_path: Path) -> Path:
    from shardload.samples.seismic import write_seismic_sample

    return write_seismic_sample(tmp_path / "cube.zarr", (12, 9, 40), seed=4, chunk_inlines=5)


def _cfg(tmp_path: Path, src: Path, **steps: Any) -> dict[str, Any]:
    return {
        "source": {"paths": [str(src)], "variable": "amp"},
        "attributes": {
            "env": "shardload.attributes:envelope",
            "rms": {"function": "shardload.attributes:rms_amplitude", "window": 5, "depth": {2: 2}},
            **steps,
        },
        "out": str(tmp_path / "attrs"),
        "execution": {"scheduler": "threads", "num_workers": 2},
    }


def test_standardize_and_kmeans_steps(tmp_path: Path) -> None:
    pytest.importorskip("dask_ml")
    from dask_ml.cluster import KMeans

    from shardload.blockwise.steps import FIT_ROWS

    src = _source(tmp_path)
    km = {"inputs": ["env", "rms"], "n_clusters": 4, "random_state": 3, "max_iter": 50}
    m = shardload.compute(_cfg(tmp_path, src, env_z={"standardize": "env"}, facies={"kmeans": km}))
    store = shardload.open_store(str(tmp_path / "attrs"))
    env, rms = store.read("env", 0, 12), store.read("rms", 0, 12)
    # standardisation over the whole attribute (population std), float32
    z = store.read("env_z", 0, 12)
    assert z.dtype == np.float32 and z.shape == env.shape
    ref = (env.astype(np.float64) - env.mean(dtype=np.float64)) / env.std(dtype=np.float64)
    np.testing.assert_allclose(z, ref, rtol=1e-5, atol=1e-5)
    assert abs(float(m.stats["env_z"].mean[0])) < 1e-5
    assert abs(float(m.stats["env_z"].std[0]) - 1) < 1e-4
    # k-means: dask-ml's KMeans on the same standardised vectors, in chunks of the same size
    mean = [float(m.stats[n].mean[0]) for n in ("env", "rms")]
    std = [float(m.stats[n].std[0]) for n in ("env", "rms")]
    x = np.stack([env.reshape(-1), rms.reshape(-1)], axis=1).astype(np.float64)
    x = (x - mean) / std
    ref_km = KMeans(n_clusters=4, random_state=3, max_iter=50, init="k-means||")
    ref_km.fit(da.from_array(x, chunks=(FIT_ROWS, -1)))
    attrs = m.arrays["facies"].attrs
    np.testing.assert_array_equal(np.asarray(attrs["centers"]), ref_km.cluster_centers_)
    labels = store.read("facies", 0, 12)
    assert labels.dtype == np.int32 and labels.shape == env.shape
    np.testing.assert_array_equal(labels.reshape(-1), ref_km.predict(x))
    assert set(np.unique(labels)) <= set(range(4)) and len(np.unique(labels)) > 1
    # the steps' chunks are checksummed like the attributes'
    from shardload.cli.app import main

    assert main(["verify", str(tmp_path / "attrs")]) == 0
    assert store.to_xarray()["facies"].dims == ("inline", "crossline", "time")


def test_steps_resume_with_the_saved_centres(tmp_path: Path) -> None:
    """A run killed in pass 2 resumes: pass 1 is not redone, the centres are reused."""
    pytest.importorskip("dask_ml")
    import compute_funcs

    src = _source(tmp_path)
    km = {"inputs": ["b"], "n_clusters": 3, "random_state": 0}
    cfg = {
        "source": {"paths": [str(src)], "variable": "amp"},
        "attributes": {"b": "compute_funcs:flaky", "lab": {"kmeans": km}},
        "out": str(tmp_path / "attrs"),
        "execution": {"scheduler": "sync"},
    }
    compute_funcs.CALLS.update(n=0, fail_at=-1)
    ref = shardload.compute({**cfg, "out": str(tmp_path / "ref")})
    from shardload.blockwise import steps

    calls = {"n": 0}
    real = steps.apply_step

    def failing(*a: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("injected in pass 2")
        return real(*a)

    import shardload.blockwise.tasks as engine

    engine.apply_step = failing  # type: ignore[assignment]
    try:
        with pytest.raises(RuntimeError, match="injected in pass 2"):
            shardload.compute(cfg)
    finally:
        engine.apply_step = real
    progress = tmp_path / "attrs.partial" / "_progress"
    assert (progress / "step-lab.npy").exists()
    compute_funcs.CALLS.update(n=0)
    m = shardload.compute(cfg)
    assert compute_funcs.CALLS["n"] == 0  # pass 1 was complete: not redone
    assert m.arrays["lab"].attrs["centers"] == ref.arrays["lab"].attrs["centers"]
    a = shardload.open_store(str(tmp_path / "attrs")).read("lab", 0, 12)
    b = shardload.open_store(str(tmp_path / "ref")).read("lab", 0, 12)
    np.testing.assert_array_equal(a, b)


def test_step_refusals(tmp_path: Path, monkeypatch: Any) -> None:
    src = _source(tmp_path)
    cases = [
        ({"z": {"standardize": "nope"}}, r"attributes\.z\.standardize: 'nope' is not an attribute"),
        ({"z": {"standardize": ["env"]}}, r"attributes\.z\.standardize.*one attribute"),
        (
            {"k": {"kmeans": {"inputs": ["env", "z2"]}}, "z2": {"standardize": "env"}},
            r"attributes\.k\.kmeans\.inputs: 'z2' is not an attribute computed by a function",
        ),
        (
            {"k": {"kmeans": {"inputs": ["env"], "n_clusters": 0}}},
            r"attributes\.k\.kmeans\.n_clusters",
        ),
        (
            {"k": {"kmeans": {"inputs": ["env"], "clusters": 3}}},
            r"attributes\.k\.kmeans: unknown option.*clusters",
        ),
        ({"k": {"kmeans": {}, "standardize": "env"}}, r"attributes\.k: .*exactly one step"),
    ]
    for steps, match in cases:
        with pytest.raises(ConfigError, match=match):
            shardload.compute(_cfg(tmp_path, src, **steps))
        assert not (tmp_path / "attrs.partial").exists()
    import sys

    monkeypatch.setitem(sys.modules, "dask_ml", None)
    with pytest.raises(MissingDependencyError, match=r"shardload\[ml\]"):
        shardload.compute(_cfg(tmp_path, src, k={"kmeans": {"inputs": ["env"]}}))
    assert not (tmp_path / "attrs.partial").exists()


def test_memory_bound_covers_the_steps(tmp_path: Path) -> None:
    """Pass 2 holds a slab of each input and output plus one batch of vectors and distances."""
    pytest.importorskip("dask_ml")
    from shardload.blockwise.config import load_compute_config
    from shardload.blockwise.job import estimate_memory, plan_job
    from shardload.blockwise.source import SourceInfo
    from shardload.blockwise.steps import FIT_ROWS

    info = SourceInfo((40, 30, 20), "float32", ((10,) * 4, (30,), (20,)), ("i", "j", "k"))
    cfg = _cfg(tmp_path, tmp_path / "cube.zarr")
    plain = estimate_memory(plan_job(load_compute_config(cfg), info, "x"), 2)
    km = {"kmeans": {"inputs": ["env", "rms"], "n_clusters": 50}}
    steps = estimate_memory(
        plan_job(
            load_compute_config({**cfg, "attributes": {**cfg["attributes"], "k": km}}), info, "x"
        ),
        2,
    )
    want = 10 * 30 * 20 * (4 + 4 + 4) + FIT_ROWS * 8 * (2 * 2 + 50)
    assert steps.per_task_bytes == want > plain.per_task_bytes
    assert steps.total_bytes - plain.total_bytes == 3 * (want - plain.per_task_bytes)


def test_kmeans_refuses_nan_inputs(tmp_path: Path) -> None:
    pytest.importorskip("dask_ml")
    from shardload.errors import NaNError

    data = np.random.default_rng(0).standard_normal((6, 4, 5)).astype(np.float32)
    data[2, 1, 3] = np.nan
    g = zarr.open_group(store=str(tmp_path / "cube.zarr"), mode="w", zarr_format=3)
    g.create_array("amp", shape=data.shape, chunks=(3, 4, 5), dtype=data.dtype)[...] = data
    cfg = {
        "source": {"paths": [str(tmp_path / "cube.zarr")], "variable": "amp"},
        "attributes": {"b": "compute_funcs:box", "k": {"kmeans": {"inputs": ["b"]}}},
        "allow_nan": True,
        "out": str(tmp_path / "attrs"),
        "execution": {"scheduler": "sync"},
    }
    with pytest.raises(NaNError, match=r"attributes\.k\.kmeans\.inputs: attribute 'b' has \d+ NaN"):
        shardload.compute(cfg)


@pytest.mark.slow
def test_segy_steps_with_processes_equal_sync(tmp_path: Path) -> None:
    """SEG-Y source, attributes and both steps: the processes scheduler writes the same bytes."""
    pytest.importorskip("dask_ml")
    pytest.importorskip("segyio")
    from shardload.samples.seismic import write_seismic_segy

    src = write_seismic_segy(tmp_path / "c.sgy", (12, 6, 40), chunk_inlines=4)

    def cfg(out: str, sched: str) -> dict[str, Any]:
        return {
            "source": {"paths": [str(src)]},
            "attributes": {
                "env": "shardload.attributes:envelope",
                "b": {"function": "compute_funcs:box", "depth": 1},
                "k": {"kmeans": {"inputs": ["env", "b"], "n_clusters": 3}},
                "z": {"standardize": "b"},
            },
            "chunks": {0: 4},
            "out": str(tmp_path / out),
            "execution": {"scheduler": sched, "num_workers": 2},
        }

    shardload.compute(cfg("a", "processes"), progress=False)
    shardload.compute(cfg("b", "sync"), progress=False)
    a, b = shardload.open_store(str(tmp_path / "a")), shardload.open_store(str(tmp_path / "b"))
    for n in ("env", "b", "k", "z"):
        assert a.read(n, 0, 12).tobytes() == b.read(n, 0, 12).tobytes(), n
