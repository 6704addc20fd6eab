"""``shardload train forecast`` learns the dynamics of ``shardload sample states``: the shipped
path (sample, the shipped ``era5-states.yaml``, prepare, train) at a small size ends with a
validation loss below persistence's and the mean predictor's, both scored on the same windows.
The documented default run (docs/training.md) is the slow one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .cli_run import CONFIGS, run_shardload

pytest.importorskip("lightning")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

_run = run_shardload


def _prepare(work: Path, sample: tuple[str, ...]) -> Path:
    _run(work, "sample", "states", "--out", ".", *sample)
    shutil.copy(CONFIGS / "era5-states.yaml", work)
    _run(work, "prepare", "era5-states.yaml", "--no-progress")
    return work


def _forecast(work: Path, train: tuple[str, ...], out: str = "out") -> dict:
    _run(work, "train", "forecast", "era5-states", "--out", out, *train)
    got = json.loads((work / out / "metrics.json").read_text())
    assert got["model"] == "forecast" and got["epochs"] >= 1
    assert got["val_loss"] < got["val_loss_persistence"], got
    assert got["val_loss"] < got["val_loss_mean_predictor"], got
    # persistence is a real baseline here: far better than the train mean
    assert got["val_loss_persistence"] < got["val_loss_mean_predictor"], got
    return got


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The small sample (480 dates), prepared once for the tests that only read it; each
    trains into its own folders."""
    return _prepare(tmp_path_factory.mktemp("states480"), ("--dates", "480"))


@pytest.mark.slow
def test_small_forecast_beats_persistence(small):
    _forecast(small, ("--epochs", "2"), out="small")


@pytest.mark.slow
def test_documented_forecast_halves_persistence(tmp_path):
    got = _forecast(_prepare(tmp_path, ()), ())
    assert got["val_loss"] <= 0.5 * got["val_loss_persistence"], got


@pytest.mark.slow
def test_forecast_resume_mid_epoch_is_exact(small):
    """A run cut after 3 steps and resumed ends where an uninterrupted one does: the windows
    of dates, the model and the optimizer all continue from last.ckpt."""
    tmp_path = small
    train = ("train", "forecast", "era5-states", "--epochs", "1", "--checkpoint-every", "2")
    _run(tmp_path, *train, "--out", "cut", "--max-steps", "3")
    _run(tmp_path, *train, "--out", "cut", "--resume", "--max-steps", "8")
    _run(tmp_path, *train, "--out", "whole", "--max-steps", "8")
    cut, whole = (json.loads((tmp_path / d / "metrics.json").read_text()) for d in ("cut", "whole"))
    assert cut["val_loss"] == whole["val_loss"], (cut, whole)
    assert cut["val_loss_persistence"] == whole["val_loss_persistence"]
