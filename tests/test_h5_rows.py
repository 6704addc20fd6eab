"""H5Rows (plain netCDF-4/HDF5 rows read with h5py) equals the lazy xarray path bit for bit,
and prepare uses it: sample axis first or last in storage, compressed or not, CF-encoded
variables decoded as xarray decodes them (more cases: test_cf_decode.py)."""

from __future__ import annotations

import pickle
from pathlib import Path

import h5netcdf
import h5py
import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.prep.config import load_config
from shardload.prep.sources.h5_rows import H5Rows, h5_rows
from shardload.prep.tasks import build
from shardload.prep.views.rows import read_many, sample_major


def write_grid(path: Path, shape=(36, 40, 6), chunks=(9, 10, 2), seed=0) -> np.ndarray:
    """A uint8 grid, gzip chunks, no dimension scales (like the real land-cover file of issue
    13: (2160, 4320, 12) in chunks (135, 270, 2)); the samples are along the last axis."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, 200, size=shape, dtype=np.uint8)
    with h5py.File(path, "w") as f:
        f.create_dataset("lc", data=values, chunks=chunks, compression="gzip")
    return values


def write_rows(path: Path, n=300, chunk=64, seed=0) -> xr.Dataset:
    """float32 rows (sample dim first): chunked plain, contiguous, compressed, with NaNs and an
    unwritten chunk; plus CF-encoded variables that only xarray decodes."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 12)).astype(np.float32)
    x[5, 3] = np.nan
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"row": n, "f": 12, "g": 3}
        f.create_variable("x", ("row", "f"), "f4", chunks=(chunk, 12))[...] = x
        f.create_variable("flat", ("row",), "f8")[...] = np.arange(n) * 0.5  # contiguous
        f.create_variable("z", ("row", "g"), "i2", chunks=(chunk, 3), compression="gzip")[...] = (
            rng.integers(-9, 9, size=(n, 3))
        )
        gap = f.create_variable("gap", ("row", "g"), "f4", chunks=(chunk, 3))
        gap[: chunk * 2] = np.ones((chunk * 2, 3), np.float32)  # later chunks never written
        be = f.create_variable("be", ("g", "row"), ">f4", chunks=(3, chunk))  # row axis last
        be[...] = rng.standard_normal((3, n)).astype(">f4")
        s = f.create_variable("scaled", ("row",), "i2")
        s.attrs.update(scale_factor=0.25, add_offset=1.0)
        s[...] = np.arange(n) % 100
        m = f.create_variable("masked", ("row",), "i4", fillvalue=-1)
        m[: n // 2] = np.arange(n // 2)
    return xr.open_dataset(path, engine="h5netcdf", chunks={})


def _check(rows: H5Rows, ds: xr.Dataset, sample_dims, start: int, stop: int) -> None:
    das = [sample_major(ds[n], sample_dims) for n in rows.names]
    want = read_many(das, sample_dims, start, stop)
    got = rows.read_rows(list(rows.names), start, stop)
    for name, w in zip(rows.names, want, strict=True):
        g = got[name]
        assert g.shape == w.shape and g.dtype == w.dtype, name
        assert g.tobytes() == w.tobytes(), f"{name} rows {start}:{stop}"


def test_rows_equal_the_lazy_path_and_encoded_variables_are_decoded_as_xarray(tmp_path):
    path = tmp_path / "rows.nc"
    ds = write_rows(path)
    rows = h5_rows(str(path), ds, ["row"])
    assert rows is not None
    assert set(rows.names) == {"x", "flat", "z", "gap", "be", "scaled", "masked"}
    assert {n for n, v in rows.variables.items() if v.decode} == {"scaled", "masked"}
    for a, b in [(0, 64), (0, 300), (63, 65), (128, 300), (299, 300), (7, 7), (1, 190)]:
        _check(rows, ds, ["row"], a, b)
    again = pickle.loads(pickle.dumps(rows))  # what a worker process gets: no open handles
    _check(again, ds, ["row"], 60, 200)


def test_rows_planned_without_opening_the_file_with_h5netcdf_again(tmp_path, monkeypatch):
    """The row reader is planned from h5py and the lazy dataset alone (h5netcdf resolving
    every dimension scale of the file was a third of opening a source): no h5netcdf file is
    opened, the attributes are still read as h5netcdf reads them (scaled and masked
    variables decoded), and a variable netCDF-4 stores as ``_nc4_non_coord_NAME`` (named as a
    dimension it is not the coordinate of) is found."""
    path = tmp_path / "rows.nc"
    write_rows(path).close()
    with h5netcdf.File(path, "a") as f:
        f.dimensions["g2"] = 3
        f.create_variable("g2", ("row",), "f4")[...] = np.arange(300, dtype="f4")
    with h5py.File(path, "r") as f:
        assert "_nc4_non_coord_g2" in f
    ds = xr.open_dataset(path, engine="h5netcdf", chunks={})
    opened = []
    real = h5netcdf.File.__init__

    def counting(self, *a, **k):
        opened.append(a)
        real(self, *a, **k)

    monkeypatch.setattr(h5netcdf.File, "__init__", counting)
    rows = h5_rows(str(path), ds, ["row"])
    monkeypatch.undo()
    assert opened == [] and rows is not None
    assert set(rows.names) == {"x", "flat", "z", "gap", "be", "scaled", "masked", "g2"}
    assert {n for n, v in rows.variables.items() if v.decode} == {"scaled", "masked"}
    for a, b in [(0, 300), (63, 65), (1, 190)]:
        _check(rows, ds, ["row"], a, b)


def test_grid_with_samples_last_equals_the_lazy_path(tmp_path):
    path = tmp_path / "grid.h5"
    write_grid(path)
    ds = xr.open_dataset(path, engine="h5netcdf", phony_dims="sort", chunks={})
    dims = ds["lc"].dims
    for sample_dims in ([dims[2]], [dims[2], dims[0]], [dims[0], dims[2]], [dims[1], dims[2]]):
        rows = h5_rows(str(path), ds, sample_dims)
        assert rows is not None and rows.names == ("lc",)
        n = int(np.prod([ds.sizes[d] for d in sample_dims]))
        for a, b in [(0, n), (1, 2), (3, n - 1), (n // 2 - 1, n // 2 + 5)]:
            _check(rows, ds, sample_dims, a, min(b, n))


def test_prepare_along_the_last_axis_equals_the_source_transposed(tmp_path):
    path = tmp_path / "grid.h5"
    values = write_grid(path)
    conf = {
        "source": {"paths": [str(path)]},
        "sample_dims": ["phony_dim_2"],
        "view": "flat",
        "arrays": {"x": ["lc"]},
        "chunk_rows": 1,  # blocks of one sample inside source chunks of two: shared pieces
        "compression": "none",
        "out": str(tmp_path / "store"),
    }
    view = build(load_config(conf))
    assert isinstance(view.rows, H5Rows)  # type: ignore[attr-defined]  # the fast path
    store = shardload.prepare(conf, progress=False)
    want = np.moveaxis(values, -1, 0).reshape(values.shape[-1], -1)
    np.testing.assert_array_equal(store.read("x"), want)
    assert store.manifest.stats["x"].max[5] == float(want[:, 5].max())


@pytest.mark.parametrize(
    "scheduler", ["threads", pytest.param("processes", marks=pytest.mark.slow)]
)
def test_prepare_rows_file_equals_xarray_values(tmp_path, scheduler):
    path = tmp_path / "rows.nc"
    ds = write_rows(path)
    conf = {
        "source": {"paths": [str(path)]},
        "sample_dims": ["row"],
        "view": "flat",
        "arrays": {"x": ["x", "flat", "scaled"], "y": ["z"], "g": ["gap", "be", "masked"]},
        "chunk_rows": 50,
        "nan": "ignore",
        "execution": {"scheduler": scheduler, "num_workers": 2},
        "out": str(tmp_path / "store"),
    }
    assert isinstance(build(load_config(conf)).rows, H5Rows)  # type: ignore[attr-defined]
    store = shardload.prepare(conf, progress=False)
    ref = ds.load()
    cols = lambda names: np.concatenate(  # noqa: E731
        [ref[n].transpose("row", ...).values.reshape(300, -1) for n in names], axis=1
    )
    for name, names in {
        "x": ["x", "flat", "scaled"],
        "y": ["z"],
        "g": ["gap", "be", "masked"],
    }.items():
        want = cols(names).astype(store.manifest.arrays[name].dtype)
        assert store.read(name).tobytes() == want.tobytes(), name


def test_real_era5_netcdf(tmp_path, era5_dir):
    """The real ERA5 sample stores z and t as float64 with scale_factor 0.1 and a NaN
    _FillValue (contiguous): H5Rows reads them raw and scales them as xarray does, bit for bit. The same values written plain (float64, chunked by xarray) are read by H5Rows too,
    with the sample dims in the middle of the storage order."""
    src = era5_dir / "era5-levels-members.nc"
    ds = xr.open_dataset(src, engine="h5netcdf", chunks={})
    packed = h5_rows(str(src), ds, ["number", "time"])
    assert packed is not None and set(packed.names) == {"z", "t"}
    assert all(packed.variables[n].decode for n in ("z", "t"))  # decoded here, not by xarray
    _check(packed, ds, ["number", "time"], 0, 40)
    ref = xr.open_dataset(src)  # xarray's default engine
    got = packed.read_rows(["z", "t"], 0, 40)
    for n in ("z", "t"):
        assert got[n].tobytes() == ref[n].values.reshape(40, *ref[n].shape[2:]).tobytes(), n
    plain = tmp_path / "plain.nc"
    enc = {v: {"chunksizes": (2, 1, 2, 61, 60)} for v in ("z", "t")}
    ds[["z", "t"]].load().to_netcdf(plain, engine="h5netcdf", encoding=enc)
    ds2 = xr.open_dataset(plain, engine="h5netcdf", chunks={})
    for dims, a, b in [(["number", "time"], 3, 38), (["time", "latitude"], 59, 64)]:
        rows = h5_rows(str(plain), ds2, dims)
        assert rows is not None and set(rows.names) == {"z", "t"}
        _check(rows, ds2, dims, a, b)


def test_planning_reads_only_the_attributes_xarray_decodes_with(tmp_path, monkeypatch):
    """A packed variable with many other attributes (an ERA5 file from GRIB carries about 30
    ``GRIB_*`` ones): the row reader's plan reads the values of the CF attributes it decodes
    with, not of every attribute (before: all of them, 159 attribute reads for the two
    variables of the real ERA5 file), and decodes as xarray does."""
    path = tmp_path / "many.nc"
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"row": 50, "f": 3}
        v = f.create_variable("p", ("row", "f"), "i2", fillvalue=np.int16(-1))
        v.attrs.update(scale_factor=np.float32(0.5), add_offset=np.float32(2.0), units="K")
        v.attrs.update({f"GRIB_key{i}": f"value {i}" for i in range(40)})
        v[...] = np.arange(150, dtype="i2").reshape(50, 3) % 7 - 1
    ds = xr.open_dataset(path, engine="h5netcdf", chunks={})
    reads = []
    real = h5py.AttributeManager.__getitem__

    def counting(self, name):
        reads.append(name)
        return real(self, name)

    monkeypatch.setattr(h5py.AttributeManager, "__getitem__", counting)
    rows = h5_rows(str(path), ds, ["row"])
    monkeypatch.setattr(h5py.AttributeManager, "__getitem__", real)
    assert rows is not None and rows.variables["p"].decode is not None
    assert not [r for r in reads if r.startswith("GRIB_")], sorted(set(reads))
    _check(rows, ds, ["row"], 0, 50)
