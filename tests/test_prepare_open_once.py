"""A netCDF-4 variable whose row reader serves every read: prepare opens the source once (the
plan's view is the tasks' view; its dask chunks are never read). Plain or packed (int16 with
scale_factor and _FillValue: the row reader decodes it as xarray does)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.prep import driver, tasks
from shardload.prep.sources import open as source_open


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "packed"])
def test_netcdf4_source_opened_once(tmp_path, monkeypatch, packed):
    rng = np.random.default_rng(1)
    t = rng.normal(size=(64, 96)).astype("f4")
    t[::7, ::5] = np.nan  # packed: written as the _FillValue
    ds = xr.Dataset(
        {"t": (("lat", "lon"), t)},
        coords={"lat": np.linspace(-80, 80, 64), "lon": np.linspace(0, 357, 96)},
    )
    src = tmp_path / "chunked.nc"
    enc: dict = {"chunksizes": (16, 16)}
    if packed:
        enc |= {"dtype": "int16", "scale_factor": np.float32(0.01), "_FillValue": -999}
    ds.to_netcdf(src, engine="h5netcdf", encoding={"t": enc})
    if packed:
        t = xr.open_dataset(src)["t"].values  # the values decoded by xarray
        assert t.dtype == np.float32 and np.isnan(t).sum() == 10 * 20
    opens: list[object] = []
    real = source_open.open_source

    def spy(*a, **k):
        opens.append(k)
        return real(*a, **k)

    monkeypatch.setattr(source_open, "open_source", spy)
    built: list[object] = []
    real_build = tasks.build_source

    def build_spy(*a, **k):
        view, src_ds = real_build(*a, **k)
        built.append(view)
        return view, src_ds

    monkeypatch.setattr(tasks, "build_source", build_spy)
    monkeypatch.setattr(driver, "build_source", build_spy)
    store = shardload.prepare(
        {
            "source": {"paths": [str(src)], "variables": ["t"]},
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": ["t"]},
            "nan": "ignore",
            "out": str(tmp_path / "store"),
        }
    )
    assert built and all(getattr(v, "rows", None) is not None for v in built)  # H5Rows
    assert len(opens) == 1, opens
    assert store.read("x").reshape(-1).tobytes() == t.reshape(-1).tobytes()
