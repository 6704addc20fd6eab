"""Rows of a time-major netCDF-4 series, read space-major for a window view, are transposed
straight into the block (:mod:`shardload.prep.sources.transpose`): the same bytes as numpy's
reshape of the transposed slab, with no block-sized copy of it in between (issue 29: the
window view's reads spent about as long transposing as reading)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from shardload.prep.sources import transpose
from shardload.prep.sources.h5_rows import h5_rows
from shardload.prep.sources.transpose import copy_rows, copy_transposed
from shardload.prep.views.rows import read_many, sample_major


def _bits(shape, dtype, seed=0):
    """Random bits of ``dtype`` (NaN payloads included: a copy must keep them as they are)."""
    n = int(np.prod(shape))
    raw = np.random.default_rng(seed).integers(0, 256, size=n * np.dtype(dtype).itemsize)
    return raw.astype("u1").view(dtype).reshape(shape)


@pytest.mark.parametrize(
    ("shape", "axes", "dtype"),
    [
        ((40, 3, 5, 4), (1, 2, 0, 3), "f4"),  # (time, lat, lon, lev) read (lat, lon, time, lev)
        ((40, 3, 5), (1, 2, 0), "f4"),  # one feature per step
        ((7, 6, 40, 2), (2, 0, 1, 3), "u2"),
        ((33, 4, 3), (2, 1, 0), "f8"),
        ((5, 6), (0, 1), "i1"),  # no transpose
    ],
)
def test_copy_transposed_is_the_same_bits_as_numpy(shape, axes, dtype):
    src = _bits(shape, dtype).transpose(axes)
    dst = np.empty(src.shape, dtype)
    copy_transposed(dst, src)
    assert dst.tobytes() == np.ascontiguousarray(src).tobytes()


@pytest.mark.parametrize("lo, hi", [(0, 15), (2, 13), (5, 10), (6, 8), (3, 5), (0, 1), (14, 15)])
def test_copy_rows_equals_the_reshape_of_the_view(lo, hi):
    """Rows ``[lo, hi)`` of the first two axes of a transposed slab (3 x 5 space points, each
    a series of 40 steps of 4 levels): whole rows of the first axis, a head, a tail, both."""
    src = _bits((40, 3, 5, 4), "f4", seed=1).transpose(1, 2, 0, 3)
    want = src.reshape(-1, 40, 4)[lo:hi]
    dst = np.empty(want.shape, "f4")
    copy_rows(dst, src, lo, hi, 2)
    assert dst.tobytes() == want.tobytes()
    deep = _bits((20, 2, 3, 4, 2), "u2", seed=2).transpose(1, 2, 3, 0, 4)  # 3 sample axes
    lo, hi = lo * 24 // 15, max(hi * 24 // 15, lo * 24 // 15 + 1)  # of its 24 rows
    want = deep.reshape(-1, 20, 2)[lo:hi]
    dst = np.empty(want.shape, "u2")
    copy_rows(dst, deep, lo, hi, 3)
    assert dst.tobytes() == want.tobytes()


def _series(path, shape=(240, 8, 16, 4)):
    v = np.random.default_rng(3).normal(size=shape).astype("f4")
    xr.Dataset({"v": (("time", "lat", "lon", "lev"), v)}).to_netcdf(path, engine="h5netcdf")
    return xr.open_dataset(path, engine="h5netcdf", chunks={})


def _footprint(a):
    """Bytes between the first and the last byte of ``a`` in memory."""
    return sum((n - 1) * abs(st) for n, st in zip(a.shape, a.strides, strict=True)) + a.itemsize


def test_series_rows_are_transposed_once_in_cache_sized_copies(tmp_path, monkeypatch):
    """Blocks of space points of a contiguous (time, lat, lon, lev) variable, read as rows
    (lat, lon): the bytes the lazy path gives; the variable's bytes are transposed into rows
    once for every block (the first read, by copies that each span at most ``BLOCK`` steps of
    it), each block's rows then a read-only slice of them (before: every block transposed its
    own rows into a new array, 223 rows of 128 here for 128 rows of bytes)."""
    ds = _series(tmp_path / "s.nc")
    rows = h5_rows(str(tmp_path / "s.nc"), ds, ["lat", "lon"])
    assert rows is not None and rows.names == ("v",)
    copies = []
    real = np.copyto

    class Numpy:
        def __getattr__(self, name):
            return getattr(np, name)

        def copyto(self, dst, src):
            copies.append((dst.nbytes, _footprint(src)))
            real(dst, src)

    monkeypatch.setattr(transpose, "np", Numpy())
    n, plane = 8 * 16, 8 * 16 * 4 * 4  # space points, bytes of one step of the series
    for start, stop in [(0, n), (20, 77), (16, 48), (3, 9)]:
        want = read_many([sample_major(ds["v"], ["lat", "lon"])], ["lat", "lon"], start, stop)[0]
        got = rows.read_rows(["v"], start, stop)["v"]
        assert got.tobytes() == want.tobytes(), (start, stop)
        assert not got.flags.writeable  # a slice of the rows the reads share
    assert sum(b for b, _ in copies) == ds["v"].nbytes  # every byte transposed once
    assert max(f for _, f in copies) <= transpose.BLOCK * plane


def test_large_read_of_many_chunks_is_copied_into_its_rows_by_several_threads(monkeypatch):
    """A read of many chunks split along the features (a GRIB file's messages, one per level)
    is copied into its rows stripe by stripe by a few threads once it is large (the other
    write tasks wait for that read): every stripe written once, the same bytes as the read."""
    import os
    import threading

    import dask.array as da

    from shardload.prep.views import rows as rows_module

    monkeypatch.setattr(rows_module, "STRIPE_THREADS_BYTES", 1, raising=False)  # any read
    monkeypatch.setattr(rows_module, "STRIPE_BYTES", 1024)  # many stripes
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    n, k = 5000, 6
    values = _bits((n, k), "f4", seed=3)
    lazy = xr.DataArray(da.from_array(values, chunks=(n, 1)), dims=("values", "level"))
    writers: dict[str, int] = {}

    class Recording(np.ndarray):
        def __setitem__(self, key, value):
            name = threading.current_thread().name
            writers[name] = writers.get(name, 0) + 1
            super().__setitem__(key, value)

    dest = np.empty((n, k), "f4").view(Recording)
    (got,) = read_many([lazy], ["values"], 0, n, out=[dest])
    assert np.asarray(got).tobytes() == values.tobytes()
    here = threading.current_thread().name
    assert len(writers) == 2 and here in writers  # the reading thread and one more
    assert all(w == here or w.startswith("shardload-stripes") for w in writers)
    assert sum(writers.values()) == -(-n // (1024 // (k * 4))) * k  # each stripe of each chunk once
