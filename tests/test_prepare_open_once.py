"""A netCDF-4 variable whose row reader serves every read: prepare opens the source once,
without dask chunks (the plan's view is the tasks' view, xarray's lazily indexed arrays only
describe the source). Plain or packed (int16 with scale_factor and _FillValue: the row reader
decodes it as xarray does). A variable it does not serve: the source is opened again in dask
chunks, as before."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.prep import driver, tasks
from shardload.prep.config import load_config
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
    assert all(v.sample_source.chunks is None for v in built)  # no dask array
    assert store.read("x").reshape(-1).tobytes() == t.reshape(-1).tobytes()


def test_a_variable_h5py_does_not_serve_is_read_through_dask_as_before(tmp_path, monkeypatch):
    """A boolean variable (stored as int8, decoded by xarray): the view is built again over the
    source opened in dask chunks; the rows are xarray's values."""
    rng = np.random.default_rng(2)
    a = rng.normal(size=(30, 4))
    flag = np.arange(30) % 3 == 0
    xr.Dataset(
        {"a": (("n", "f"), a), "flag": (("n",), flag)}, coords={"n": np.arange(30)}
    ).to_netcdf(tmp_path / "src.nc", engine="h5netcdf")
    views: list[Any] = []
    real_build = tasks.build_source

    def build_spy(*a, **k):
        view, src_ds = real_build(*a, **k)
        views.append(view)
        return view, src_ds

    monkeypatch.setattr(driver, "build_source", build_spy)
    store = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "src.nc")]},
            "sample_dims": ["n"],
            "arrays": {"x": ["a", "flag"]},
            "out": str(tmp_path / "store"),
        }
    )
    assert len(views) == 1 and not views[0].read_by_rows
    assert views[0].sample_source.chunks is not None  # dask, as before
    np.testing.assert_array_equal(store.read("x"), np.column_stack([a, flag]))


def test_an_xarray_without_create_default_indexes_still_opens_without_dask(tmp_path, monkeypatch):
    """xarray before 2025.7 has no ``create_default_indexes``: the source is opened without
    dask chunks, with its indexes, and prepared the same."""
    monkeypatch.setattr(source_open, "_opens_without_indexes", lambda: False)
    src = tmp_path / "src.nc"
    t = np.arange(12 * 8, dtype="f4").reshape(12, 8)
    xr.Dataset({"t": (("lat", "lon"), t)}, coords={"lat": np.arange(12.0)}).to_netcdf(
        src, engine="h5netcdf", encoding={"t": {"chunksizes": (4, 4)}}
    )
    cfg = {"source": {"paths": [str(src)]}, "sample_dims": ["lat", "lon"], "arrays": {"x": ["t"]}}
    view, ds = tasks.build_source(load_config(cfg | {"out": str(tmp_path / "unused")}))
    assert list(ds.indexes) == ["lat"] and view.sample_source.chunks is None
    store = shardload.prepare(cfg | {"out": str(tmp_path / "store")})
    np.testing.assert_array_equal(store.read("x").reshape(12, 8), t)
