"""Two ``shardload prepare`` processes on one ``out`` with different configs, started together:
exactly one complete store, with the winner's data; the loser exits with a clear error (who
holds the output, or that it exists) and no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import shardload
from conftest import make_dataset

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_two_writers_race_one_store_with_the_winners_data(tmp_path):
    make_dataset(120, seed=5).to_netcdf(tmp_path / "src.nc")
    ds = xr.open_dataset(tmp_path / "src.nc")
    want = {
        "x": np.concatenate([ds.a.values[:, None], ds.b.values, ds.c.values.T], axis=1),
        "y": ds.b.values,
    }
    confs = []
    for i, (rows, fmt, arrays) in enumerate([(10, "hdf5", ["x"]), (7, "zarr", ["x", "y"])]):
        conf = {
            "source": {"paths": ["src.nc"]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {k: {"x": ["a", "b", "c"], "y": ["b"]}[k] for k in arrays},
            "chunk_rows": rows,
            "format": fmt,
            "out": "store",
        }
        path = tmp_path / f"conf{i}.yaml"
        path.write_text(yaml.safe_dump(conf))
        confs.append((path, rows, arrays))
    env = {**os.environ, "SHARDLOAD_THROTTLE_S": "0.05"}
    outcomes = []
    for _ in range(4):
        procs = [
            subprocess.Popen(
                [sys.executable, "-m", "shardload", "prepare", str(p), "--no-progress"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for p, _, _ in confs
        ]
        res = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
        codes = [rc for rc, _ in res]
        assert sorted(codes) == [0, 2], res  # one wins, one refused (exit code 2: a clear error)
        winner = codes.index(0)
        loser_err = res[1 - winner][1]
        assert "Traceback" not in loser_err, loser_err
        assert (
            "another prepare is writing" in loser_err and "pid " in loser_err
        ) or "exists; pass --overwrite" in loser_err, loser_err
        outcomes.append("locked" if "another prepare" in loser_err else "exists")
        store = shardload.open_store(tmp_path / "store")
        _, rows, arrays = confs[winner]
        assert store.manifest.complete and store.manifest.chunk_rows == rows
        assert sorted(store.arrays) == sorted(arrays)
        for name in arrays:
            np.testing.assert_array_equal(store.read(name), want[name])
        assert not (tmp_path / "store.partial").exists()
        assert not (tmp_path / "store.partial.lock").exists()
        import shutil

        shutil.rmtree(tmp_path / "store")
    print("outcomes", outcomes)
