"""Prepare with real processes: a kill mid-prepare, and a dask.distributed LocalCluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import shardload
from conftest import make_dataset
from shardload.errors import IncompleteStoreError

pytestmark = pytest.mark.integration


def write_config(tmp_path: Path, n: int, **kw) -> Path:
    make_dataset(n, seed=3).to_netcdf(tmp_path / "src.nc")
    conf = {
        "source": {"paths": ["src.nc"]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a", "b", "c"]},
        "chunk_rows": 10,
        "format": "zarr",
        "compression": "zstd",
        "out": "store",
        **kw,
    }
    path = tmp_path / "conf.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def test_kill_during_prepare_never_leaves_a_complete_store_and_resumes(tmp_path):
    conf = write_config(tmp_path, 200)
    env = {**os.environ, "SHARDLOAD_THROTTLE_S": "0.15"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardload",
            "prepare",
            str(conf),
            "--no-progress",
            "--workers",
            "2",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    progress = tmp_path / "store.partial" / "_progress"
    deadline = time.monotonic() + 60
    try:
        while time.monotonic() < deadline and len(list(progress.glob("block-*.npz"))) < 3:
            time.sleep(0.02)
        assert len(list(progress.glob("block-*.npz"))) >= 3, proc.communicate(timeout=5)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert not (tmp_path / "store").exists()
    with pytest.raises(IncompleteStoreError):
        shardload.open_store(tmp_path / "store")
    done_before = len(list(progress.glob("block-*.npz")))
    assert done_before < 20
    # same command again: resumes and completes, values equal a clean run
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "prepare", str(conf), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    assert "resuming" in res.stderr
    store = shardload.open_store(tmp_path / "store")
    ds = xr.open_dataset(tmp_path / "src.nc")
    want = np.concatenate([ds.a.values[:, None], ds.b.values, ds.c.values.T], axis=1)
    np.testing.assert_array_equal(store.read("x"), want)
    np.testing.assert_allclose(store.manifest.stats["x"].mean, want.mean(0), rtol=1e-10)
    assert not (tmp_path / "store.partial").exists()


@pytest.mark.distributed
def test_prepare_on_local_cluster_with_two_worker_processes(tmp_path):
    conf = write_config(
        tmp_path,
        95,
        format="npy",
        compression="none",
        execution={"scheduler": "distributed", "num_workers": 2},
    )
    store = shardload.prepare(conf)
    ds = xr.open_dataset(tmp_path / "src.nc")
    want = np.concatenate([ds.a.values[:, None], ds.b.values, ds.c.values.T], axis=1)
    np.testing.assert_array_equal(store.read("x"), want)
    assert store.num_chunks == 10


@pytest.mark.parametrize("fmt", ["hdf5", "zarr"])
def test_prepare_with_process_pool(tmp_path, fmt):
    conf = write_config(
        tmp_path,
        64,
        format=fmt,
        compression="lz4",
        execution={"scheduler": "processes", "num_workers": 2},
    )
    store = shardload.prepare(conf)
    ds = xr.open_dataset(tmp_path / "src.nc")
    np.testing.assert_array_equal(store.read("x")[:, 0], ds.a.values)


@pytest.mark.parametrize("view", ["flat", "graph"])
def test_radiation_prepare_in_worker_processes_equals_threads(tmp_path, radiation_sample, view):
    """The radiation row reader opens its files lazily in each worker process."""
    inputs = sorted(str(p) for p in radiation_sample if p.name.startswith("rad4NN"))
    outputs = sorted(str(p) for p in radiation_sample if p.name.startswith("3dcorrection"))
    base = {
        "source": {"kind": "radiation", "paths": inputs, "outputs": outputs},
        "sample_dims": ["column"],
        "view": view,
        "chunk_rows": 170,
        "format": "zarr",
        "compression": "zstd",
    }
    if view == "flat":
        base["arrays"] = {"x": ["sca_inputs", "col_inputs"], "y": ["hr_sw", "flux_dn_lw"]}
    threads = shardload.prepare({**base, "out": str(tmp_path / "t")})
    procs = shardload.prepare(
        {
            **base,
            "out": str(tmp_path / "p"),
            "execution": {"scheduler": "processes", "num_workers": 2},
        }
    )
    assert len(procs) == len(threads) == 1200 and procs.num_chunks == 8
    for name in threads.arrays:
        np.testing.assert_array_equal(procs.read(name), threads.read(name))
    np.testing.assert_array_equal(procs.manifest.stats["x"].mean, threads.manifest.stats["x"].mean)
