"""Run ``python -m shardload ...`` in a work folder, as the worked examples' tests do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "src" / "shardload" / "configs"


def run_shardload(work: Path, *args: str) -> subprocess.CompletedProcess:
    """``shardload ARGS`` in ``work`` (this checkout's package, a private SHARDLOAD_HOME); its
    exit status must be 0 (the assertion shows the end of stderr)."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "SHARDLOAD_HOME": str(work / "home")}
    res = subprocess.run(
        [sys.executable, "-m", "shardload", *args],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=880,
    )
    assert res.returncode == 0, (args, res.stderr[-3000:])
    return res
