"""A contiguous, unfiltered netCDF-4/HDF5 variable too large to keep as whole rows is read by
each write block straight from a map of the file (:mod:`shardload.prep.sources.mapped`): its
rows transposed from the page cache in one pass, no HDF5 slab read, and the store is the one
the lazy path writes, bit for bit (values and statistics)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import SourceError
from shardload.prep.sources import h5_rows
from shardload.prep.sources import open as source_open
from shardload.prep.sources.h5_rows import H5Rows

VIEWS = {
    "window": {"name": "window", "lookback": 4, "horizon": 1, "targets": {"y": ["v0"]}},
    "flat": {"name": "flat"},
}


def _series(path, *, packed=False):
    rng = np.random.default_rng(7)
    dims = ("time", "lat", "lon", "lev")
    data = {f"v{i}": (dims, rng.normal(size=(40, 4, 5, 3)).astype("float32")) for i in range(2)}
    enc = {"v1": {"dtype": "int16", "scale_factor": 0.001, "_FillValue": -999}} if packed else {}
    xr.Dataset(data).to_netcdf(path, engine="h5netcdf", encoding=enc)
    return path


def _cfg(src, out, view):
    return {
        "source": {"paths": [str(src)], "variables": ["v0", "v1"]},
        "sample_dims": ["lat", "lon"],
        "arrays": {"x": ["v0", "v1"]},
        "view": VIEWS[view],
        "target_chunk_bytes": 2048,  # several blocks
        "out": str(out),
    }


@pytest.mark.parametrize(
    ("view", "packed"), [("window", False), ("flat", False), ("flat", True)], ids=str
)
def test_a_large_contiguous_series_is_transposed_from_the_file_once_no_slab_read(
    tmp_path, monkeypatch, view, packed
):
    """Variables over ``WHOLE_BYTES`` (here: any): every block's rows copied once from the
    map (the bytes of all ``copy_rows`` calls: those of the variables), no HDF5 slab read
    (before: one strided slab per block and variable, gathered under h5py's lock, then
    transposed: two passes). ``packed``: one variable int16 with a scale factor, decoded as
    xarray decodes it."""
    monkeypatch.setattr(h5_rows, "WHOLE_BYTES", 0)
    src = _series(tmp_path / "s.nc", packed=packed)
    with xr.open_dataset(src) as ds:  # a packed variable is decoded from the map, not copied
        var_bytes = sum(ds[v].nbytes for v in (("v0",) if packed else ("v0", "v1")))
    got = {"slabs": 0, "copied": 0, "copies": 0}
    region, copy = H5Rows._read_region, h5_rows.copy_rows

    def counting_region(self, dset, r):
        got["slabs"] += 1
        return region(self, dset, r)

    def counting_copy(dst, src_, lo, hi, lead):
        got["copied"] += dst[: hi - lo].nbytes
        got["copies"] += 1
        return copy(dst, src_, lo, hi, lead)

    monkeypatch.setattr(H5Rows, "_read_region", counting_region)
    monkeypatch.setattr(h5_rows, "copy_rows", counting_copy)
    fast = shardload.prepare(_cfg(src, tmp_path / "fast.store", view))
    assert got["slabs"] == 0
    assert got["copied"] == var_bytes and got["copies"] > 2  # a copy per block and variable
    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)
    lazy = shardload.prepare(_cfg(src, tmp_path / "lazy.store", view))
    assert len(fast) == len(lazy)
    for name in fast.manifest.arrays:
        np.testing.assert_array_equal(fast.read(name, 0, len(fast)), lazy.read(name, 0, len(lazy)))
        for f in ("mean", "std", "min", "max", "nan_count"):
            np.testing.assert_array_equal(
                getattr(fast.manifest.stats[name], f), getattr(lazy.manifest.stats[name], f)
            )


def test_a_variable_past_the_end_of_its_file_is_a_source_error_not_a_crash(tmp_path):
    """A file shorter than its variable is refused when mapped (reading past a map's end
    would stop the process with SIGBUS)."""
    from shardload.prep.sources.mapped import map_contiguous

    path = tmp_path / "short.bin"
    path.write_bytes(np.arange(20, dtype="f4").tobytes())
    got = map_contiguous(str(path), 8, (18,), np.dtype("f4"), name="v")
    np.testing.assert_array_equal(got, np.arange(2, 20, dtype="f4"))
    assert not got.flags.writeable
    with pytest.raises(SourceError, match="truncated"):
        map_contiguous(str(path), 8, (19,), np.dtype("f4"), name="v")
