"""``shardload train {mlp,gnn,lstm} STORE`` from outside: a tiny store per model, a few steps,
then the three outputs (metrics.csv with a row per epoch, the model, the loss plot)."""

from __future__ import annotations

import csv
import json
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
    assert (out / "last.ckpt").is_file() and (out / "model.ckpt").is_file()
    got = json.loads((out / "metrics.json").read_text())
    assert got["val_loss"] == pytest.approx(float(rows[-1]["val_loss"]), rel=1e-5)
    assert np.isfinite(got["val_loss_mean_predictor"]) and got["val_loss_mean_predictor"] > 0
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


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_max_steps_cut_epoch_is_validated(radiation_raw, tmp_path):
    """--max-steps past the first epoch cuts the second one; it gets a validation too."""
    store = _radiation_store(radiation_raw, tmp_path / "flat", "flat")
    out = tmp_path / "out"
    # 144 train rows / 16 = 9 steps an epoch: 11 steps end 2 steps into the second epoch
    res = _train("mlp", store, out, "--out", str(out), "--max-steps", "11")
    assert res.returncode == 0, res.stderr[-3000:]
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert all(np.isfinite(float(r["val_loss"])) for r in rows), rows
    assert "epoch 2/2" in res.stderr  # one line per epoch without a terminal
    assert res.stderr.count("GPU available") <= 1  # Lightning's lines once, not twice


def test_existing_out_refused_without_overwrite(radiation_raw, tmp_path):
    store = _radiation_store(radiation_raw, tmp_path / "flat", "flat")
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.csv").write_text("an earlier run\n")
    res = _train("mlp", store, out, "--out", str(out))
    assert res.returncode == 2 and "--overwrite" in res.stderr, res.stderr[-2000:]
    assert (out / "metrics.csv").read_text() == "an earlier run\n"
    res = _train("mlp", store, out, "--out", str(out), "--overwrite")
    assert res.returncode == 0, res.stderr[-3000:]
    assert (out / "metrics.csv").read_text().startswith("epoch,")


def test_resume_mid_epoch_is_exact(radiation_raw, tmp_path):
    """A run stopped 4 steps into its second epoch and resumed ends where an uninterrupted
    run ends: the same last validation loss and the same weights."""
    import torch

    store = _radiation_store(radiation_raw, tmp_path / "flat", "flat")
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    args = ("--max-steps", "18", "--checkpoint-every", "5")  # 2 epochs of 9 steps
    res = _train("mlp", store, whole, "--out", str(whole), *args)
    assert res.returncode == 0, res.stderr[-3000:]
    res = _train("mlp", store, cut, "--out", str(cut), "--max-steps", "13")
    assert res.returncode == 0, res.stderr[-3000:]
    res = _train("mlp", store, cut, "--out", str(cut), "--resume", *args)
    assert res.returncode == 0, res.stderr[-3000:]
    assert _metrics(cut)["val_loss"] == _metrics(whole)["val_loss"]
    a = torch.load(whole / "model.ckpt", weights_only=False)["state_dict"]
    b = torch.load(cut / "model.ckpt", weights_only=False)["state_dict"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    with open(cut / "metrics.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [0, 1]


def test_resume_needs_a_checkpoint(tmp_path):
    store = _window_store(tmp_path)
    res = _train("lstm", store, tmp_path / "out", "--out", str(tmp_path / "out"), "--resume")
    assert res.returncode == 2 and "last.ckpt" in res.stderr, res.stderr[-2000:]
