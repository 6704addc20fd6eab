"""The read side (store, format readers, loader, torch layer) never imports xarray, dask or
pandas: every DataLoader worker would pay ~0.3 s for them (docs/design.md, "Layers")."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from _stores import make_store
from conftest import SRC

PREPARE_ONLY = ("xarray", "dask", "pandas")


def _modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter; the prepare-only modules it imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in {PREPARE_ONLY!r} if m in sys.modules)))"
    res = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout.strip().splitlines()[-1]))


def test_store_and_loader_imports_stay_light():
    code = "import shardload, shardload.store.core, shardload.load, shardload.load.batches\n"
    code += "shardload.open_store, shardload.iter_batches"
    assert _modules_after(code) == []


@pytest.mark.parametrize(("fmt", "comp"), [("zarr", "lz4"), ("npy", "none"), ("hdf5", "none")])
def test_reading_a_store_imports_no_prepare_modules(tmp_path, fmt, comp):
    store = make_store(tmp_path, fmt=fmt, compression=comp, n=40)
    code = (
        "import shardload\n"
        f"s = shardload.open_store({str(store.root)!r})\n"
        "s.read('x', 3, 30); s.manifest.stats['x'].mean\n"
        "for b in shardload.iter_batches(s, batch_size=8, seed=1): pass\n"
    )
    assert _modules_after(code) == []


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch is not installed")
def test_torch_layer_imports_no_prepare_modules():
    assert _modules_after("import shardload.torch") == []
