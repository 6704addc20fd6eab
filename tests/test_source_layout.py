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
from shardload.prep.sources import open as source_open

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
    # and `prepare --check` shows the chunking prepare writes
    from shardload.cli.prepare import check_plan
    from shardload.prep.config import load_config

    plan = check_plan(load_config(_grib_cfg(grib_levels, tmp_path / "t")))
    assert plan["chunk_rows"] == store.manifest.chunk_rows


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
    gzip chunks (the h5py row reader decodes it; tests of the lazy path turn that off)."""
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
    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)  # xarray + dask
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


def test_era5_grib_with_the_grid_as_samples_decodes_each_message_once(
    tmp_path, era5_dir, monkeypatch
):
    """A regular lat/lon GRIB (two grid dims) with its grid points as samples: 160 messages
    (z and t, 10 members x 4 times x 2 levels), each decoded once over many output chunks."""
    path = era5_dir / "era5-levels-members.grib"
    decodes = _count_grib_decodes(monkeypatch)
    store = shardload.prepare(
        {
            "source": {"paths": [str(path)]},
            "sample_dims": ["latitude", "longitude"],
            "arrays": {"x": ["z", "t"]},
            "target_chunk_bytes": 65536,
            "out": str(tmp_path / "s"),
        }
    )
    assert store.manifest.num_chunks > 5
    assert decodes[0] == 160
    ref = xr.open_dataset(path, engine="cfgrib", backend_kwargs={"indexpath": ""})
    want = np.concatenate(
        [ref[v].transpose("latitude", "longitude", ...).values.reshape(61 * 120, -1) for v in "zt"],
        axis=1,
    )
    np.testing.assert_array_equal(store.read("x"), want)


def test_zarr_variables_chunked_differently_along_the_samples(tmp_path):
    """Two variables whose internal chunks differ along the sample dim (6 and 4 rows): reads
    of whole chunks of both (12 rows), no warning about split chunks, xarray's values."""
    n = 100
    rng = np.random.default_rng(2)
    ds = xr.Dataset(
        {
            "a": (("s", "f"), rng.standard_normal((n, 3)).astype("f4")),
            "b": (("s",), rng.standard_normal(n).astype("f8")),
        }
    )
    ds.to_zarr(tmp_path / "src.zarr", encoding={"a": {"chunks": (6, 3)}, "b": {"chunks": (4,)}})
    store = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "src.zarr")]},
            "sample_dims": ["s"],
            "arrays": {"x": ["a", "b"]},
            "target_chunk_bytes": 20 * 20,  # 20 rows of 20 bytes: rounded to 12
            "out": str(tmp_path / "s"),
        }
    )
    assert store.manifest.chunk_rows == 12
    ref = xr.open_zarr(tmp_path / "src.zarr")
    want = np.concatenate([ref.a.values, ref.b.values[:, None]], axis=1).astype("f8")
    np.testing.assert_array_equal(store.read("x"), want)


def test_netcdf4_chunks_larger_than_a_block_are_read_once_per_group(tmp_path, monkeypatch):
    """Internal chunks of 400 rows, output chunks of 64 rows, CF-packed, on the lazy path
    (xarray + dask; the h5py row reader turned off): blocks are read in groups of whole
    chunks, once each, and a crash midway resumes to xarray's values."""
    import h5netcdf

    from shardload.prep import tasks

    monkeypatch.setattr(source_open, "open_rows", lambda *a, **k: None)

    path = tmp_path / "big_chunks.nc"
    rng = np.random.default_rng(3)
    with h5netcdf.File(path, "w") as f:
        f.dimensions = {"s": 1000, "k": 4}
        v = f.create_variable("v", ("s", "k"), dtype="i2", chunks=(400, 4), compression="gzip")
        v.attrs["scale_factor"] = np.float32(0.5)
        v[...] = rng.integers(-100, 100, size=(1000, 4)).astype("i2")
    reads: list[tuple] = []
    real_get = h5py.Dataset.__getitem__

    def counting(self, key, *a, **k):
        if self.name == "/v":
            reads.append(key)
        return real_get(self, key, *a, **k)

    cfg = {
        "source": {"paths": [str(path)]},
        "sample_dims": ["s"],
        "arrays": {"x": ["v"]},
        "target_chunk_bytes": 64 * 16,
        "execution": {"scheduler": "sync"},
        "out": str(tmp_path / "s"),
    }
    real = tasks.run_block
    calls = [0]

    def crash_after_nine(job, block):
        calls[0] += 1
        if calls[0] > 9:
            raise RuntimeError("killed")
        return real(job, block)

    monkeypatch.setattr(tasks, "run_block", crash_after_nine)
    with pytest.raises(RuntimeError, match="killed"):
        shardload.prepare(cfg)
    monkeypatch.setattr(tasks, "run_block", real)
    monkeypatch.setattr(h5py.Dataset, "__getitem__", counting)
    store = shardload.prepare(cfg)
    assert 400 % store.manifest.chunk_rows == 0  # an equal share of a chunk
    assert len(reads) <= 3  # the groups still to write, one read each (not one per block)
    ref = xr.open_dataset(path)["v"].values
    np.testing.assert_array_equal(store.read("x"), ref)


def test_shared_reads_load_once_for_concurrent_takers_and_drop_after_the_last():
    import threading
    import time

    from shardload.prep.shared_reads import SharedReads

    shared = SharedReads(max_bytes=1 << 20)
    loads = []

    def load():
        loads.append(1)
        time.sleep(0.05)  # the other takers arrive while it reads
        return {"x": np.arange(10.0)}

    got = []
    threads = [
        threading.Thread(target=lambda: got.append(shared.take("g", load, uses=4)))
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(loads) == 1 and len(got) == 4
    assert all(g["x"] is got[0]["x"] for g in got)
    assert not shared._items  # dropped after its 4th take
    for k in range(3):  # never more than two groups held
        shared.take(k, load, uses=2)
    assert list(shared._items) == [1, 2]


def test_netcdf_converted_from_grib_is_read_by_its_own_chunks(tmp_path):
    """A netCDF-4 file written from cfgrib's dataset keeps the GRIB_* attributes; its units
    are its internal chunks, not GRIB messages."""
    from shardload.prep.sources.layout import unit_extents

    path = tmp_path / "sst.nc"
    _packed_nc4(path)
    with h5py.File(path, "a") as f:
        f["sst"].attrs["GRIB_gridType"] = "regular_ll"
    ds = xr.open_dataset(path, engine="h5netcdf", chunks={})
    assert unit_extents(ds["sst"]) == {"lat": 16, "lon": 16}
    store = shardload.prepare(
        {
            "source": {"paths": [str(path)]},
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": ["sst"]},
            "target_chunk_bytes": 65536,
            "nan": "warn",
            "out": str(tmp_path / "s"),
        }
    )
    assert store.manifest.chunk_rows % (16 * 432) == 0
    np.testing.assert_array_equal(
        store.read("x")[:, 0], xr.open_dataset(path)["sst"].values.ravel()
    )


def test_grib_default_layout_shards_decode_each_message_once(tmp_path, grib_levels, monkeypatch):
    """With no layout key (prepare's default: shards of small inner chunks) the chunk rows stay
    as the default layout plans them and the shards' rows are read in groups: each message is
    still decoded once. Shards shrunk to ~8 KiB so that the small grid makes many of them."""
    import functools

    import shardload.prep.planning as driver

    monkeypatch.setattr(
        driver,
        "plan_default_layout",
        functools.partial(driver.plan_default_layout, shard_bytes=8192),
    )
    decodes = _count_grib_decodes(monkeypatch)
    cfg = _grib_cfg(grib_levels, tmp_path / "s")
    del cfg["target_chunk_bytes"]
    store = shardload.prepare(cfg)
    shards = store.manifest.options["shard_chunks"]
    assert shards and store.manifest.num_chunks // shards >= 10  # many shards (write blocks)
    assert decodes[0] == 21
    ref = xr.open_dataset(grib_levels, engine="cfgrib", backend_kwargs={"indexpath": ""})
    want = ref["t"].transpose("values", "isobaricInhPa").values
    np.testing.assert_array_equal(store.read("x"), want)
