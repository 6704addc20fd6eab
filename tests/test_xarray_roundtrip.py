"""xarray round trip: ``Store.to_xarray()`` and ``xr.open_zarr`` of a store (local or served)
give named dims and the sample coordinates, with no warnings."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import shardload


def _source() -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {
            "t": (("number", "time", "z"), rng.standard_normal((3, 10, 4)).astype("f4")),
            "q": (("number", "time"), rng.standard_normal((3, 10)).astype("f4")),
        },
        coords={
            "number": [0, 1, 2],
            "time": pd.date_range("2020-01-01", periods=10, freq="6h"),
            "z": [1000, 850, 500, 250],
        },
    )


def _prepare(tmp_path: Path, fmt: str) -> shardload.Store:
    out = tmp_path / "stores" / f"s-{fmt}"
    cfg = {
        "sample_dims": ["number", "time"],
        "arrays": {"x": ["t", "q"]},
        "chunk_rows": 8,
        "format": fmt,
        "out": str(out),
    }
    shardload.prepare(cfg, dataset=_source())
    return shardload.open_store(out)


def _check(ds: xr.Dataset, store: shardload.Store) -> None:
    stacked = _source().stack(sample=["number", "time"])
    assert ds["x"].dims == ("sample", "x_feature")
    np.testing.assert_array_equal(ds["number"].values, stacked["number"].values)
    np.testing.assert_array_equal(
        ds["time"].values.astype("datetime64[s]"), stacked["time"].values.astype("datetime64[s]")
    )
    assert list(ds["x_feature"].values) == list(store.manifest.arrays["x"].features)
    np.testing.assert_array_equal(ds["x"].values, store.read("x"))
    # the source's grid back: the samples unstacked by their coordinates
    grid = ds.set_index(sample=["number", "time"]).unstack("sample")
    t = grid["x"].sel(x_feature="t[850]").transpose("number", "time")
    np.testing.assert_array_equal(t.values, _source()["t"].sel(z=850).values)


@pytest.mark.parametrize("fmt", ["zarr", "npy", "hdf5"])
def test_to_xarray_keeps_the_sample_coordinates(tmp_path: Path, fmt: str) -> None:
    store = _prepare(tmp_path, fmt)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ds = store.to_xarray()
    _check(ds, store)


def test_open_zarr_of_a_store_local_and_served_has_named_dims_and_no_warnings(
    tmp_path: Path,
) -> None:
    from shardload.move.serve import serving

    store = _prepare(tmp_path, "zarr")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_zarr(store.root) as ds:
            _check(ds, store)
    with serving(tmp_path / "stores", port=0) as url, warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_zarr(f"{url.rstrip('/')}/s-zarr") as ds:
            _check(ds, store)


def test_zarr_metadata_written_again_when_a_publish_resumes(tmp_path: Path) -> None:
    """A run killed after the coordinates were written and before the manifest publishes them
    writes them again when it resumes."""
    from shardload.manifest.core import ArraySpec
    from shardload.prep.coords import write_zarr_metadata

    store = _prepare(tmp_path, "zarr")
    info = store.manifest.arrays["x"]
    spec = ArraySpec("x", tuple(info.shape), np.dtype(info.dtype), info.features)
    stacked = _source().stack(sample=["number", "time"])
    coords = {"number": stacked["number"].values, "time": stacked["time"].values}
    write_zarr_metadata(store.root, {"x": spec}, coords, chunk_rows=8)  # the store has them
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_zarr(store.root) as ds:
            _check(ds, store)


def test_an_array_named_as_a_sample_dim_keeps_its_name(tmp_path: Path) -> None:
    out = tmp_path / "s"
    cfg = {"sample_dims": ["number", "time"], "arrays": {"time": ["q"]}, "out": str(out)}
    shardload.prepare(cfg, dataset=_source())
    store = shardload.open_store(out)
    ds = store.to_xarray()
    assert list(ds.data_vars) == ["time"] and "number" in ds.coords
    np.testing.assert_array_equal(ds["time"].values, store.read("time"))
    with xr.open_zarr(out) as z:
        np.testing.assert_array_equal(z["time"].values, store.read("time"))
