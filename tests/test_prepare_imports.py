"""A fresh ``shardload prepare`` of a local file imports only what its path needs (issue 29
item 10): never ``distributed`` (dask's ``get_scheduler`` imports it, 0.18 s, when the
synchronous scheduler is named by its string), torch or matplotlib; and where h5py reads
every row of a netCDF-4 file, neither dask nor sparse (0.4-0.5 s with what they import: the
source is opened without dask chunks nor indexes, the Zarr coordinates written without
dask)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

from conftest import SRC, python_env

NEVER_ON_PREPARE = ("distributed", "torch", "matplotlib")
#: not imported by a prepare whose rows h5py reads (a source without dates or strings, which
#: xarray's own decoding and ``Variable`` check against dask arrays, importing them): not dask
#: at all, nor sparse (numba, scipy), which xarray's checks while it builds indexes import
NOT_ON_H5PY_PREPARE = (*NEVER_ON_PREPARE, "dask", "dask.array", "sparse")


def _chunked_nc(path):
    """A (40, 48) field packed as int16 with ``scale_factor`` and ``_FillValue`` (as OISST) in
    8x8 gzip chunks: h5py reads it, decoded as xarray does (``prep/sources/cf_decode.py``)."""
    rng = np.random.default_rng(0)
    sst = rng.normal(size=(40, 48)).astype("float32")
    sst[0, :5] = np.nan
    ds = xr.Dataset(
        {"sst": (("lat", "lon"), sst)},
        coords={"lat": np.arange(40.0), "lon": np.arange(48.0)},
    )
    enc = {"dtype": "int16", "scale_factor": 0.01, "_FillValue": -999}
    enc |= {"chunksizes": (8, 8), "zlib": True}
    ds.to_netcdf(path, engine="h5netcdf", encoding={"sst": enc})
    return path


def _prepare_modules(cfg: dict, modules: tuple[str, ...] = NOT_ON_H5PY_PREPARE) -> list[str]:
    """Run ``shardload.prepare(cfg)`` in a fresh interpreter; the ``modules`` it imported."""
    probe = (
        "import json, sys\nimport shardload\n"
        f"shardload.prepare(json.loads({json.dumps(cfg)!r}))\n"
        f"print(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    return list(json.loads(res.stdout.strip().splitlines()[-1]))


@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None or importlib.util.find_spec("dask") is None,
    reason="distributed or dask is not installed: nothing could import it",
)
def test_a_fresh_prepare_of_a_packed_netcdf4_file_imports_no_dask_array_nor_distributed(
    tmp_path,
):
    """Nor ``dask.array``: h5py reads (and decodes) every row."""
    src = _chunked_nc(tmp_path / "field.nc")
    cfg = {
        "source": {"paths": [str(src)], "variables": ["sst"]},
        "sample_dims": ["lat", "lon"],
        "arrays": {"x": ["sst"]},
        "nan": "warn",
        "out": str(tmp_path / "out.store"),
    }
    assert _prepare_modules(cfg) == []


@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None or importlib.util.find_spec("dask") is None,
    reason="distributed or dask is not installed: nothing could import it",
)
@pytest.mark.parametrize("at_load", [True, False])
def test_a_fresh_window_view_prepare_imports_no_dask_array_nor_distributed(tmp_path, at_load):
    """The window view (series stored once, or the windows written), whose publish writes
    the feature names as Zarr coordinates (``prep/coords.py``); nor ``dask.array``: h5py
    reads every series."""
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            f"v{i}": (("time", "lat", "lon", "lev"), rng.normal(size=(20, 4, 5, 2)).astype("f4"))
            for i in range(2)
        },
        coords={"time": np.arange(20), "lat": np.arange(4.0), "lon": np.arange(5.0)},
    )
    src = tmp_path / "series.nc"
    ds.to_netcdf(src, engine="h5netcdf")
    cfg = {
        "source": {"paths": [str(src)], "variables": ["v0", "v1"]},
        "sample_dims": ["lat", "lon"],
        "arrays": {"x": ["v0", "v1"]},
        "view": {
            "name": "window",
            "lookback": 3,
            "horizon": 1,
            "targets": {"y": ["v0"]},
            "at_load": at_load,
        },
        "out": str(tmp_path / "out.store"),
    }
    assert _prepare_modules(cfg) == []


@pytest.mark.skipif(
    importlib.util.find_spec("distributed") is None or importlib.util.find_spec("dask") is None,
    reason="distributed or dask is not installed: nothing could import it",
)
def test_a_fresh_dated_prepare_to_zarr_imports_no_dask_array(tmp_path):
    """A dated source (a time axis, h5py reading every row) prepared to Zarr: its sample
    coordinate ``time`` is CF-encoded and written by ``prep/coords.py``, not through an
    ``xarray.Variable`` (which imports ``dask.array`` to check for dask arrays); xarray's
    store opening decodes the dates written. (xarray's decoding of the source's dates still
    imports ``dask``, not ``dask.array``, and ``sparse``.)"""
    rng = np.random.default_rng(0)
    n = 24
    ds = xr.Dataset(
        {"t": (("time", "lat", "lon"), rng.normal(size=(n, 4, 5)).astype("f4"))},
        coords={
            "time": np.datetime64("2020-01-01T00") + np.arange(n) * np.timedelta64(6, "h"),
            "lat": np.arange(4.0),
            "lon": np.arange(5.0),
        },
    )
    src = tmp_path / "dated.nc"
    ds.to_netcdf(src, engine="h5netcdf")
    cfg = {
        "source": {"paths": [str(src)], "variables": ["t"]},
        "sample_dims": ["time"],
        "arrays": {"state": ["t"]},
        "dates": {"frequency": "6h"},
        "format": "zarr",
        "out": str(tmp_path / "out.store"),
    }
    assert _prepare_modules(cfg, (*NEVER_ON_PREPARE, "dask.array")) == []
    with xr.open_zarr(tmp_path / "out.store") as got:
        np.testing.assert_array_equal(got["time"].values, ds["time"].values)


def test_shardload_prepare_on_the_command_line_imports_no_sample_generator(tmp_path):
    """``shardload prepare``: the parser imports every command's module (``shardload
    sample`` too), not the radiation sample's generator (its fields and writer)."""
    cfg = {
        "source": {"paths": [str(_chunked_nc(tmp_path / "field.nc"))], "variables": ["sst"]},
        "sample_dims": ["lat", "lon"],
        "arrays": {"x": ["sst"]},
        "nan": "warn",
        "out": str(tmp_path / "out.store"),
    }
    (tmp_path / "cfg.json").write_text(json.dumps(cfg))
    probe = (
        "import json, sys\nfrom shardload.cli.app import main\n"
        f"rc = main(['-q', 'prepare', {str(tmp_path / 'cfg.json')!r}])\n"
        "print(json.dumps([rc, sorted(m for m in sys.modules if m.startswith('shardload.'))]))"
    )
    res = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, env=python_env()
    )
    assert res.returncode == 0, res.stderr
    rc, imported = json.loads(res.stdout.strip().splitlines()[-1])
    assert rc == 0 and "shardload.samples.cli" in imported  # the parser imported it
    assert "shardload.samples.radiation" not in imported
