"""A prepared store served over loopback HTTP reads exactly like the local one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import shardload
from conftest import make_dataset
from shardload.move.serve import serving

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("served")
    make_dataset(83, seed=5).to_netcdf(root / "src.nc")
    for fmt, comp in (("zarr", "zstd"), ("npy", "none"), ("hdf5", "lz4")):
        shardload.prepare(
            {
                "source": {"paths": [str(root / "src.nc")]},
                "sample_dims": ["sample"],
                "arrays": {"x": ["a", "b", "c"], "y": ["b"]},
                "chunk_rows": 9,
                "format": fmt,
                "compression": comp,
                "out": str(root / "stores" / fmt),
            },
            progress=False,
        )
    with serving(root / "stores", port=0) as url:
        yield root / "stores", url.rstrip("/")


@pytest.mark.parametrize("fmt", ["zarr", "npy", "hdf5"])
def test_open_store_by_url_equals_local(served, fmt, tmp_path):
    root, url = served
    local = shardload.open_store(root / fmt)
    remote = shardload.open_store(f"{url}/{fmt}")
    assert len(remote) == len(local) == 83
    for name in ("x", "y"):
        np.testing.assert_array_equal(remote.read(name), local.read(name))
        np.testing.assert_array_equal(remote.read(name, 10, 40), local.read(name, 10, 40))
    cached = shardload.open_store(f"{url}/{fmt}", cache_dir=tmp_path / "cache", cache_bytes=10**8)
    np.testing.assert_array_equal(cached.read("x", 5, 70), local.read("x", 5, 70))


def test_inspect_by_url(served):
    _, url = served
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "inspect", f"{url}/npy", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert d["length"] == 83 and d["complete"] and d["format"] == "npy"
