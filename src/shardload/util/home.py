"""The workspace convention: ``SHARDLOAD_HOME`` (default ``~/.shardload``).

Layout::

    $SHARDLOAD_HOME/
      data/raw/         raw files (the demo writes its sample data here)
      data/processed/   prepared stores
      logs/             one log file per command run
      artifacts/        benchmark results, plots, trained models
      config.yaml       the default prepare config (written on first use)
"""

from __future__ import annotations

import os
from pathlib import Path

SUBDIRS = ("data/raw", "data/processed", "logs", "artifacts")


def home_dir() -> Path:
    return Path(os.environ.get("SHARDLOAD_HOME") or Path.home() / ".shardload").expanduser()


def ensure_home(root: Path | None = None) -> Path:
    """Create the workspace folders (idempotent) and return the home folder."""
    root = root or home_dir()
    for sub in SUBDIRS:
        (root / sub).mkdir(parents=True, exist_ok=True)
    return root
