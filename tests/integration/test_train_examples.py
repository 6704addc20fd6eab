"""The worked examples learn, from the shipped configs on the shipped sample generators, with
the commands of docs/training.md: each ends with a validation loss at most half the mean
predictor's (``metrics.json``). The full runs take minutes (slow); the small ones are the same
pipeline on a smaller sample (the MLP's is the documented run itself: one run, checked by both)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from .cli_run import CONFIGS, run_shardload

pytest.importorskip("lightning")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

_run = run_shardload


def _learnt(got: dict) -> dict:
    assert got["val_loss"] <= 0.5 * got["val_loss_mean_predictor"], got
    return got


def _radiation(work: Path, view: str, sample: tuple[str, ...]) -> str:
    _run(work, "sample", "radiation", "--out", "data/raw/radiation", *sample)
    shutil.copy(CONFIGS / f"radiation-{view}.yaml", work)
    _run(work, "prepare", f"radiation-{view}.yaml", "--no-progress")
    return f"data/processed/radiation-{view}"


def _era5(work: Path, sample: tuple[str, ...]) -> str:
    _run(work, "sample", "era5", "--out", ".", *sample)
    shutil.copy(CONFIGS / "era5-window.yaml", work)
    _run(work, "prepare", "era5-window.yaml", "--no-progress")
    return "era5-window"


SMALL = {
    # model: (sample options, train options)
    # the MLP (4,128 inputs) needs the documented sample of 8,192 columns not to overfit
    "mlp": (("--patches", "0", "1", "2", "3"), ("--epochs", "10", "--batch-size", "64")),
    "gnn": (("--patches", "0", "1", "--columns", "1024"), ("--epochs", "4", "--batch-size", "32")),
    "lstm": (("--grid-deg", "15"), ("--epochs", "2", "--batch-size", "256")),
}
DOCUMENTED = {
    "mlp": (("--patches", "0", "1", "2", "3"), ("--epochs", "10", "--batch-size", "64")),
    "gnn": (("--patches", "0", "1", "2", "3"), ("--epochs", "3", "--batch-size", "64")),
    "lstm": ((), ("--epochs", "2", "--batch-size", "1024")),
}


#: metrics.json of each run already made in this process, by (model, sample, train): where the
#: small example is the documented one (the MLP's), its test checks the same run's result
_RUNS: dict[tuple[str, tuple[str, ...], tuple[str, ...]], dict] = {}


def _example(work: Path, model: str, sample: tuple[str, ...], train: tuple[str, ...]) -> dict:
    key = (model, sample, train)
    if key not in _RUNS:
        _RUNS[key] = _run_example(work, model, sample, train)
    return _learnt(_RUNS[key])


def _run_example(work: Path, model: str, sample: tuple[str, ...], train: tuple[str, ...]) -> dict:
    if model == "lstm":
        store = _era5(work, sample)
    else:
        store = _radiation(work, "flat" if model == "mlp" else "graph", sample)
    _run(work, "train", model, store, "--out", "out", *train)
    return json.loads((work / "out" / "metrics.json").read_text())


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "gnn", "lstm"])
def test_small_example_learns(model, tmp_path):
    if model == "gnn":
        pytest.importorskip("torch_geometric")
    _example(tmp_path, model, *SMALL[model])


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "gnn", "lstm"])
def test_documented_example_learns(model, tmp_path):
    if model == "gnn":
        pytest.importorskip("torch_geometric")
    _example(tmp_path, model, *DOCUMENTED[model])
