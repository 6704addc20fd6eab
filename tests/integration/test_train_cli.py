"""``shardload train {mlp,gnn,lstm} STORE`` from outside: a tiny store per model, a few steps,
then the three outputs (metrics.csv with a row per epoch, the model, the loss plot).

Each store is prepared once for the module, and the mlp runs are one chain (``mlp_runs``) whose
runs several tests read: an uninterrupted run, a run cut mid-epoch into a folder an earlier run
left (refused, then replaced with --overwrite), and that run resumed. Each run starts Python,
Lightning and a DataLoader worker: seconds, many more on a loaded machine."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
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


@pytest.fixture(scope="module")
def flat_store(radiation_raw, tmp_path_factory) -> str:
    return _radiation_store(radiation_raw, tmp_path_factory.mktemp("flat") / "flat", "flat")


@pytest.fixture(scope="module")
def window_store(tmp_path_factory) -> str:
    return _window_store(tmp_path_factory.mktemp("window"))


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


@dataclass
class MlpRuns:
    """The mlp chain, 9 steps an epoch (144 train rows / 16), --epochs 3 so that only
    --max-steps ends a run early: ``whole`` ran 18 steps; ``refused`` is a run without
    --overwrite into ``cut``, where an earlier run's metrics.csv lay; ``cut`` (as it was when
    that run ended: ``cut_copy``, its stderr ``cut_stderr``) then ran 13 steps with --overwrite,
    and was resumed to 18 steps."""

    whole: Path
    refused: subprocess.CompletedProcess
    earlier: str  # metrics.csv of ``cut`` after the refused run
    cut_copy: Path
    cut_stderr: str
    cut: Path


CHAIN = ("--epochs", "3")
EVERY_5 = ("--checkpoint-every", "5")  # the uninterrupted and the resumed run


@pytest.fixture(scope="module")
def mlp_runs(flat_store, tmp_path_factory) -> MlpRuns:
    tmp = tmp_path_factory.mktemp("mlp")
    whole, cut = tmp / "whole", tmp / "cut"
    res = _train(
        "mlp", flat_store, whole, "--out", str(whole), *CHAIN, *EVERY_5, "--max-steps", "18"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    cut.mkdir()
    (cut / "metrics.csv").write_text("an earlier run\n")
    refused = _train("mlp", flat_store, cut, "--out", str(cut), *CHAIN, "--max-steps", "13")
    earlier = (cut / "metrics.csv").read_text()
    res = _train(
        "mlp", flat_store, cut, "--out", str(cut), *CHAIN, "--max-steps", "13", "--overwrite"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    cut_copy = shutil.copytree(cut, tmp / "cut-copy")
    resumed = _train(
        "mlp", flat_store, cut, "--out", str(cut), *CHAIN, *EVERY_5, "--max-steps", "18", "--resume"
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return MlpRuns(whole, refused, earlier, cut_copy, res.stderr, cut)


def test_train_mlp(mlp_runs):
    # --max-steps 18 with 3 epochs: the run stops after the second (9-step) epoch
    _check_outputs(mlp_runs.whole, epochs=2, radiation=True)


@pytest.mark.distributed
def test_train_mlp_ddp_two_processes(flat_store, tmp_path):
    res = _train(
        "mlp", flat_store, tmp_path / "out", "--out", str(tmp_path / "out"), "--devices", "2"
    )
    assert res.returncode == 0, res.stderr[-3000:]
    _check_outputs(tmp_path / "out", epochs=1, radiation=True)


def test_train_gnn(radiation_raw, tmp_path):
    pytest.importorskip("torch_geometric")
    store = _radiation_store(radiation_raw, tmp_path / "graph", "graph")
    res = _train("gnn", store, tmp_path / "out", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    _check_outputs(tmp_path / "out", epochs=1, radiation=True)


def test_train_lstm_default_out_and_wrong_store(window_store, tmp_path):
    env_home = tmp_path / "home"
    res = _train("lstm", window_store, tmp_path / "x")
    assert res.returncode == 0, res.stderr[-3000:]
    outs = list((env_home / "artifacts").glob("lstm-*"))
    assert len(outs) == 1, outs
    _check_outputs(outs[0], epochs=1, radiation=False)
    bad = _train("gnn", window_store, tmp_path / "x")
    assert bad.returncode == 2 and "graph store" in bad.stderr, bad.stderr[-2000:]


def test_train_lstm_on_windows_cut_at_load_time(tmp_path):
    store = _window_store(tmp_path, at_load=True)
    res = _train("lstm", store, tmp_path / "out", "--out", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr[-3000:]
    _check_outputs(tmp_path / "out", epochs=1, radiation=False)


def _metrics(out: Path) -> dict:
    return json.loads((out / "metrics.json").read_text())


def test_max_steps_cut_epoch_is_validated(mlp_runs):
    """--max-steps past the first epoch cuts the second one; it gets a validation too."""
    # 13 steps end 4 steps into the second epoch (of 3)
    with open(mlp_runs.cut_copy / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [0, 1]
    assert all(np.isfinite(float(r["val_loss"])) for r in rows), rows
    _check_outputs(mlp_runs.cut_copy, epochs=2, radiation=True)
    assert "epoch 2/3" in mlp_runs.cut_stderr  # one line per epoch without a terminal
    assert mlp_runs.cut_stderr.count("GPU available") <= 1  # Lightning's lines once, not twice


def test_existing_out_refused_without_overwrite(mlp_runs):
    res = mlp_runs.refused
    assert res.returncode == 2 and "--overwrite" in res.stderr, res.stderr[-2000:]
    assert mlp_runs.earlier == "an earlier run\n"
    # the run with --overwrite replaced it
    assert (mlp_runs.cut_copy / "metrics.csv").read_text().startswith("epoch,")


def test_resume_mid_epoch_is_exact(mlp_runs):
    """A run stopped 4 steps into its second epoch and resumed ends where an uninterrupted
    run ends: the same last validation loss and the same weights."""
    import torch

    whole, cut = mlp_runs.whole, mlp_runs.cut
    assert _metrics(cut)["val_loss"] == _metrics(whole)["val_loss"]
    a = torch.load(whole / "model.ckpt", weights_only=False)["state_dict"]
    b = torch.load(cut / "model.ckpt", weights_only=False)["state_dict"]
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    with open(cut / "metrics.csv") as f:
        assert [int(r["epoch"]) for r in csv.DictReader(f)] == [0, 1]


def test_resume_needs_a_checkpoint(window_store, tmp_path):
    res = _train("lstm", window_store, tmp_path / "out", "--out", str(tmp_path / "out"), "--resume")
    assert res.returncode == 2 and "last.ckpt" in res.stderr, res.stderr[-2000:]
