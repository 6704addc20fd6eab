"""The window view's series (stored once, the default) of a local netCDF-4/HDF5 file are read
with h5py (:class:`~shardload.prep.sources.h5_rows.H5Rows`), not through xarray and dask per
block (issue 29 item 2: 1.1 s of reads for a 70.8 MB series that xarray reads in 0.02 s), and
the store is the one the lazy path writes."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.prep.sources import open as source_open
from shardload.prep.views import window_series


def _series(path, *, lev_first=False, packed=False):
    rng = np.random.default_rng(5)
    v = rng.normal(size=(30, 4, 5, 3)).astype("float32")
    dims = ("time", "lat", "lon", "lev")
    data = {
        "v0": (dims, v),
        "v1": (dims, (v * 2 + 1).astype("float32")),
        "v2": (("time", "lat", "lon"), v[..., 0] - 3),  # no lev: a feature of its own
    }
    if lev_first:  # lev before time in storage: rows in storage order are not (time, lev)
        data["v1"] = (("lat", "lon", "lev", "time"), np.moveaxis(data["v1"][1], 0, -1))
    ds = xr.Dataset(
        data,
        coords={"time": np.arange(30), "lat": np.arange(4.0), "lon": np.arange(5.0)},
    )
    enc = {"v0": {"dtype": "int16", "scale_factor": 0.001, "_FillValue": -999}} if packed else {}
    ds.to_netcdf(path, engine="h5netcdf", encoding=enc)
    return path


def _cfg(src, out):
    return {
        "source": {"paths": [str(src)], "variables": ["v0", "v1", "v2"]},
        "sample_dims": ["lat", "lon"],
        "arrays": {"x": ["v0", "v1", "v2"]},
        "view": {"name": "window", "lookback": 4, "horizon": 1, "targets": {"y": ["v0"]}},
        "target_chunk_bytes": 2048,  # several blocks
        "out": str(out),
    }


def test_window_series_of_a_netcdf4_file_are_read_without_dask(tmp_path, monkeypatch):
    src = _series(tmp_path / "s.nc")

    def no_dask(*a, **k):
        raise AssertionError("the series were read through xarray and dask")

    monkeypatch.setattr(window_series, "read_many", no_dask)
    store = shardload.prepare(_cfg(src, tmp_path / "a.store"))
    assert len(store) > 0


@pytest.mark.parametrize(
    ("lev_first", "packed"), [(False, False), (True, False), (False, True)], ids=str
)
def test_window_series_read_with_h5py_equal_the_lazy_path(tmp_path, monkeypatch, lev_first, packed):
    """Bit for bit, against a prepare whose source has no h5py reader: plain variables; one
    stored with ``lev`` before ``time`` (read lazily: its storage rows are not the series
    rows); one packed (decoded by xarray, lazily)."""
    src = _series(tmp_path / "s.nc", lev_first=lev_first, packed=packed)
    fast = shardload.prepare(_cfg(src, tmp_path / "fast.store"))
    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)
    lazy = shardload.prepare(_cfg(src, tmp_path / "lazy.store"))
    assert len(fast) == len(lazy)
    for name in ("x", "y"):
        np.testing.assert_array_equal(fast.read(name, 0, len(fast)), lazy.read(name, 0, len(lazy)))
        for f in ("mean", "std", "min", "max", "nan_count"):
            np.testing.assert_array_equal(
                getattr(fast.manifest.stats[name], f), getattr(lazy.manifest.stats[name], f)
            )


def test_a_small_contiguous_series_is_read_in_place_not_a_slab_per_block(tmp_path, monkeypatch):
    """Each block of space points of a time-major series needs a run of every step; a
    contiguous variable is mapped once (:mod:`~shardload.prep.sources.mapped`), each block cut
    from the map: no byte copied out of the file before its transpose (``preadv``), no HDF5
    slab read (before: one strided slab per block and variable, rows at lat boundaries read
    twice; then one ``preadv`` of each whole variable, then its transpose)."""
    from shardload.prep.sources import h5_rows
    from shardload.prep.sources.h5_rows import H5Rows

    src = _series(tmp_path / "s.nc")
    with xr.open_dataset(src) as ds:
        var_bytes = sum(ds[v].nbytes for v in ("v0", "v1", "v2"))
    got = {"bytes": 0, "slabs": 0, "mapped": 0}
    blocks = []
    pread, region, read_rows = H5Rows._pread, H5Rows._read_region, H5Rows.read_rows
    mapped = h5_rows.map_contiguous

    def counting_rows(self, names, start, stop, **kw):
        blocks.append((start, stop))
        return read_rows(self, names, start, stop, **kw)

    def counting_pread(self, view, offset, var):
        got["bytes"] += len(view)
        return pread(self, view, offset, var)

    def counting_region(self, dset, r):
        got["slabs"] += 1
        return region(self, dset, r)

    def counting_map(*a, **k):
        arr = mapped(*a, **k)
        got["mapped"] += arr.nbytes
        return arr

    monkeypatch.setattr(H5Rows, "_pread", counting_pread)
    monkeypatch.setattr(H5Rows, "_read_region", counting_region)
    monkeypatch.setattr(H5Rows, "read_rows", counting_rows)
    monkeypatch.setattr(h5_rows, "map_contiguous", counting_map)
    shardload.prepare(_cfg(src, tmp_path / "a.store"))
    assert len(blocks) > 2  # several blocks, some starting inside a lat row
    assert got == {"bytes": 0, "slabs": 0, "mapped": var_bytes}


def test_a_small_contiguous_series_is_transposed_once_per_variable_not_per_block(
    tmp_path, monkeypatch
):
    """A window prepare of a time-major contiguous series transposes each variable into its
    space-major rows once (one ``copy_rows`` of all its bytes), every block's rows a slice of
    them (before: one ``copy_rows`` per block and variable, each into a new array; the values
    are compared with the lazy path's by the tests above)."""
    from shardload.prep.sources import h5_rows

    src = _series(tmp_path / "s.nc")
    with xr.open_dataset(src) as ds:
        sizes = sorted(ds[v].nbytes for v in ("v0", "v1", "v2"))
    copies = []
    real = h5_rows.copy_rows

    def counting(dst, src_, lo, hi, lead):
        copies.append(dst.nbytes)
        return real(dst, src_, lo, hi, lead)

    monkeypatch.setattr(h5_rows, "copy_rows", counting)
    store = shardload.prepare(_cfg(src, tmp_path / "a.store"))
    assert store.manifest.options["blocks"][1:-1]  # several write blocks
    assert sorted(copies) == sizes  # one copy of each variable, all its bytes
