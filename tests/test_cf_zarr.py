"""Zarr written by xarray, read as xarray reads it (issue 12, items 9 and 10).

Before: a CF dataset chunked along time with its coordinates in one chunk was refused by
``open_store`` ("different row chunkings"), ``iter_batches`` / ``StreamingDataset`` did not pass
``arrays=`` on, and once open, ``_FillValue`` came back as 1e20 instead of NaN and
``scale_factor`` / ``add_offset`` were ignored. Every value here is compared with
``xr.open_zarr(...)[var].values`` (dtype and values, NaN where xarray has NaN).
"""

from __future__ import annotations

import subprocess
import sys
import warnings
from itertools import product
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from xarray.conventions import decode_cf_variable

import shardload
from shardload.errors import StoreError
from shardload.formats.zarr.cf import plan_cf_decoding

T, Y, X = 45, 3, 4
CHUNK = 8
SAMPLE_VARS = ["t2m", "sp", "u10", "tp", "lsm", "step_len"]


def cf_dataset() -> xr.Dataset:
    rng = np.random.default_rng(12)
    t2m = (rng.standard_normal((T, Y, X)) * 10 + 280).astype("f4")
    t2m[0, 0, 0] = t2m[9, 2, 3] = np.nan
    sp = rng.standard_normal((T, Y, X)) * 1000 + 100000
    sp[3, 1, 1] = np.nan
    u10 = (rng.standard_normal((T, Y)) * 5).astype("f8")
    tp = rng.gamma(1.0, 1.0, (T, X)).astype("f4")
    tp[5, 0] = -999.0  # masked through missing_value
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t2m, {"units": "K"}),
            "sp": (("time", "lat", "lon"), sp, {"units": "Pa"}),
            "u10": (("time", "lat"), u10),
            "tp": (("time", "lon"), tp, {"missing_value": np.float32(-999.0)}),
            "lsm": (("time", "lat", "lon"), rng.integers(0, 3, (T, Y, X)).astype("i4")),
            "step_len": (("time",), np.arange(T, dtype="f8"), {"units": "hours"}),
            "zlev": (("lat", "lon"), rng.standard_normal((Y, X))),
        },
        coords={
            "time": np.datetime64("2020-01-01", "ns") + np.arange(T) * np.timedelta64(6, "h"),
            "lat": np.linspace(-10, 10, Y),
            "lon": np.linspace(0, 30, X),
            "forecast": ("time", np.arange(T, dtype="f4") * 0.5),  # non-dim coord, one chunk
        },
    )
    return ds


ENCODING = {
    "t2m": {"_FillValue": 1e20, "chunks": (CHUNK, Y, X)},
    "sp": {
        "dtype": "int16",
        "scale_factor": 0.5,
        "add_offset": 100000.0,
        "_FillValue": -32768,
        "chunks": (CHUNK, Y, X),
    },
    "u10": {"dtype": "int8", "scale_factor": 0.1, "chunks": (CHUNK, Y)},
    "tp": {"chunks": (CHUNK, X)},
    "lsm": {"chunks": (CHUNK, Y, X)},
    "step_len": {"chunks": (CHUNK,)},
    "forecast": {"chunks": (T,)},
}


def write(path: Path, zarr_format: int, *, uncompressed: bool = False) -> Path:
    enc = {k: dict(v) for k, v in ENCODING.items()}
    if uncompressed:  # v3 without codecs: the direct chunk reader (zarr_chunks) serves it
        for v in enc.values():
            v["compressors"] = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # xarray's warnings about int8 packing / consolidation
        cf_dataset().to_zarr(path, encoding=enc, zarr_format=zarr_format, consolidated=False)
    return path


def reference(path: Path) -> xr.Dataset:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return xr.open_zarr(path, consolidated=False).load()


@pytest.fixture(
    scope="module", params=[(2, False), (3, False), (3, True)], ids=["v2", "v3", "v3-raw"]
)
def cf_store(request, tmp_path_factory):
    fmt, raw = request.param
    path = write(
        tmp_path_factory.mktemp(f"cf{fmt}{'raw' if raw else ''}") / "era.zarr",
        fmt,
        uncompressed=raw,
    )
    return path, reference(path)


def assert_like_xarray(got, want, what: str) -> None:
    got = np.asarray(got)
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype}, xarray gives {want.dtype}"
    np.testing.assert_array_equal(got, want, err_msg=what)  # NaN == NaN here


def test_open_reads_the_sample_aligned_variables(cf_store):
    path, ref = cf_store
    st = shardload.open_store(path)
    assert sorted(st.arrays) == sorted(SAMPLE_VARS)
    skipped = st.manifest.provenance["skipped"]
    assert set(skipped) == {"time", "lat", "lon", "forecast", "zlev"}
    assert "datetime64" in skipped["time"] and "one" not in skipped["lat"]
    assert "8" in skipped["forecast"] and "45" in skipped["forecast"]
    assert st.num_chunks == -(-T // CHUNK)
    for v in SAMPLE_VARS:
        assert_like_xarray(st.read(v), ref[v].values, v)
        assert_like_xarray(st.read(v, 5, 19), ref[v].values[5:19], v)
        assert_like_xarray(st.read_chunk(v, 2), ref[v].values[16:24], v)
    assert np.isnan(st.read("t2m")[0, 0, 0]) and np.isnan(st.read("tp")[5, 0])
    assert st.read("sp").dtype == np.float64 and np.isnan(st.read("sp")[3, 1, 1])


def test_iter_batches_serves_xarray_values(cf_store):
    path, ref = cf_store
    seen = []
    for b in shardload.iter_batches(path, batch_size=7, seed=1):
        for v in SAMPLE_VARS:
            assert_like_xarray(b[v], ref[v].values[b["index"]], v)
        seen.append(b["index"])
    assert sorted(np.concatenate(seen).tolist()) == list(range(T))
    # arrays= is passed on to the open: a coordinate alone, a decodable subset
    batches = list(shardload.iter_batches(path, batch_size=10, arrays=["forecast"]))
    for b in batches:
        assert_like_xarray(b["forecast"], ref["forecast"].values[b["index"]], "forecast")
    (b,) = shardload.iter_batches(path, batch_size=T, arrays=["sp", "t2m"], shuffle=False)
    assert set(b) == {"sp", "t2m", "index"}
    assert_like_xarray(b["sp"], ref["sp"].values, "sp")


def test_torch_datasets_serve_xarray_values(cf_store):
    torch = pytest.importorskip("torch")
    from shardload.torch import MapDataset, StreamingDataset

    path, ref = cf_store
    ds = StreamingDataset(path, batch_size=6, arrays=["t2m", "sp", "u10"])
    # in the main process; in forked workers through the ring (once: workers take seconds)
    for workers in (0, 2) if "cf2" in str(path) else (0,):
        n = 0
        for b in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=workers):
            for v in ("t2m", "sp", "u10"):
                assert_like_xarray(b[v].numpy(), ref[v].values[b["index"].numpy()], v)
            n += len(b["index"])
        assert n == T
    m = MapDataset(path, arrays=["sp", "tp"])
    for i in (0, 3, 5, 44):
        assert_like_xarray(m[i]["sp"].numpy(), ref["sp"].values[i], "sp")
        assert_like_xarray(m[i]["tp"].numpy(), ref["tp"].values[i], "tp")
    m = MapDataset(path, arrays=["forecast"])
    assert float(m[7]["forecast"]) == float(ref["forecast"].values[7])


def test_arrays_that_cannot_be_served_are_refused_by_name(cf_store):
    path, _ = cf_store
    with pytest.raises(StoreError, match=r"'time'.*datetime64"):
        shardload.open_store(path, arrays=["time"])
    with pytest.raises(StoreError, match=r"'time'.*datetime64"):
        list(shardload.iter_batches(path, batch_size=4, arrays=["t2m", "time"]))
    with pytest.raises(StoreError, match="different row chunkings"):
        shardload.open_store(path, arrays=["t2m", "forecast"])
    st = shardload.open_store(path)
    with pytest.raises(StoreError, match=r"'time'.*left out when opened.*datetime64"):
        st.read("time")
    with pytest.raises(StoreError, match=r"'lat'.*left out when opened.*sample dimension"):
        list(shardload.iter_batches(st, batch_size=4, arrays=["lat"]))


def test_read_side_does_not_import_xarray(tmp_path):
    path = write(tmp_path / "era.zarr", 3)
    code = (
        "import sys, shardload\n"
        f"st = shardload.open_store({str(path)!r})\n"
        "st.read('sp'); list(shardload.iter_batches(st, batch_size=8))\n"
        "bad = sorted(m for m in ('xarray', 'dask', 'pandas') if m in sys.modules)\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_plain_zarr_without_dimension_names_is_served_as_stored(tmp_path):
    """Arrays with no dimension names are not CF data (xarray cannot open them): their
    stored values, fill value included, are served as they are."""
    import zarr

    g = zarr.open_group(str(tmp_path / "z"), mode="w", zarr_format=2)
    a = g.create_array("u", shape=(20, 2), chunks=(5, 2), dtype="i2", fill_value=0)
    a[:] = np.arange(40).reshape(20, 2)
    a.attrs["scale_factor"] = 10.0
    got = shardload.open_store(tmp_path / "z").read("u")
    assert got.dtype == np.int16
    np.testing.assert_array_equal(got, np.arange(40).reshape(20, 2))


# -- the decoding rules themselves, against xarray's coders --------------------------------------

DTYPES = ["i1", "i2", "i4", "i8", "u1", "u2", "f2", "f4", "f8", ">f4", ">i2"]
ATTRS = [
    {},
    {"_FillValue": 7},
    {"missing_value": 7},
    {"_FillValue": 7, "missing_value": [3, 9]},
    {"scale_factor": 0.25},
    {"add_offset": 2.5},
    {"scale_factor": 0.25, "add_offset": 100.0},
    {"scale_factor": 2, "_FillValue": 7},
    {"scale_factor": 0.25, "add_offset": 100.0, "_FillValue": 7},
    {"scale_factor": np.float32(0.1), "add_offset": np.float32(3.0)},
    {"scale_factor": np.float32(0.1), "add_offset": np.float32(3.0), "_FillValue": 7},
    {"_FillValue": np.nan},
    {"_FillValue": np.nan, "scale_factor": 0.5},
    {"units": "hours", "scale_factor": 0.5},
]


@pytest.mark.parametrize(("dtype", "attrs"), list(product(DTYPES, ATTRS)))
def test_mask_and_scale_match_xarray(dtype, attrs):
    dtype = np.dtype(dtype)
    raw = (np.arange(-6, 14) % (100 if dtype.kind != "u" else 14)).astype(dtype)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # xarray's SerializationWarnings (NaN fill of ints)
            want = decode_cf_variable("v", xr.Variable(("x",), raw, dict(attrs))).values
    except ValueError:  # xarray cannot decode it (NaN into an integer type): refused
        with pytest.raises(StoreError, match="'v'"):
            plan_cf_decoding("v", dtype=dtype, attrs=attrs, fill_value=None, zarr_format=3)
        return
    plan = plan_cf_decoding("v", dtype=dtype, attrs=attrs, fill_value=None, zarr_format=3)
    got = raw.astype(raw.dtype.newbyteorder("=")) if plan is None else plan.apply(raw)
    assert got.dtype == want.dtype, (dtype, attrs, got.dtype, want.dtype)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(
    ("attrs", "said"),
    [
        ({"units": "days since 2000-01-01"}, "CF times"),
        ({"units": "hours", "dtype": "timedelta64[ns]"}, "timedeltas"),
        ({"dtype": "bool"}, "booleans"),
        ({"_Unsigned": "true"}, "_Unsigned"),
        ({"scale_factor": "x"}, "not a number"),
    ],
)
def test_what_xarray_turns_into_other_types_is_refused(attrs, said):
    with pytest.raises(StoreError, match=f"'v'.*{said}"):
        plan_cf_decoding("v", dtype=np.dtype("i2"), attrs=attrs, fill_value=None, zarr_format=3)


def test_spans_read_in_one_call_are_decoded_as_read_into(cf_store):
    """Several spans of a CF-encoded array in one call (the loader's task shape) give the
    served values of `read_into` (the stored -> served decoding applied), for every array:
    with a float64 output, `dtype == None` had compared equal (np.dtype(None) is float64) and
    the raw int16 bytes were served as float64."""
    path, _ = cf_store
    st = shardload.open_store(path)
    reader = st.reader
    for name, info in st.manifest.arrays.items():
        n = min(info.shape[0], 12)
        spans = [(0, n // 3), (n // 3, n)]
        want = np.empty((n, *info.row_shape), np.dtype(info.dtype))
        reader.read_into(name, 0, n, want)
        outs = [np.empty((b - a, *info.row_shape), np.dtype(info.dtype)) for a, b in spans]
        reader.read_spans_into(name, spans, outs)
        np.testing.assert_array_equal(np.concatenate(outs), want, err_msg=name)
