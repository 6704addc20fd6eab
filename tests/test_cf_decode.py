"""Packed (CF-encoded) netCDF-4 variables read by H5Rows and decoded in numpy equal xarray's
``open_dataset(path)[name].values`` bit for bit: float32 and float64 scale factors, int8 /
int16 / int32 / int64 / uint8 raw values, ``_Unsigned`` both ways, fill values present,
``missing_value`` as a list, ``valid_range`` (which xarray does not apply); what is not mirrored
stays on xarray's path (and prepare still equals xarray there)."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import h5netcdf
import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.prep.config import load_config
from shardload.prep.sources import open as source_open
from shardload.prep.sources.cf_decode import plan_cf_decode
from shardload.prep.sources.h5_rows import H5Rows, h5_rows
from shardload.prep.tasks import build

# several fill values (missing_value as a list; missing_value and _FillValue): xarray warns
pytestmark = pytest.mark.filterwarnings("ignore:.*multiple fill values.*")
N, F = 200, 5

#: name -> (raw dtype, attributes, _FillValue or None)
PACKED = {
    "i2_f4": ("i2", {"scale_factor": np.float32(0.01), "add_offset": np.float32(3.5)}, -999),
    "i2_f8": ("i2", {"scale_factor": np.float64(0.013), "add_offset": np.float64(270.0)}, -32767),
    "i2_mixed": ("i2", {"scale_factor": np.float32(0.25), "add_offset": np.float64(3.0)}, None),
    "i2_offset": ("i2", {"add_offset": np.float32(1.5)}, None),
    "i1_unsigned": ("i1", {"scale_factor": np.float32(0.5), "_Unsigned": "true"}, -1),
    "u1_signed": ("u1", {"scale_factor": np.float64(0.1), "_Unsigned": "false"}, 255),
    "u1_f4": ("u1", {"scale_factor": np.float32(0.2), "add_offset": np.float32(-10)}, 0),
    "i4_f4": ("i4", {"scale_factor": np.float32(1e-3), "add_offset": np.float32(1)}, -(2**31) + 1),
    "i4_scale_only": ("i4", {"scale_factor": np.float32(1e-3)}, 7),
    "i4_collide": ("i4", {"scale_factor": np.float32(0.5)}, 2**24 + 1),  # next to 2**24
    "i8_f8": ("i8", {"scale_factor": np.float64(1e-9)}, -1),
    "missing_list": ("i2", {"scale_factor": np.float32(2), "missing_value": np.array([1, 2, 3], "i2")}, None),
    "missing_and_fill": ("i2", {"missing_value": np.int16(5)}, 7),
    "valid_range": ("i2", {"scale_factor": np.float32(0.1), "valid_range": np.array([0, 10], "i2")}, -5),
    "unsigned_only": ("i1", {"_Unsigned": "true"}, None),
    "unsigned_missing": ("i1", {"_Unsigned": "true", "missing_value": np.int8(-1)}, -1),
    "f4_nan_fill_f8_scale": ("f4", {"scale_factor": np.float64(0.1)}, float("nan")),
    "f4_fill": ("f4", {}, -9999.0),
}  # fmt: skip


def write_packed(path: Path, seed: int = 0) -> None:
    """Every variable of :data:`PACKED` on (row, f), gzip chunks of 32 rows, random raw values
    over the whole range of the raw dtype, fill values and missing values at known places."""
    rng = np.random.default_rng(seed)
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"row": N, "f": F}
        for name, (dt, attrs, fill) in PACKED.items():
            dtype = np.dtype(dt)
            if dtype.kind == "f":
                raw = rng.standard_normal((N, F)).astype(dtype)
            else:
                info = np.iinfo(dtype)
                raw = rng.integers(info.min, info.max, size=(N, F), endpoint=True, dtype=dtype)
            fv = None if fill is None else dtype.type(fill)
            if fv is not None:
                raw[rng.random((N, F)) < 0.1] = fv
            if name == "i4_collide":  # float32(2**24 + 1) == 2**24: not masked (compared in f8)
                raw[::13] = 2**24
            missing = np.ravel(attrs.get("missing_value", []))
            for i, m in enumerate(missing):
                raw[3 + i :: 17, i % F] = m
            v = f.create_variable(
                name, ("row", "f"), dtype, chunks=(32, F), compression="gzip", fillvalue=fv
            )
            v.attrs.update(attrs)
            v[...] = raw


def _xarray(path: Path, engine: str | None = None) -> xr.Dataset:
    return xr.open_dataset(path, engine=engine).load()


def test_packed_variables_equal_xarray_bit_for_bit(tmp_path):
    path = tmp_path / "packed.nc"
    write_packed(path)
    lazy = xr.open_dataset(path, engine="h5netcdf", chunks={})
    rows = h5_rows(str(path), lazy, ["row"])
    assert rows is not None and set(rows.names) == set(PACKED)
    assert all(rows.variables[n].decode is not None for n in PACKED)  # none is read raw
    refs = [_xarray(path), _xarray(path, "h5netcdf")]  # the default engine (netCDF4) and ours
    nans = 0
    for name in PACKED:
        for ref in refs:
            want = ref[name].values
            for a, b in [(0, N), (3, 77), (31, 33), (199, 200)]:
                got = rows.read_rows([name], a, b)[name]
                assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
                assert got.tobytes() == want[a:b].tobytes(), f"{name} rows {a}:{b}"
        nans += int(np.isnan(want).sum()) if want.dtype.kind == "f" else 0
    assert nans > 1000  # the fill and missing values are there, and decoded to NaN


def test_decoded_into_a_strided_destination(tmp_path):
    """The flat view hands each variable its columns of the output block (strided)."""
    path = tmp_path / "packed.nc"
    write_packed(path)
    lazy = xr.open_dataset(path, engine="h5netcdf", chunks={})
    rows = h5_rows(str(path), lazy, ["row"])
    assert rows is not None
    buf = np.zeros((40, 2 * F), np.float32)
    dest = buf[:, F:]
    got = rows.read_rows(["i2_f4"], 10, 50, out={"i2_f4": dest})["i2_f4"]
    assert got is dest
    assert buf[:, F:].tobytes() == _xarray(path)["i2_f4"].values[10:50].tobytes()


def _packed_grid(path: Path, shape=(480, 600), chunks=(48, 60)) -> None:
    """An OISST-like field: int16 with scale_factor, add_offset and _FillValue over a fifth of
    the grid, gzip chunks, on (lat, lon)."""
    rng = np.random.default_rng(4)
    raw = rng.integers(-3000, 3000, size=shape, dtype=np.int16)
    raw[rng.random(shape) < 0.2] = -999
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"lat": shape[0], "lon": shape[1]}
        v = f.create_variable(
            "sst", ("lat", "lon"), "i2", chunks=chunks, compression="gzip", fillvalue=np.int16(-999)
        )
        v.attrs.update(scale_factor=np.float32(0.01), add_offset=np.float32(15))
        v[...] = raw


def test_packed_pieces_are_decoded_into_the_block_without_a_raw_copy(tmp_path):
    """A packed variable in gzip chunks is decoded a chunk-aligned piece at a time straight
    into the block's rows: no raw int16 copy of the block and no block-sized mask beside the
    pieces h5py decodes (before: the pieces, a raw block, then a block-sized mask of the fill
    values while decoding it), and the values are xarray's bit for bit, across piece bounds."""
    import tracemalloc

    path = tmp_path / "grid.nc"
    _packed_grid(path)
    want = _xarray(path)["sst"].values.reshape(-1)
    rows = h5_rows(str(path), xr.open_dataset(path, engine="h5netcdf", chunks={}), ["lat", "lon"])
    assert rows is not None and rows.variables["sst"].decode is not None
    for a, b in [(0, want.size), (5, 40_000), (28_799, 28_801), (want.size - 7, want.size)]:
        got = rows.read_rows(["sst"], a, b)["sst"]
        assert got.dtype == want.dtype and got.tobytes() == want[a:b].tobytes(), (a, b)
    fresh = h5_rows(str(path), xr.open_dataset(path, engine="h5netcdf", chunks={}), ["lat", "lon"])
    assert fresh is not None
    out = np.empty(want.size, np.float32)
    fresh._file()  # opened before the count
    tracemalloc.start()
    fresh.read_rows(["sst"], 0, want.size, out={"sst": out})
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    raw_bytes = want.size * 2  # the int16 pieces, kept in the piece cache
    assert peak < 1.5 * raw_bytes, (peak, raw_bytes)
    assert out.tobytes() == want.tobytes()


def test_not_mirrored_stays_on_xarrays_path(tmp_path):
    """Time-like units (xarray may decode them as durations), a result dtype other than the
    lazy variable's, a multi-valued scale_factor: no decoding here, xarray's path serves them."""
    f4 = np.dtype("f4")
    sf = {"scale_factor": np.float32(0.5)}
    assert plan_cf_decode({**sf, "units": "hours"}, np.dtype("i2"), f4) is None
    assert plan_cf_decode({**sf, "units": "days since 2000-01-01"}, np.dtype("i2"), f4) is None
    assert plan_cf_decode({"scale_factor": np.array([0.5, 0.25], "f4")}, np.dtype("i2"), f4) is None
    assert plan_cf_decode({"scale_factor": "0.5"}, np.dtype("i2"), f4) is None
    assert plan_cf_decode(sf, np.dtype("i2"), np.dtype("f8")) is None  # not xarray's dtype
    # an integer scale_factor with a fill value: xarray masks in int16 and fails (its error)
    int_sf = {"scale_factor": np.int16(3), "_FillValue": np.int16(-1)}
    assert plan_cf_decode(int_sf, np.dtype("i2"), np.dtype("i2")) is None
    assert plan_cf_decode(sf, np.dtype("i2"), f4) is not None
    assert plan_cf_decode({}, np.dtype("i2"), np.dtype("i2")).identity  # type: ignore[union-attr]

    path = tmp_path / "mixed.nc"
    rng = np.random.default_rng(3)
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"row": N}
        d = f.create_variable("dur", ("row",), "i2", fillvalue=np.int16(-1))
        d.attrs.update(units="hours", scale_factor=np.float32(0.5))
        d[...] = np.where(rng.random(N) < 0.2, -1, rng.integers(0, 100, N)).astype("i2")
        p = f.create_variable("p", ("row",), "i2", fillvalue=np.int16(-1))
        p.attrs["scale_factor"] = np.float32(0.5)
        p[...] = np.where(rng.random(N) < 0.2, -1, rng.integers(0, 100, N)).astype("i2")
    conf = {
        "source": {"paths": [str(path)]},
        "sample_dims": ["row"],
        "arrays": {"x": ["p", "dur"]},
        "chunk_rows": 64,
        "nan": "ignore",
        "out": str(tmp_path / "store"),
    }
    view = build(load_config(conf))
    assert isinstance(view.rows, H5Rows) and view.rows.names == ("p",)  # type: ignore[attr-defined]
    store = shardload.prepare(conf, progress=False)
    ref = _xarray(path, "h5netcdf")
    assert ref["dur"].dtype == np.float32  # xarray decodes it (no durations by default)
    want = np.stack([ref["p"].values, ref["dur"].values], axis=1)
    assert store.read("x").tobytes() == want.tobytes()


@pytest.mark.parametrize("view", ["flat", "window"])
def test_prepare_of_packed_file_equals_xarray(tmp_path, monkeypatch, view):
    """Every array and statistic equals a prepare that reads through xarray (no row reader)."""
    path = tmp_path / "packed.nc"
    write_packed(path)
    names = ["i2_f4", "i1_unsigned", "missing_list", "u1_signed"]
    conf: dict = {
        "source": {"paths": [str(path)]},
        "sample_dims": ["row"],
        "arrays": {"x": names},
        "chunk_rows": 50,
        "nan": "ignore",
    }
    if view == "window":  # a series of 200 steps at each of 5 points
        conf |= {
            "sample_dims": ["f"],
            "arrays": {"x": names},
            "view": {
                "name": "window",
                "time_dim": "row",
                "lookback": 4,
                "horizon": 1,
                "targets": {"y": names[:1]},
            },
            "target_chunk_bytes": 4096,
        }
    v = build(load_config({**conf, "out": str(tmp_path / "o")}))
    assert isinstance(v.rows, H5Rows) and set(names) <= set(v.rows.names)  # type: ignore[attr-defined]
    fast = shardload.prepare({**conf, "out": str(tmp_path / "fast")}, progress=False)
    if view == "flat":
        ref = _xarray(path)
        dt = fast.manifest.arrays["x"].dtype  # float64: u1_signed decodes to float64
        want = np.concatenate([ref[n].values.astype(dt) for n in names], axis=1)
        assert fast.read("x").tobytes() == want.tobytes()
    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)
    lazy = shardload.prepare({**conf, "out": str(tmp_path / "lazy")}, progress=False)
    assert len(fast) == len(lazy) > 0
    for name in fast.manifest.arrays:
        assert fast.read(name).tobytes() == lazy.read(name).tobytes(), name
        for f in ("mean", "std", "min", "max", "nan_count"):
            a, b = (getattr(s.manifest.stats[name], f) for s in (fast, lazy))
            np.testing.assert_array_equal(a, b)


def test_sweep_of_attribute_combinations_equals_xarray(tmp_path):
    """100 random combinations of raw dtype, scale_factor / add_offset types (float16/32/64,
    integer), fill and missing values and _Unsigned: every variable served is xarray's values
    bit for bit; those not served are those xarray cannot read."""
    rng = np.random.default_rng(7)
    raws = ["i1", "u1", "i2", "u2", "i4", "u4", "i8", "f2", "f4", "f8"]
    scales = [None, np.float32(0.37), np.float64(0.013), np.float16(0.5), np.int16(3)]
    offsets = [None, np.float32(2.5), np.float64(-273.15), np.int32(7)]
    fills = ["none", "fill", "nan_fill", "missing_list", "both"]
    combos = list(itertools.product(raws, scales, offsets, fills, [None, "true", "false"]))
    picked = [combos[i] for i in rng.choice(len(combos), 100, replace=False)]
    path = tmp_path / "sweep.nc"
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"row": 64, "k": 3}
        for i, (rd, sf, ao, fl, un) in enumerate(picked):
            dt = np.dtype(rd)
            if dt.kind == "f":
                raw = (rng.standard_normal((64, 3)) * 100).astype(dt)
            else:
                info = np.iinfo(dt)
                raw = rng.integers(info.min, info.max, (64, 3), endpoint=True, dtype=dt)
            fv = raw.flat[5] if fl in ("fill", "both") else None
            if fl == "nan_fill" and dt.kind == "f":
                fv = dt.type(np.nan)
            v = f.create_variable(f"v{i}", ("row", "k"), dt, chunks=(16, 3), fillvalue=fv)
            for key, val in (("scale_factor", sf), ("add_offset", ao), ("_Unsigned", un)):
                if val is not None:
                    v.attrs[key] = val
            if fl in ("missing_list", "both"):
                v.attrs["missing_value"] = np.array([raw.flat[7], raw.flat[11]], dt)
            v[...] = raw
    with warnings.catch_warnings():  # non-conforming fill values: xarray warns and drops them
        warnings.simplefilter("ignore")
        rows = h5_rows(str(path), xr.open_dataset(path, engine="h5netcdf", chunks={}), ["row"])
        ref = xr.open_dataset(path, engine="h5netcdf")
        assert rows is not None
        served = 0
        for i, combo in enumerate(picked):
            name = f"v{i}"
            if name not in rows.names:
                with pytest.raises(ValueError):  # xarray cannot decode it either
                    _ = ref[name].values
                continue
            served += 1
            want, got = ref[name].values, rows.read_rows([name], 0, 64)[name]
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes(), combo
    assert served >= 90
