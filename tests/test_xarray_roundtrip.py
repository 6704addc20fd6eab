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
    from shardload.prep.coords import SampleCoords, write_zarr_metadata

    store = _prepare(tmp_path, "zarr")
    info = store.manifest.arrays["x"]
    spec = ArraySpec("x", tuple(info.shape), np.dtype(info.dtype), info.features)
    stacked = _source().stack(sample=["number", "time"])
    coords = SampleCoords({"number": stacked["number"].values, "time": stacked["time"].values})
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


def test_sample_coordinates_are_stored_once_as_axes_and_in_few_zarr_files(
    tmp_path: Path,
) -> None:
    """``_coords.npz`` holds each sample dim's 1-D axis (not one value per sample, 2026-11-27);
    a Zarr store's coordinate arrays are a few large chunks, not one file per array chunk."""
    store = _prepare(tmp_path, "zarr")  # 30 samples in chunks of 8 rows
    with np.load(Path(store.root) / "_coords.npz") as npz:
        assert {k: npz[k].shape for k in npz.files} == {"number": (3,), "time": (10,)}
    grid = store.manifest.options["sample_coords_grid"]
    assert grid == {"shape": [3, 10], "axes": {"number": 0, "time": 1}}
    for name in ("number", "time"):  # zarr.json and one chunk file: not one per 8 rows
        files = [p for p in (Path(store.root) / name).rglob("*") if p.is_file()]
        assert len(files) == 2, files
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(store.to_xarray(), store)


def test_a_store_with_one_coordinate_value_per_sample_still_reads(tmp_path: Path) -> None:
    """Stores written before 2026-11-27 hold one value per sample in ``_coords.npz`` and no
    ``sample_coords_grid``: to_xarray reads them as they are."""
    import json

    store = _prepare(tmp_path, "npy")
    stacked = _source().stack(sample=["number", "time"])
    np.savez(
        Path(store.root) / "_coords.npz",
        number=stacked["number"].values,
        time=stacked["time"].values,
    )
    path = Path(store.root) / "shardload.json"
    doc = json.loads(path.read_text())
    del doc["options"]["sample_coords_grid"]
    path.write_text(json.dumps(doc))
    old = shardload.open_store(store.root)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check(old.to_xarray(), old)


def test_a_coordinate_axis_that_does_not_fit_the_grid_is_a_clear_error(tmp_path: Path) -> None:
    from shardload.errors import StoreError

    store = _prepare(tmp_path, "npy")
    np.savez(Path(store.root) / "_coords.npz", number=np.arange(4), time=np.arange(10))
    with pytest.raises(StoreError, match=r"_coords.npz of .*'number'.*\(4,\).*\(3, 10\)"):
        shardload.open_store(store.root).to_xarray()


def test_grid_coordinates_written_chunk_by_chunk_without_zarr_python(tmp_path, monkeypatch):
    """The sample coordinates of a grid (``lat``/``lon`` per grid point) are expanded and
    written a chunk at a time by prepare, not through zarr-python (0.4-0.9 s of a 2 s prepare
    for a 9.3 M-point grid, issue 29), and ``xr.open_zarr`` gives the source's values; the
    time axis too, CF-encoded as xarray encodes it (2026-11-28)."""
    import zarr

    import shardload.prep.coords as coords

    monkeypatch.setattr(coords, "COORD_CHUNK_BYTES", 64)  # several chunks per coordinate
    rng = np.random.default_rng(1)
    ds = xr.Dataset(
        {"t": (("time", "lat", "lon"), rng.standard_normal((2, 9, 7)).astype("f4"))},
        coords={
            "time": pd.date_range("2020-01-01", periods=2),
            "lat": np.linspace(-80, 80, 9).astype("f4"),
            "lon": np.arange(7, dtype="i8") * 50,
        },
    )
    setitem = zarr.Array.__setitem__

    def refuse(self, key, value):
        if self.path in ("lat", "lon", "time"):
            raise AssertionError(f"coordinate {self.path} written through zarr-python")
        setitem(self, key, value)

    monkeypatch.setattr(zarr.Array, "__setitem__", refuse)
    out = tmp_path / "s"
    cfg = {"sample_dims": ["time", "lat", "lon"], "arrays": {"x": ["t"]}, "out": str(out)}
    cfg["chunk_rows"] = 10
    shardload.prepare(cfg, dataset=ds)
    stacked = ds.stack(sample=["time", "lat", "lon"])
    assert len(list((out / "lat" / "c").iterdir())) > 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_zarr(out) as got:
            for name in ("lat", "lon"):
                assert got[name].dtype == stacked[name].dtype
                np.testing.assert_array_equal(got[name].values, stacked[name].values)
            assert (got["time"].values == stacked["time"].values).all()
            np.testing.assert_array_equal(got["x"].values[:, 0], stacked["t"].values)


def test_a_first_publish_opens_no_zarr_group_to_delete_coordinates(
    tmp_path: Path, monkeypatch
) -> None:
    """The coordinates of a first publish do not exist yet: no ``zarr.open_group`` to look for
    them and nothing deleted (a resumed publish still deletes and rewrites them, the test
    above); the group is opened once, to create the numeric ones."""
    import shutil
    import sys

    import zarr

    from shardload.manifest.core import ArraySpec
    from shardload.prep.coords import SampleCoords, write_zarr_metadata

    store = _prepare(tmp_path, "zarr")
    for name in ("number", "time", "x_feature"):  # as before the first publish wrote them
        shutil.rmtree(Path(store.root) / name)
    info = store.manifest.arrays["x"]
    spec = ArraySpec("x", tuple(info.shape), np.dtype(info.dtype), info.features)
    stacked = _source().stack(sample=["number", "time"])
    coords = SampleCoords({"number": stacked["number"].values, "time": stacked["time"].values})
    opened = []  # by prep/coords.py itself (xarray's to_zarr opens the group it writes to)
    real = zarr.open_group

    def open_group(*a, **k):
        opened.append(sys._getframe(1).f_globals["__name__"])
        return real(*a, **k)

    deleted: list[str] = []
    monkeypatch.setattr(zarr, "open_group", open_group)
    monkeypatch.setattr(zarr.Group, "__delitem__", lambda self, key: deleted.append(key))
    write_zarr_metadata(store.root, {"x": spec}, coords, chunk_rows=8)
    monkeypatch.undo()
    assert opened.count("shardload.prep.coords") <= 1 and not deleted, (opened, deleted)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with xr.open_zarr(store.root) as ds:
            _check(ds, store)


@pytest.mark.parametrize("dtype", ["f2", "f4", "f8", "i1", "i2", "i4", "i8", "u1", "u2", "u8"])
def test_coordinates_have_the_zarr_metadata_xarray_writes(tmp_path: Path, dtype: str) -> None:
    """Numeric sample coordinates and feature names get their Zarr metadata from
    ``prep/coords.py`` itself (no dask graph): byte for byte what xarray's
    ``to_zarr(compute=False)`` of dask arrays writes, with date, string and boolean
    coordinates beside them: every ``zarr.json``, the group's
    attributes and consolidated metadata included; the values read back."""
    import warnings

    da = pytest.importorskip("dask.array")
    import zarr
    from zarr.codecs import BloscCodec

    from shardload.manifest.core import ArraySpec
    from shardload.prep.coords import SampleCoords, write_zarr_metadata

    shape = (3, 4)
    axes = {
        "lev": np.arange(3).astype(dtype),
        "time": pd.date_range("2020-01-01", periods=3).values,
        "label": np.array(["a", "bb", "ccc", "d"]),
        "flag": np.array([True, False, True, False]),
        "x_a": np.linspace(0, 1, 4).astype(dtype),
    }
    coords = SampleCoords(axes, shape, {"lev": 0, "time": 0, "label": 1, "flag": 1, "x_a": 1})
    specs = {
        "x": ArraySpec("x", (12, 3), np.dtype("f4"), ("t", "u[1]", "vvvv")),
        "y": ArraySpec("y", (12, 1), np.dtype("f4"), ("y",)),
    }
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    for root in (ours, ref):
        zarr.open_group(str(root), mode="w", zarr_format=3)
    write_zarr_metadata(ours, specs, coords, chunk_rows=5)
    # the reference: xarray writes every array's metadata, dask placeholders for the lazy ones
    lz4 = {"compressors": (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)}
    variables, encoding = {}, {}
    for name in axes:
        full = coords.full(name)
        data = full if full.dtype.kind not in "fiu" else da.empty(12, chunks=12, dtype=full.dtype)
        variables[name] = xr.Variable(("sample",), data)
        encoding[name] = {"chunks": (12,), **lz4}
    for name, width in (("x", 4), ("y", 1)):
        dim = f"{name}_feature"
        variables[dim] = xr.Variable(
            (dim,), da.empty(len(specs[name].features), dtype=f"<U{width}")
        )
        encoding[dim] = {"chunks": (len(specs[name].features),)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xr.Dataset(coords=xr.Coordinates(variables, indexes={})).to_zarr(
            str(ref), mode="a", consolidated=False, zarr_format=3, encoding=encoding, compute=False
        )
        zarr.consolidate_metadata(str(ref), zarr_format=3)
    metas = sorted(p.relative_to(ref) for p in ref.rglob("zarr.json"))
    assert metas == sorted(p.relative_to(ours) for p in ours.rglob("zarr.json"))
    assert len(metas) == 1 + len(axes) + 2
    for rel in metas:
        assert (ours / rel).read_bytes() == (ref / rel).read_bytes(), rel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_zarr(ours) as ds:
            for name in axes:
                np.testing.assert_array_equal(ds[name].values, coords.full(name))
            assert list(ds["x_feature"].values) == ["t", "u[1]", "vvvv"]


def _dates(start: str, unit: str, step: int, n: int = 7, nat: tuple[int, ...] = ()) -> np.ndarray:
    out = np.datetime64(start, unit) + np.arange(n) * step
    out[list(nat)] = np.datetime64("NaT")
    return out


#: sample coordinate axes of several kinds, resolutions and start dates (NaT, before 1582)
_AXES = {
    "hours-ns": _dates("2020-01-01T00", "ns", 6 * 3600 * 10**9),
    "minutes-s": _dates("1979-03-01T12:00", "s", 90 * 60),
    "days-D": _dates("1900-02-03", "D", 1),
    "hours-h": _dates("2020-01-01T05", "h", 3),
    "ms": _dates("2020-01-01T05:00:00.250", "ms", 1500),
    "julian": _dates("1500-01-01", "s", 86400),
    "nat": _dates("2020-01-01", "ns", 6 * 3600 * 10**9, nat=(0, 4)),
    "label": np.array(["a", "bb", "ccc", "d", "", "ff", "é"]),
    "flag": np.array([True, False, True, False, False, True, True]),
    "z": np.arange(7) * (1 + 2j),
}


@pytest.mark.parametrize("axis", [0, 1], ids=["slowest", "fastest"])
def test_date_string_and_boolean_coordinates_are_the_bytes_xarray_writes(
    tmp_path: Path, monkeypatch, axis: int
) -> None:
    """Dates (CF-encoded: units, calendar, int64, as xarray's ``to_zarr`` encodes them),
    strings, booleans and complex numbers along the samples are written by
    ``prep/coords.py`` without ``to_zarr`` (whose ``xarray.Variable`` imports ``dask.array``):
    every file the same bytes as xarray's ``to_zarr`` of the expanded values writes, metadata,
    chunks and consolidated metadata; ``xr.open_zarr`` decodes them back."""
    import zarr
    from zarr.codecs import BloscCodec

    import shardload.prep.coords as mod
    from shardload.prep.coords import SampleCoords, coord_chunk_rows, write_zarr_metadata

    monkeypatch.setattr(mod, "COORD_CHUNK_BYTES", 64)  # several chunks per coordinate
    shape = (7, 2) if axis == 0 else (2, 7)
    coords = SampleCoords(_AXES, shape, dict.fromkeys(_AXES, axis))
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    for root in (ours, ref):
        zarr.open_group(str(root), mode="w", zarr_format=3)

    def refuse(*a, **k):
        raise AssertionError("written through xarray's to_zarr")

    with monkeypatch.context() as m:
        m.setattr(xr.Dataset, "to_zarr", refuse)
        write_zarr_metadata(ours, {}, coords, chunk_rows=2)
    lz4 = (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)
    variables, encoding = {}, {}
    for name in _AXES:
        full = coords.full(name)
        variables[name] = xr.Variable(("sample",), full)
        rows = coord_chunk_rows(len(full), full.dtype.itemsize, 2)
        encoding[name] = {"chunks": (rows,), "compressors": lz4}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xr.Dataset(coords=xr.Coordinates(variables, indexes={})).to_zarr(
            str(ref), mode="a", consolidated=False, zarr_format=3, encoding=encoding
        )
        zarr.consolidate_metadata(str(ref), zarr_format=3)
    files = sorted(p.relative_to(ref) for p in ref.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ours) for p in ours.rglob("*") if p.is_file())
    assert len([f for f in files if f.parts[0] == "hours-ns"]) > 2  # several chunks
    for rel in files:
        assert (ours / rel).read_bytes() == (ref / rel).read_bytes(), rel
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with xr.open_zarr(ours) as got, xr.open_zarr(ref) as want:
            for name in _AXES:
                np.testing.assert_array_equal(got[name].values, want[name].values)
                np.testing.assert_array_equal(got[name].values, coords.full(name))
