"""Shared fixtures: small fake stores made of plain files (no store reader needed)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def make_store(path: Path, *, num_chunks: int = 3, chunk_bytes: int = 4096, complete=True) -> Path:
    """A fake npy-stack store: ``shardload.json`` plus ``x/00000N.npy`` files of random bytes."""
    path.mkdir(parents=True)
    manifest = {"format": "npy", "length": 10 * num_chunks, "complete": complete, "arrays": []}
    (path / "shardload.json").write_text(json.dumps(manifest))
    (path / "x").mkdir()
    for i in range(num_chunks):
        (path / "x" / f"{i:06d}.npy").write_bytes(os.urandom(chunk_bytes + i))
    return path


def tree_bytes(path: Path) -> dict[str, bytes]:
    """Every file under ``path`` (relative POSIX name -> content)."""
    return {p.relative_to(path).as_posix(): p.read_bytes() for p in path.rglob("*") if p.is_file()}


def python_env() -> dict[str, str]:
    """The environment for subprocesses running ``python -m shardload`` from this checkout."""
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def spawn(*args: str, **kwargs) -> subprocess.Popen:
    """Start ``python -m shardload ARGS`` with stdout/stderr piped as text."""
    return subprocess.Popen(
        [sys.executable, "-m", "shardload", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
        **kwargs,
    )


@pytest.fixture
def stores(tmp_path: Path) -> Path:
    """A served folder: a complete npy store, an incomplete one, a zarr v3 and a zarr v2 group,
    a folder that is not a store, and a file."""
    root = tmp_path / "served"
    root.mkdir()
    make_store(root / "alpha")
    make_store(root / "partial", num_chunks=1, complete=False)
    (root / "plainzarr").mkdir()
    (root / "plainzarr" / "zarr.json").write_text('{"zarr_format": 3, "node_type": "group"}')
    (root / "zarr2").mkdir()
    (root / "zarr2" / ".zgroup").write_text('{"zarr_format": 2}')
    (root / "notastore").mkdir()
    (root / "README").write_text("hello")
    return root
