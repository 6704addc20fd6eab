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


def test_demo_regenerates_outdated_samples_and_prepares_from_them(tmp_path, monkeypatch, capsys):
    """A workspace kept from an older sample generator (its targets were not a function of the
    inputs: the MLP ended at the mean predictor's loss, issue #25): the demo writes those files
    again, saying why, and its store holds the current generator's values, not the old ones."""
    import shutil

    import netCDF4
    import numpy as np

    from shardload import open_store
    from shardload.cli.app import main

    home = tmp_path / "home"
    monkeypatch.setenv("SHARDLOAD_HOME", str(home))
    argv = ["demo", "--columns", "256", "--patches", "1", "--steps", "0"]
    assert main(argv) == 0
    store = home / "data" / "processed" / "radiation-flat"
    with open_store(store) as s:
        want = s.read("y")
    outputs = home / "data" / "raw" / "radiation" / "3dcorrection_outputs_2020010100_0c0.nc"
    # as the generator before the stamp wrote it (a copy: this process holds the file open)
    older = outputs.with_name("older.nc")
    shutil.copy(outputs, older)
    with netCDF4.Dataset(older, "a") as ds:
        if "shardload_sample_version" in ds.ncattrs():
            ds.delncattr("shardload_sample_version")
        ds["flux_dn_sw"][:] = 0
    os.replace(older, outputs)
    mtime = outputs.stat().st_mtime_ns
    capsys.readouterr()
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "written again" in out.out, out.out
    text = "".join(p.read_text() for p in (home / "logs").glob("demo-*.log"))
    assert f"regenerating {outputs.name}: it records no sample version" in text
    assert outputs.stat().st_mtime_ns != mtime
    with open_store(store) as s:
        np.testing.assert_array_equal(s.read("y"), want)  # prepared again, from current files
    # up to date now: a third run reuses the files as they are
    mtime = outputs.stat().st_mtime_ns
    assert main(argv) == 0
    assert "reused (written by an earlier demo, up to date)" in capsys.readouterr().out
    assert outputs.stat().st_mtime_ns == mtime
