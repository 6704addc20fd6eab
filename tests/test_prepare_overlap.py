"""A block's statistics run beside its encoding and write (issue 29 item 1): on a file of one
write block (the packed netCDF-4 case of ``bench_real_prepare.py``) nothing else could overlap
them. Where ``nan: fail`` must stop a block before it is written, they still run first."""

from __future__ import annotations

import threading

import numpy as np
import xarray as xr

import shardload
from shardload.prep import tasks

WAIT_S = 3.0


def _source(path):
    rng = np.random.default_rng(0)
    v = rng.normal(size=(40, 48, 3)).astype("float32")
    v[1, 2, 0] = np.nan
    ds = xr.Dataset(
        {"v": (("lat", "lon", "lev"), v)},
        coords={"lat": np.arange(40.0), "lon": np.arange(48.0), "lev": [1, 2, 3]},
    )
    ds.to_netcdf(path, engine="h5netcdf")
    return path


def _cfg(tmp_path, out, **kw):
    src = tmp_path / "src.nc"
    if not src.exists():
        _source(src)
    return {
        "source": {"paths": [str(src)], "variables": ["v"]},
        "sample_dims": ["lat", "lon"],
        "arrays": {"x": ["v"]},
        "out": str(tmp_path / out),
        **kw,
    }


def test_statistics_run_while_the_block_is_written(tmp_path, monkeypatch):
    """Each side waits (up to WAIT_S) for the other to have started: run one after the other,
    the first to start times out."""
    writing, counting = threading.Event(), threading.Event()
    seen = {"write saw stats": [], "stats saw write": []}
    write, part = tasks.write_block_durably, tasks.partial

    def slow_write(*a, **k):
        writing.set()
        seen["write saw stats"].append(counting.wait(WAIT_S))
        return write(*a, **k)

    def slow_partial(arr):
        counting.set()
        seen["stats saw write"].append(writing.wait(WAIT_S))
        return part(arr)

    monkeypatch.setattr(tasks, "write_block_durably", slow_write)
    monkeypatch.setattr(tasks, "partial", slow_partial)
    store = shardload.prepare(_cfg(tmp_path, "a.store"))
    assert len(store) == 40 * 48
    assert seen["stats saw write"] and all(seen["stats saw write"]), seen
    assert all(seen["write saw stats"]), seen


def test_statistics_beside_the_write_equal_those_before_it(tmp_path):
    """``nan: fail`` (statistics before the write; a NaN-free copy) and the default (beside
    it) give the same statistics and values."""
    rng = np.random.default_rng(3)
    clean = tmp_path / "clean.nc"
    xr.Dataset(
        {"v": (("lat", "lon", "lev"), rng.normal(size=(40, 48, 3)).astype("float32"))},
        coords={"lat": np.arange(40.0), "lon": np.arange(48.0), "lev": [1, 2, 3]},
    ).to_netcdf(clean, engine="h5netcdf")
    base = {"source": {"paths": [str(clean)], "variables": ["v"]}, "sample_dims": ["lat", "lon"]}
    base["arrays"] = {"x": ["v"]}
    a = shardload.prepare({**base, "out": str(tmp_path / "a.store"), "nan": "fail"})
    b = shardload.prepare({**base, "out": str(tmp_path / "b.store")})
    for f in ("count", "mean", "std", "min", "max", "nan_count"):
        np.testing.assert_array_equal(
            np.asarray(getattr(a.manifest.stats["x"], f)),
            np.asarray(getattr(b.manifest.stats["x"], f)),
        )
    np.testing.assert_array_equal(a.read("x", 0, len(a)), b.read("x", 0, len(b)))
