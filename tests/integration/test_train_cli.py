"""``shardload train {mlp,gnn,lstm} STORE`` from outside: a tiny store per model, a few steps,
then the three outputs (metrics.csv with a row per epoch, the model, the loss plot)."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

pytest.importorskip("lightning")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

REPO = Path(__file__).resolve().parents[2]
COLUMNS = {"epoch", "train_loss", "val_loss", "samples_per_s"}


@pytest.fixture(scope="module")
def radiation_raw(tmp_path_factory) -> Path:
    from shardload.samples.radiation import write_radiation_sample

    raw = tmp_path_factory.mktemp("raw")
    write_radiation_sample(raw, columns=96, patches=(0, 1), seed=0)
    return raw


def _prepare(cfg: dict) -> str:
    from shardload.prep.driver import prepare

    return prepare(cfg).url


def _radiation_store(raw: Path, out: Path, view: str) -> str:
    cfg = {
        "source": {
            "kind": "radiation",
            "paths": [str(raw / "rad4NN_inputs_*.nc")],
            "outputs": [str(raw / "3dcorrection_outputs_*.nc")],
        },
        "sample_dims": ["column"],
        "view": view,
        "format": "zarr",
        "compression": "none",
        "chunk_rows": 16,
        "splits": {"train": 0.75, "val": 0.25},
        "out": str(out),
    }
    if view == "flat":
        cfg["arrays"] = {
            "x": ["sca_inputs", "col_inputs", "hl_inputs", "inter_inputs"],
            "y": ["flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw"],
        }
    return _prepare(cfg)


def _window_store(tmp: Path, *, at_load: bool = False) -> str:
    """A synthetic netCDF time series (time, lat, lon) cut into look-back windows (written, or
    cut at load time from the series)."""
    rng = np.random.default_rng(0)
    t = np.arange(30)
    ds = xr.Dataset(
        {
            "t": (
                ("time", "lat", "lon"),
                (280 + np.sin(t / 4)[:, None, None] + rng.normal(size=(30, 3, 4))).astype("f4"),
            ),
            "z": (("time", "lat", "lon"), rng.normal(size=(30, 3, 4)).astype("f4")),
        },
        coords={"time": t},
    )
    ds.to_netcdf(tmp / "series.nc")
    return _prepare(
        {
            "source": {"paths": [str(tmp / "series.nc")]},
            "sample_dims": ["lat", "lon"],
            "view": {
                "name": "window",
                "time_dim": "time",
                "lookback": 3,
                "horizon": 1,
                "targets": {"y": ["t"]},
                "at_load": at_load,
            },
            "arrays": {"x": ["t", "z"]},
            "format": "npy",
            "compression": "none",
            "chunk_rows": 24,
            "splits": {"train": 0.75, "val": 0.25},
            "out": str(tmp / f"window-{at_load}"),
        }
    )


def _train(model: str, store: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO / "src"),
        "OMP_NUM_THREADS": "1",
        "SHARDLOAD_HOME": str(out.parent / "home"),
    }
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "shardload",
            "train",
            model,
            store,
            "--epochs",
            "2",
            "--max-steps",
            "3",
            "--batch-size",
            "16",
            "--num-workers",
            "1",
            *extra,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )


def _check_outputs(out: Path, *, epochs: int, radiation: bool) -> None:
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert set(rows[0]) >= COLUMNS, rows[0].keys()
    assert [int(r["epoch"]) for r in rows] == list(range(epochs))
    for r in rows:
        for k in ("train_loss", "val_loss", "samples_per_s"):
            assert np.isfinite(float(r[k])) and float(r[k]) > 0, (k, r)
        if radiation:
            assert 0 < float(r["hr_rmse_sw"]) < 1e4 and 0 < float(r["hr_rmse_lw"]) < 1e4, r
    assert list(out.glob("*.ckpt")) or list(out.glob("*.pt"))
    png = list(out.glob("*.png"))
    assert png and png[0].read_bytes()[:4] == b"\x89PNG"


def test_train_mlp(radiation_raw, tmp_path):
    store = _radiation_store(radiation_raw, tmp_path / "flat", "flat")
    res = _train("mlp", store, tmp_path / "out", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    # --max-steps 3 with 2 epochs: the run stops after the first (3-step) epoch
    _check_outputs(tmp_path / "out", epochs=1, radiation=True)


@pytest.mark.distributed
def test_train_mlp_ddp_two_processes(radiation_raw, tmp_path):
    store = _radiation_store(radiation_raw, tmp_path / "flat", "flat")
    res = _train("mlp", store, tmp_path / "out", "--out", str(tmp_path / "out"), "--devices", "2")
    assert res.returncode == 0, res.stderr[-3000:]
    _check_outputs(tmp_path / "out", epochs=1, radiation=True)


def test_train_gnn(radiation_raw, tmp_path):
    pytest.importorskip("torch_geometric")
    store = _radiation_store(radiation_raw, tmp_path / "graph", "graph")
    res = _train("gnn", store, tmp_path / "out", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    _check_outputs(tmp_path / "out", epochs=1, radiation=True)


def test_train_lstm_default_out_and_wrong_store(tmp_path):
    store = _window_store(tmp_path)
    env_home = tmp_path / "home"
    res = _train("lstm", store, tmp_path / "x")
    assert res.returncode == 0, res.stderr[-3000:]
    outs = list((env_home / "artifacts").glob("lstm-*"))
    assert len(outs) == 1, outs
    _check_outputs(outs[0], epochs=1, radiation=False)
    bad = _train("gnn", store, tmp_path / "x")
    assert bad.returncode == 2 and "graph store" in bad.stderr, bad.stderr[-2000:]


def test_train_lstm_on_windows_cut_at_load_time(tmp_path):
    store = _window_store(tmp_path, at_load=True)
    res = _train("lstm", store, tmp_path / "out", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    _check_outputs(tmp_path / "out", epochs=1, radiation=False)
