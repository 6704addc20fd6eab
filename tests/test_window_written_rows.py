"""Written windows (``at_load: false``) of a local netCDF-4/HDF5 file read each block's time span
with h5py (:class:`~shardload.prep.sources.h5_rows.H5Rows`, rows over ``(time, *sample_dims)``),
not through xarray and dask per block (issue 29), and the store is bit for bit the one the lazy
path writes. Packed variables stay on the lazy path, which decodes them."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.prep.sources import open as source_open
from shardload.prep.views import window

T = 30


def _series(path, *, lev_first=False, packed=False, time_dim="time", gzip=False):
    rng = np.random.default_rng(5)
    v = rng.normal(size=(T, 4, 5, 3)).astype("float32")
    v2 = (v[..., 0] - 3).astype("float32")
    v2[3, 1, 2] = v2[17, 0, 0] = np.nan  # missing values: NaN (xarray's _FillValue for floats)
    dims = (time_dim, "lat", "lon", "lev")
    data = {
        "v0": (dims, v),
        "v1": (dims, (v * 2 + 1).astype("float32")),
        "v2": ((time_dim, "lat", "lon"), v2),  # no lev: a feature of its own
        "v3": ((time_dim, "lat", "lon"), (v[..., 1] * 100).astype("int32")),
    }
    if lev_first:  # lev before time in storage: rows in storage order are not (time, space)
        data["v1"] = (("lat", "lon", "lev", time_dim), np.moveaxis(data["v1"][1], 0, -1))
    ds = xr.Dataset(
        data,
        coords={time_dim: np.arange(T), "lat": np.arange(4.0), "lon": np.arange(5.0)},
    )
    enc = {"v0": {"dtype": "int16", "scale_factor": 0.001, "_FillValue": -999}} if packed else {}
    if gzip:  # time chunks of 7 steps: a block's span crosses chunks (decoded once, cached)
        enc = {
            k: {**enc.get(k, {}), "zlib": True, "chunksizes": (7, *ds[k].shape[1:])} for k in data
        }
    ds.to_netcdf(path, engine="h5netcdf", encoding=enc)
    return path


def _cfg(src, out, *, view=None, sample_dims=("lat", "lon")):
    view = view or {"lookback": 4, "horizon": 1, "targets": {"y": ["v0", "v2"]}}
    return {
        "source": {"paths": [str(src)], "variables": ["v0", "v1", "v2", "v3"]},
        "sample_dims": list(sample_dims),
        "arrays": {"x": ["v0", "v1", "v2", "v3"]},
        "view": {"name": "window", "at_load": False, **view},
        "target_chunk_bytes": 4096,  # several blocks
        "out": str(out),
        "overwrite": True,
    }


def _no_lazy_reads(monkeypatch):
    def lazy(*a, **k):
        raise AssertionError("a window block was read through xarray and dask")

    monkeypatch.setattr(window, "load_values", lazy)


def test_written_windows_of_a_netcdf4_file_are_read_without_dask(tmp_path, monkeypatch):
    src = _series(tmp_path / "s.nc")
    _no_lazy_reads(monkeypatch)
    store = shardload.prepare(_cfg(src, tmp_path / "a.store"))
    assert len(store) == (T - 5 + 1) * 20
    assert store.manifest.arrays["x"].shape == (len(store), 4, 3 + 3 + 1 + 1)


def _assert_same(fast, lazy):
    assert len(fast) == len(lazy)
    assert fast.manifest.arrays.keys() == lazy.manifest.arrays.keys()
    for name in fast.manifest.arrays:
        a, b = fast.read(name, 0, len(fast)), lazy.read(name, 0, len(lazy))
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
        for f in ("mean", "std", "min", "max", "nan_count"):
            np.testing.assert_array_equal(
                getattr(fast.manifest.stats[name], f), getattr(lazy.manifest.stats[name], f)
            )


CASES = {
    "plain": ({}, {}),
    "lev-first": ({"lev_first": True}, {}),
    "packed": ({"packed": True}, {}),
    "gzip-chunks": ({"gzip": True}, {}),
    "stride-3-no-targets": ({}, {"view": {"lookback": 5, "stride": 3}}),
    "stride-2-horizon-3": (
        {},
        {"view": {"lookback": 2, "stride": 2, "horizon": 3, "targets": {"y": ["v1"]}}},
    ),
    "time-dim-step": (
        {"time_dim": "step"},
        {"view": {"time_dim": "step", "lookback": 3, "targets": {"y": ["v3"]}}},
    ),
    "one-sample-dim": ({}, {"sample_dims": ("lon",)}),  # lat becomes a feature dim
}


@pytest.mark.parametrize("case", list(CASES))
def test_written_windows_read_with_h5py_equal_the_lazy_path(tmp_path, monkeypatch, case):
    """Bit for bit (values, dtypes, statistics, NaN counts), against a prepare whose source has
    no h5py reader: plain variables, one stored with ``lev`` before ``time``, one packed (read
    by h5py, decoded as xarray does), gzip chunks, the window's stride / lookback / horizon / time_dim options."""
    source_kw, cfg_kw = CASES[case]
    src = _series(tmp_path / "s.nc", **source_kw)
    lazily, load_values = set(), window.load_values

    def record(da):
        lazily.add(da.name)
        return load_values(da)

    monkeypatch.setattr(window, "load_values", record)
    fast = shardload.prepare(_cfg(src, tmp_path / "fast.store", **cfg_kw))
    assert lazily == set()  # all through h5py
    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)
    lazy = shardload.prepare(_cfg(src, tmp_path / "lazy.store", **cfg_kw))
    _assert_same(fast, lazy)
    assert np.isnan(lazy.read("x", 0, len(lazy))).any()  # the NaN of v2 came through


def test_packed_variables_are_read_by_h5py_and_decoded_as_xarray_does(tmp_path, monkeypatch):
    """A packed variable (scale_factor, add_offset, _FillValue) of written windows is read by
    the row reader, which decodes it as xarray does: the store equals the lazy path's."""
    src = _series(tmp_path / "s.nc", packed=True)
    real = source_open.open_rows
    read: list[str] = []

    class Recording:
        def __init__(self, inner):
            self.inner, self.names = inner, inner.names

        def read_rows(self, names, start, stop, *, out=None):
            read.extend(names)
            return self.inner.read_rows(names, start, stop, out=out)

    def recording(*a, **k):
        inner = real(*a, **k)
        return None if inner is None else Recording(inner)

    monkeypatch.setattr(source_open, "open_rows", recording)
    fast = shardload.prepare(_cfg(src, tmp_path / "fast.store"))
    assert "v0" in read, "the packed variable v0 went through xarray"
    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)
    lazy = shardload.prepare(_cfg(src, tmp_path / "lazy.store"))
    _assert_same(fast, lazy)


def _windows_by_index(view, start, stop):
    """Samples ``[start, stop)`` of a window view by index arithmetic on the whole series (the
    view's definition: sample ``r`` is window ``r // S`` at space point ``r % S``)."""
    out = {}
    r = np.arange(start, stop)
    w, s = r // view.S, r % view.S
    for name, (das, is_target) in view._vars.items():
        parts = []
        for da in das:
            full = np.asarray(da.values).reshape(da.shape[0], view.S, -1)
            t = w * view.stride + view.lookback - 1 + view.horizon
            if is_target:
                parts.append(full[t, s])
            else:
                t = (w * view.stride)[:, None] + np.arange(view.lookback)
                parts.append(full[t, s[:, None]])
        out[name] = np.concatenate(parts, axis=-1).astype(view.specs[name].dtype)
    return out


@pytest.mark.parametrize("dtype", [None, "float32"])
def test_windows_cut_from_a_time_span_equal_index_arithmetic(dtype):
    """Any block (partial windows at both ends) of every lookback / stride / horizon, mixed
    dtypes (an int64 beyond float64's exact range: cast once through the common dtype, as a
    concatenation of the parts would), a variable with time after a space dim."""
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "a": (("time", "lat", "lon", "lev"), rng.normal(size=(T, 3, 4, 2)).astype("f4")),
            "b": (("time", "lat", "lon"), rng.integers(-(2**60), 2**60, size=(T, 3, 4))),
            "c": (("lat", "time", "lon"), rng.normal(size=(3, T, 4))),
        }
    )
    for lookback, stride, horizon, sample_dims in [
        (1, 1, 0, ("lat", "lon")),
        (3, 1, 2, ("lat", "lon")),
        (3, 2, 0, ("lon",)),
        (4, 3, 1, ("lat", "lon")),
    ]:
        view = window.WindowView(
            ds,
            {"x": ["a", "b", "c"]},
            sample_dims=sample_dims,
            lookback=lookback,
            stride=stride,
            horizon=horizon,
            targets={"y": ["b", "a"]},
            dtype=dtype,
        )
        n = view.length
        for start, stop in [(0, n), (0, 0), (5, 6), *rng.integers(0, n, (12, 2)).tolist()]:
            start, stop = min(start, stop), max(start, stop)
            got, want = view.read(start, stop), _windows_by_index(view, start, stop)
            for k, v in want.items():
                assert got[k].dtype == v.dtype and got[k].shape == v.shape
                np.testing.assert_array_equal(got[k], v, err_msg=f"{k} [{start}, {stop})")
