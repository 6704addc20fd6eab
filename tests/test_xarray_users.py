"""What xarray and dask users hold is accepted (issue 13, item 13): ``prepare(config,
dataset=ds)``, an active ``distributed.Client``, an fsspec mapper for ``open_store``, and
``Store.to_xarray()``."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
import xarray as xr
from _stores import make_store

import shardload


@pytest.mark.parametrize(("fmt", "comp"), [("npy", "none"), ("zarr", "lz4"), ("hdf5", "none")])
def test_open_store_accepts_an_fsspec_mapper(tmp_path, fmt, comp):
    store = make_store(tmp_path, fmt=fmt, compression=comp, n=30)
    local = shardload.open_store(fsspec.get_mapper(str(store.root)))
    np.testing.assert_array_equal(local.read("x"), store.read("x"))
    # a non-local filesystem: the store copied into fsspec's memory filesystem
    mem = fsspec.filesystem("memory")
    mem.put(str(store.root), f"/m-{fmt}", recursive=True)
    remote = shardload.open_store(fsspec.get_mapper(f"memory://m-{fmt}"))
    assert not remote.is_local and remote.url == f"memory:///m-{fmt}"
    np.testing.assert_array_equal(remote.read("x", 3, 17), store.read("x", 3, 17))
    assert remote.manifest.stats["x"] == store.manifest.stats["x"]  # feature files: same fs
    mem.rm(f"/m-{fmt}", recursive=True)


def test_to_xarray_is_lazy_with_feature_coordinates(tmp_path):
    store = make_store(tmp_path, fmt="zarr", compression="lz4", n=30, chunk_rows=7)
    ds = store.to_xarray()
    x = ds["x"]
    assert x.dims == ("sample", "x_feature") and x.chunks[0] == (7, 7, 7, 7, 2)
    assert list(ds["x_feature"].values) == list(store.manifest.arrays["x"].features)
    assert x.sel(x_feature="a").dims == ("sample",)
    np.testing.assert_array_equal(x.values, store.read("x"))
    np.testing.assert_array_equal(x[9:20].values, store.read("x", 9, 20))
    np.testing.assert_array_equal(ds["y"].values, store.read("y"))
    assert x.attrs["variables"] == ["a", "b"]
    assert list(store.to_xarray(["y"]).data_vars) == ["y"]


def test_to_xarray_reads_only_the_chunks_it_needs(tmp_path):
    store = make_store(tmp_path, fmt="npy", n=30, chunk_rows=7)
    reads: list[tuple[int, int]] = []
    real = type(store).read

    def counting(self, name, start=0, stop=None):
        reads.append((start, stop))
        return real(self, name, start, stop)

    type(store).read = counting
    try:
        x = store.to_xarray()["x"]
        assert reads == []  # lazy
        x[8:12].load(scheduler="sync")
        assert len(reads) == 1 and 7 <= reads[0][0] <= 8 and 12 <= reads[0][1] <= 14  # chunk 1
    finally:
        type(store).read = real
