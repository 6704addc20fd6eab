"""prepare reads a source in its own decode units (issue #29 items 1 and 2): a GRIB message is
decoded once, not once per output chunk; a netCDF-4 variable in small internal chunks is read
in blocks of whole chunks, not one dask task per internal chunk. Counted, never timed."""

from __future__ import annotations

import doctest
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.plan import reads as plan_reads_mod

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from bench_real_prepare import write_grib_levels


def test_read_planner_doctests():
    assert doctest.testmod(plan_reads_mod).failed == 0


@pytest.fixture(scope="module")
def grib_levels(tmp_path_factory) -> Path:
    """21 GRIB2 messages (t on 21 levels) on the octahedral grid O24 (3,168 points)."""
    path = tmp_path_factory.mktemp("grib") / "levels.grib2"
    assert write_grib_levels(path, n=24, levels=21) == 3168
    return path


def _count_grib_decodes(monkeypatch) -> list[int]:
    import cfgrib.dataset as cd

    seen = [0]
    real = cd.get_values_in_order

    def counting(*a, **k):
        seen[0] += 1
        return real(*a, **k)

    monkeypatch.setattr(cd, "get_values_in_order", counting)
    return seen


def _grib_cfg(path: Path, out: Path, **kw) -> dict:
    return {
        "source": {"paths": [str(path)]},
        "sample_dims": ["values"],
        "arrays": {"x": ["t"]},
        "target_chunk_bytes": 8192,  # ~100 rows of 21 float32: many chunks of a small grid
        "out": str(out),
        **kw,
    }


def test_grib_grid_points_as_samples_decode_each_message_once(tmp_path, grib_levels, monkeypatch):
    decodes = _count_grib_decodes(monkeypatch)
    store = shardload.prepare(_grib_cfg(grib_levels, tmp_path / "s"))
    assert store.manifest.num_chunks >= 20  # many output chunks ...
    assert decodes[0] == 21  # ... and each of the 21 messages decoded once (was 21 per chunk)
    ref = xr.open_dataset(grib_levels, engine="cfgrib", backend_kwargs={"indexpath": ""})
    want = ref["t"].transpose("values", "isobaricInhPa").values
    np.testing.assert_array_equal(store.read("x"), want)
    # the chunks hold whole shares of the field: no chunk straddles two reads
    assert 3168 % store.manifest.chunk_rows == 0


def test_grib_read_groups_resume_after_a_crash(tmp_path, grib_levels, monkeypatch):
    """A run killed midway leaves its recorded blocks; the re-run writes the others, reading
    the messages again once, and the store equals xarray's values."""
    from shardload.prep import tasks

    real = tasks.run_block
    calls = [0]

    def crash_after_five(job, block):
        calls[0] += 1
        if calls[0] > 5:
            raise RuntimeError("killed")
        return real(job, block)

    cfg = _grib_cfg(grib_levels, tmp_path / "s", execution={"scheduler": "sync"})
    monkeypatch.setattr(tasks, "run_block", crash_after_five)
    with pytest.raises(RuntimeError, match="killed"):
        shardload.prepare(cfg)
    monkeypatch.setattr(tasks, "run_block", real)
    decodes = _count_grib_decodes(monkeypatch)
    store = shardload.prepare(cfg)
    assert decodes[0] == 21
    ref = xr.open_dataset(grib_levels, engine="cfgrib", backend_kwargs={"indexpath": ""})
    np.testing.assert_array_equal(
        store.read("x"), ref["t"].transpose("values", "isobaricInhPa").values
    )


def _packed_nc4(path: Path, shape=(216, 432), chunk=16) -> None:
    """An OISST-like field: int16 with scale_factor and a _FillValue over "land", in small
    gzip chunks (what xarray decodes: the lazy read path, not the raw h5py one)."""
    import h5netcdf

    ny, nx = shape
    rng = np.random.default_rng(1)
    field = rng.integers(-2000, 3000, size=shape).astype("i2")
    field[rng.random(shape) < 0.2] = -999
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"lat": ny, "lon": nx}
        f.create_variable("lat", ("lat",), data=np.linspace(-90, 90, ny, dtype="f4"))
        f.create_variable("lon", ("lon",), data=np.linspace(0, 360, nx, False, dtype="f4"))
        v = f.create_variable(
            "sst",
            ("lat", "lon"),
            dtype="i2",
            chunks=(chunk, chunk),
            compression="gzip",
            fillvalue=np.int16(-999),
        )
        v.attrs["scale_factor"] = np.float32(0.01)
        v[...] = field


def test_netcdf4_small_chunks_are_read_in_blocks_of_whole_chunks(tmp_path, monkeypatch):
    path = tmp_path / "sst.nc"
    _packed_nc4(path)
    reads: list[tuple] = []
    real = h5py.Dataset.__getitem__

    def counting(self, key, *a, **k):
        if self.name == "/sst":
            reads.append(key)
        return real(self, key, *a, **k)

    monkeypatch.setattr(h5py.Dataset, "__getitem__", counting)
    store = shardload.prepare(
        {
            "source": {"paths": [str(path)]},
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": ["sst"]},
            "target_chunk_bytes": 65536,  # 16,384 rows: ~6 output chunks
            "nan": "warn",
            "out": str(tmp_path / "s"),
        }
    )
    chunk_rows = store.manifest.chunk_rows
    assert chunk_rows % (16 * 432) == 0  # whole rows of internal chunks per output chunk
    # one read per output chunk (was one per 16x16 internal chunk: 378 here)
    assert len(reads) == store.manifest.num_chunks <= 7
    ref = xr.open_dataset(path)["sst"].values.reshape(-1)
    np.testing.assert_array_equal(store.read("x")[:, 0], ref)


def test_user_chunk_rows_are_kept_and_values_still_equal(tmp_path):
    path = tmp_path / "sst.nc"
    _packed_nc4(path)
    store = shardload.prepare(
        {
            "source": {"paths": [str(path)]},
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": ["sst"]},
            "chunk_rows": 10_000,  # not a whole number of internal chunk rows
            "nan": "warn",
            "out": str(tmp_path / "s"),
        }
    )
    assert store.manifest.chunk_rows == 10_000
    ref = xr.open_dataset(path)["sst"].values.reshape(-1)
    np.testing.assert_array_equal(store.read("x")[:, 0], ref)


def test_sample_coords_of_stacked_dims_are_each_rows_own():
    from shardload.prep.coords import plan_sample_coords

    ds = xr.Dataset(
        coords={"a": [10, 20, 30], "b": np.arange(4) * 0.5, "c": np.array(list("vwxyz"))}
    )
    got = plan_sample_coords(ds, ["a", "b", "c"], 60)
    which = np.unravel_index(np.arange(60), (3, 4, 5))
    for k, d in enumerate("abc"):
        np.testing.assert_array_equal(got[d], ds[d].values[which[k]])
