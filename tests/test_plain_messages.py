"""Plain words for what cannot be prepared (issue 29, items 4-9): each a clear error or one
short warning naming the file, variable, option or split at fault, before any I/O where
possible."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from conftest import SRC
from shardload.errors import ConfigError, IncompleteStoreError, SourceError, ViewError
from shardload.prep.sources.paths import guess_engine

pytestmark = pytest.mark.timeout(120)


def _series(path: Path, steps: int = 20, *, empty: bool = False) -> Path:
    rng = np.random.default_rng(0)
    data = {"t": (("time", "lat", "lon"), rng.normal(size=(steps, 3, 4)).astype("f4"))}
    if empty:  # a variable with a feature axis of length 0
        data["e"] = (("time", "lat", "lon", "f"), np.zeros((steps, 3, 4, 0), "f4"))
    xr.Dataset(data).to_netcdf(path)
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardload", *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin", "HOME": str(cwd)},
        timeout=120,
    )


# -- item 4: the time dimension also among sample_dims --------------------------------------------
@pytest.mark.parametrize("check", [True, False])
def test_window_time_dim_in_sample_dims_names_the_option(tmp_path, check):
    src = _series(tmp_path / "s.nc")
    (tmp_path / "c.yaml").write_text(
        f"source: {src}\nsample_dims: [time, lat]\nview: {{name: window, lookback: 3}}\n"
        f"arrays: {{x: [t]}}\nout: {tmp_path / 'o'}\n"
    )
    res = _cli("prepare", str(tmp_path / "c.yaml"), *(["--check"] if check else []), cwd=tmp_path)
    assert res.returncode != 0
    assert "sample_dims: 'time' is the window view's time_dim" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr and "axes don't match" not in res.stderr
    assert not (tmp_path / "o").exists() and not (tmp_path / "o.partial").exists()


def test_window_view_built_directly_refuses_time_in_sample_dims():
    from shardload.prep.views.window import WindowView

    ds = xr.Dataset({"t": (("time", "lat"), np.zeros((9, 2), "f4"))})
    with pytest.raises(ViewError, match=r"time_dim 'time' is also in sample_dims"):
        WindowView(ds, {"x": ["t"]}, sample_dims=["time", "lat"], lookback=2)


# -- item 5: GRIB behind a WMO bulletin header -----------------------------------------------------
WMO_HEADER = b"\x01\r\r\n123\r\r\nHTXE01 ECMF 271200\r\r\n"


def test_wmo_headed_grib_is_detected_and_prepared(tmp_path, era5_dir):
    pytest.importorskip("cfgrib")
    grib = (era5_dir / "era5-levels-members.grib").read_bytes()
    bulletin = tmp_path / "bulletin.bin"  # no GRIB suffix: found by its bytes
    bulletin.write_bytes(WMO_HEADER + grib + b"\r\r\n\x03")
    assert guess_engine(str(bulletin)) == "cfgrib"
    plain = tmp_path / "plain.grib"
    plain.write_bytes(grib)
    stores = {}
    for name, path in (("wmo", bulletin), ("plain", plain)):
        stores[name] = shardload.prepare(
            {
                "source": {"paths": [str(path)], "variables": ["t"]},
                "sample_dims": ["number", "time"],
                "arrays": {"x": ["t"]},
                "out": str(tmp_path / name),
            }
        )
    np.testing.assert_array_equal(stores["wmo"].read("x"), stores["plain"].read("x"))


def test_grib_too_deep_for_detection_gets_an_engine_hint(tmp_path, era5_dir):
    grib = (era5_dir / "era5-levels-members.grib").read_bytes()
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\0" * 5000 + grib)  # beyond what guess_engine reads
    assert guess_engine(str(odd)) is None
    with pytest.raises(SourceError, match=r"odd\.bin holds GRIB data.*set source\.engine: cfgrib"):
        shardload.prepare(
            {
                "source": str(odd),
                "sample_dims": ["x"],
                "arrays": {"x": ["t"]},
                "out": str(tmp_path / "o"),
            }
        )


# -- item 6: a 0-length feature axis ----------------------------------------------------------------
def test_zero_length_feature_axis_names_the_variable(tmp_path):
    src = tmp_path / "s.nc"
    xr.Dataset(
        {
            "a": (("sample",), np.arange(10, dtype="f4")),
            "e": (("sample", "f"), np.zeros((10, 0), "f4")),
        }
    ).to_netcdf(src)
    for arrays in ({"x": ["a"], "y": ["e"]}, {"y": ["e"]}, {"x": ["a", "e"]}):
        with pytest.raises(
            ViewError, match=r"variable 'e' in arrays\.\w has no values per sample.*\['f'\]"
        ):
            shardload.prepare(
                {
                    "source": str(src),
                    "sample_dims": ["sample"],
                    "arrays": arrays,
                    "out": str(tmp_path / "o"),
                }
            )
    assert not (tmp_path / "o.partial").exists()
    win = _series(tmp_path / "w.nc", empty=True)
    with pytest.raises(ViewError, match=r"variable 'e' in arrays\.x has no values per sample"):
        shardload.prepare(
            {
                "source": str(win),
                "sample_dims": ["lat", "lon"],
                "view": {"name": "window", "lookback": 3},
                "arrays": {"x": ["t", "e"]},
                "out": str(tmp_path / "w"),
            }
        )


def test_function_view_with_empty_rows_names_the_array(tmp_path):
    from shardload.manifest.core import ArraySpec
    from shardload.prep.views.base import check_rows_not_empty

    with pytest.raises(ViewError, match=r"array 'z' has rows of shape \(3, 0\)"):
        check_rows_not_empty({"z": ArraySpec("z", (5, 3, 0), np.dtype("f4"))})


# -- item 7: a compute refused at its first block ---------------------------------------------------
def _int_cube(path: Path) -> Path:
    rng = np.random.default_rng(1)
    amp = rng.integers(-1000, 1000, size=(6, 5, 40)).astype("i2")
    xr.Dataset({"amp": (("inline", "crossline", "time"), amp)}).to_zarr(path, mode="w")
    return path


def test_refused_compute_leaves_nothing_open_store_takes_for_a_prepare(tmp_path):
    src = _int_cube(tmp_path / "cube.zarr")
    (tmp_path / "funcs_int.py").write_text(
        "import numpy as np\ndef to_float(x):\n    return x.astype(np.float64)\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        cfg = {
            "source": {"paths": [str(src)], "variable": "amp"},
            "attributes": {"a": {"function": "funcs_int:to_float"}},
            "chunks": {0: 3},
            "out": str(tmp_path / "attrs"),
            "execution": {"scheduler": "sync"},
        }
        with pytest.raises(ConfigError, match=r"attributes\.a.*dtype: float64"):
            shardload.compute(cfg)
    finally:
        sys.path.remove(str(tmp_path))
    assert not (tmp_path / "attrs.partial").exists()
    with pytest.raises(Exception) as exc:
        shardload.open_store(str(tmp_path / "attrs"))
    assert "prepare" not in str(exc.value)


def test_interrupted_compute_is_named_as_a_compute(tmp_path):
    # what an interrupted compute leaves: OUT.partial with its job file
    partial = tmp_path / "attrs.partial" / "_progress"
    partial.mkdir(parents=True)
    (partial / "job.json").write_text('{"fingerprint": "x", "compute": true}')
    with pytest.raises(IncompleteStoreError, match=r"re-run 'shardload compute'"):
        shardload.open_store(str(tmp_path / "attrs"))
    with pytest.raises(IncompleteStoreError, match=r"'shardload compute' has finished"):
        shardload.open_store(str(tmp_path / "attrs.partial"))
    (partial / "job.json").write_text('{"fingerprint": "x", "config": {}}')
    with pytest.raises(IncompleteStoreError, match=r"re-run 'shardload prepare'"):
        shardload.open_store(str(tmp_path / "attrs"))


# -- item 8: window splits on a short series --------------------------------------------------------
def test_short_series_splits_warn_with_the_fractions_obtained(tmp_path, caplog):
    src = _series(tmp_path / "s.nc", steps=40)
    cfg = {
        "source": str(src),
        "sample_dims": ["lat", "lon"],
        "view": {"name": "window", "lookback": 8, "horizon": 2, "targets": {"y": ["t"]}},
        "arrays": {"x": ["t"]},
        "chunk_rows": 60,
        "splits": {"train": 0.8, "val": 0.1, "test": 0.1},
        "out": str(tmp_path / "o"),
    }
    with caplog.at_level(logging.INFO, logger="shardload"):
        store = shardload.prepare(cfg)
    warns = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    warns = [w for w in warns if w.startswith("splits:")]
    assert len(warns) == 1, warns
    n = len(store)
    got = {k: (b - a) / n for k, (a, b) in store.manifest.split_rows.items()}
    assert f"train {got['train']:.1%} (asked 80.0%)" in warns[0]
    assert f"{1 - sum(got.values()):.1%} of the samples in no split" in warns[0]
    assert "more time steps" in warns[0] and "lookback" in warns[0]
    # a long enough series: no warning
    caplog.clear()
    src = _series(tmp_path / "long.nc", steps=1000)
    with caplog.at_level(logging.INFO, logger="shardload"):
        shardload.prepare({**cfg, "source": str(src), "out": str(tmp_path / "long")})
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]


# -- item 9: xarray Zarr with time bounds; built-in attributes on integers ---------------------------
def _cf_zarr(path: Path, *, bounds_attr: bool) -> Path:
    import pandas as pd

    T = 50
    rng = np.random.default_rng(2)
    ds = xr.Dataset(
        {
            "tas": (("time", "lat"), rng.random((T, 8)).astype("f4")),
            "pr": (("time", "lat"), rng.random((T, 8)).astype("f4")),
            "time_bnds": (("time", "bnds"), np.stack([np.arange(T), np.arange(T) + 1], 1) * 1.0),
            "lat_bnds": (("lat", "bnds"), rng.random((8, 2))),
        },
        coords={"time": pd.date_range("2000-01-01", periods=T), "lat": np.arange(8.0)},
    )
    if bounds_attr:
        ds["time"].attrs["bounds"] = "time_bnds"
    for v in ("tas", "pr"):  # the bounds stay in one chunk: left out
        ds[v] = ds[v].chunk({"time": 10})
    ds.to_zarr(path, mode="w", zarr_format=2)
    return path


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("bounds_attr", [True, False])
def test_xarray_zarr_with_time_bounds_warns_short_and_once(tmp_path, caplog, bounds_attr):
    root = _cf_zarr(tmp_path / f"cf{bounds_attr}.zarr", bounds_attr=bounds_attr)
    with caplog.at_level(logging.INFO, logger="shardload"):
        for _ in range(3):
            store = shardload.open_store(str(root))
    assert store.arrays == ("pr", "tas")
    assert "time_bnds" in store.manifest.provenance["skipped"]
    warns = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    if bounds_attr:  # CF cell bounds of a coordinate: not a surprise, no warning
        assert warns == []
    else:
        assert len(warns) == 1 and len(warns[0]) < 300, warns
        assert "'time_bnds'" in warns[0] and "provenance['skipped']" in warns[0]


def test_builtin_attributes_take_integer_input_as_float64(tmp_path):
    from scipy import signal

    src = _int_cube(tmp_path / "cube.zarr")
    cfg = {
        "source": {"paths": [str(src)], "variable": "amp"},
        "attributes": {
            "env": {"function": "shardload.attributes:envelope", "axis": -1},
            "rms": {"function": "shardload.attributes:rms_amplitude", "window": 5},
        },
        "chunks": {0: 3},
        "out": str(tmp_path / "attrs"),
        "execution": {"scheduler": "sync"},
    }
    shardload.compute(cfg)  # no dtype: float64, as the functions return for integers
    store = shardload.open_store(str(tmp_path / "attrs"))
    amp = xr.open_zarr(src)["amp"].values
    env = store.read("env")
    assert env.dtype == np.float64
    np.testing.assert_array_equal(env, np.abs(signal.hilbert(amp.astype("f8"), axis=-1)))
    assert store.read("rms").dtype == np.float64
