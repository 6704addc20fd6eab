"""The README's main job, small: sample -> prepare -> inspect -> train, in a fresh SHARDLOAD_HOME."""

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def test_demo_end_to_end(tmp_path):
    env = {**os.environ, "SHARDLOAD_HOME": str(tmp_path / "home")}
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "demo", "--columns", "512", "--patches", "2", "--steps", "20", "--workers", "2"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout
    assert "[2/4] prepare" in out and "1024 samples" in out and "[4/4] train: 20 steps" in out
    assert (tmp_path / "home" / "config.yaml").exists()
    assert (tmp_path / "home" / "data" / "processed" / "radiation-flat" / "shardload.json").exists()
