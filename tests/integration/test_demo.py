"""The README's main job, small: sample -> prepare -> inspect -> train, in a fresh SHARDLOAD_HOME."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


SMALL = ("--columns", "512", "--patches", "2")


def _demo(env, *args, size=SMALL):
    return subprocess.run(
        [sys.executable, "-m", "shardload", "demo", *size, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )


def test_demo_end_to_end(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "SHARDLOAD_HOME": str(home)}
    res = _demo(env, size=())  # the README's run: the demo's defaults
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "[2/4] prepare" in out and "16384 samples" in out and "[4/4] train: 300 steps" in out
    assert (home / "config.yaml").exists()
    store = home / "data" / "processed" / "radiation-flat"
    assert (store / "shardload.json").exists() and (store / "metadata.json").exists()
    # validated, and the model saved under artifacts/ with its metrics
    assert "validation loss" in out
    (run,) = list((home / "artifacts").glob("demo-*"))
    assert (run / "model.pt").stat().st_size > 0 and f"model saved to {run / 'model.pt'}" in out
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["val_rows"] > 0 and metrics["val_loss"] > 0
    # it learns: at most half the loss of predicting the train mean (same units; issue #25)
    assert metrics["val_loss"] <= 0.5 * metrics["val_loss_mean_predictor"], metrics
    (log,) = list((home / "logs").glob("demo-*.log"))
    assert f"log in {log}" in res.stderr and "exit status 0" in log.read_text()
    # a user's file in the raw folder: never deleted, whatever the demo's options
    raw = home / "data" / "raw" / "radiation"
    mine = raw / "notes.txt"
    mine.write_text("mine")
    again = _demo(env, "--steps", "0")
    assert mine.read_text() == "mine", again.stderr[-2000:]
