"""Prepare: values in == values out for every view; atomicity; bad input. Every format's round
trip: tests/formats (shardload.testing.formats.FormatTests)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from conftest import make_dataset
from shardload.errors import (
    ConfigError,
    DiskFullError,
    IncompleteStoreError,
    NaNError,
    SourceError,
    StoreExistsError,
    ViewError,
)
from shardload.testing.formats import expected_flat


def cfg(src: Path, out: Path, **kw):
    base = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a", "b", "c"], "y": ["b"]},
        "chunk_rows": 7,
        "out": str(out),
    }
    base.update(kw)
    return base


def test_zarr_sharding_and_target_bytes(tmp_path, small_nc):
    c = cfg(small_nc, tmp_path / "s", shard_chunks=3, compression="zstd")
    store = shardload.prepare(c)
    np.testing.assert_array_equal(store.read("x"), expected_flat(xr.open_dataset(small_nc))["x"])
    assert store.manifest.options["blocks"] == [0, 21, 42, 50]
    c2 = cfg(small_nc, tmp_path / "t", chunk_rows=None, target_chunk_bytes="400B")
    s2 = shardload.prepare(c2)
    row = 8 * 8 + 3 * 4  # x float64 x 8 features + y float32 x 3
    assert s2.manifest.chunk_rows == 400 // row


def test_stacked_sample_dims_and_window_and_function(tmp_path):
    rng = np.random.default_rng(1)
    ds = xr.Dataset(
        {
            "t": (("time", "lat", "lon", "lev"), rng.normal(size=(9, 3, 4, 2)).astype("f4")),
            "z": (("time", "lat", "lon"), rng.normal(size=(9, 3, 4)).astype("f4")),
        }
    )
    src = tmp_path / "w.nc"
    ds.to_netcdf(src)
    # flat with stacked (time, lat) samples
    s = shardload.prepare(
        cfg(
            src,
            tmp_path / "flat",
            sample_dims=["time", "lat"],
            arrays={"x": ["t", "z"]},
            chunk_rows=5,
        )
    )
    want = np.concatenate([ds.t.values.reshape(27, -1), ds.z.values.reshape(27, -1)], axis=1)
    np.testing.assert_array_equal(s.read("x"), want)
    # window view: lookback 3, stride 2, target 1 step after the window
    view = {
        "name": "window",
        "time_dim": "time",
        "lookback": 3,
        "stride": 2,
        "horizon": 1,
        "targets": {"y": ["z"]},
    }
    w = shardload.prepare(
        cfg(
            src,
            tmp_path / "win",
            sample_dims=["lat", "lon"],
            view=view,
            arrays={"x": ["t", "z"]},
            chunk_rows=5,
            splits={"train": 1.0},  # 3 windows: too few for leak-free time splits
        )
    )
    S, nw = 12, (9 - 3 - 1) // 2 + 1
    assert len(w) == nw * S and w.manifest.arrays["x"].shape == (nw * S, 3, 3)
    x, y = w.read("x"), w.read("y")
    feats = np.concatenate([ds.t.values.reshape(9, S, 2), ds.z.values.reshape(9, S, 1)], axis=-1)
    for r in range(len(w)):
        k, sp = divmod(r, S)
        np.testing.assert_array_equal(x[r], feats[k * 2 : k * 2 + 3, sp])
        np.testing.assert_array_equal(y[r], ds.z.values.reshape(9, S)[k * 2 + 3, sp : sp + 1])
    # user function view
    f = shardload.prepare(
        cfg(
            src,
            tmp_path / "fn",
            view="userfuncs:mean_over_lev",
            sample_dims=["time"],
            arrays={},
            chunk_rows=4,
        )
    )
    np.testing.assert_allclose(f.read("m"), ds.t.mean("lev").values.reshape(9, -1), rtol=1e-6)


def test_fixed_surface_era5_netcdf_and_grib_identical(tmp_path, era5_dir):
    import yaml

    from shardload.cli.app import main

    stores = {}
    for kind, fname in (("nc", "era5-levels-members.nc"), ("grib", "era5-levels-members.grib")):
        (tmp_path / kind).mkdir()
        (tmp_path / kind / fname).symlink_to(era5_dir / fname)
        conf = {
            "source": {"paths": [fname]},
            "sample_dims": ["number", "time"],
            "view": "flat",
            "arrays": {"x": ["t", "z"]},
            "chunk_rows": 8,
            "format": "zarr",
            "compression": "none",
            "out": "era5-store",
            "dtype": "float32",
        }
        (tmp_path / kind / "era5.yaml").write_text(yaml.safe_dump(conf))
        assert main(["prepare", str(tmp_path / kind / "era5.yaml"), "--no-progress"]) == 0
        stores[kind] = shardload.open_store(tmp_path / kind / "era5-store")
    nc, gr = stores["nc"], stores["grib"]
    assert len(nc) == len(gr) == 40
    ds = xr.open_dataset(
        era5_dir / "era5-levels-members.grib", engine="cfgrib", backend_kwargs={"indexpath": ""}
    )
    want = np.concatenate([ds.t.values.reshape(40, -1), ds.z.values.reshape(40, -1)], axis=1)
    np.testing.assert_array_equal(gr.read("x"), want)
    dn = xr.open_dataset(era5_dir / "era5-levels-members.nc")
    want_nc = np.concatenate([dn.t.values.reshape(40, -1), dn.z.values.reshape(40, -1)], axis=1)
    np.testing.assert_array_equal(nc.read("x"), want_nc.astype("float32"))
    # The two files are not bit-identical: the netCDF was written by another decoder and holds
    # scale_factor-packed values. Stores agree to within one float32 ulp (relative 1.2e-7).
    np.testing.assert_allclose(nc.read("x", 3, 17), gr.read("x", 3, 17), rtol=1.2e-7, atol=0)
    assert nc.manifest.arrays == gr.manifest.arrays


def test_cli_inspect_json_fixed_surface(tmp_path, small_nc, capsys):
    from shardload.cli.app import main

    shardload.prepare(cfg(small_nc, tmp_path / "s", format="npy", compression="none"))
    assert main(["inspect", str(tmp_path / "s"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["length"] == 50 and d["complete"] is True and d["format"] == "npy"
    assert d["arrays"]["x"] == {
        "shape": [50, 8],
        "dtype": "float64",
        "chunk_rows": 7,
        "num_features": 8,
    }
    assert main(["inspect", str(tmp_path / "s")]) == 0
    assert "50 samples" in capsys.readouterr().out


def test_set_overrides_and_relative_paths(tmp_path, small_nc):
    import yaml

    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "c.yaml").write_text(
        yaml.safe_dump({**cfg(Path("../small.nc"), Path("out")), "chunk_rows": 3})
    )
    store = shardload.prepare(
        tmp_path / "conf" / "c.yaml", overrides=["chunk_rows=10", "format=npy", "compression=none"]
    )
    assert store.url == str(tmp_path / "conf" / "out") and store.manifest.chunk_rows == 10


# -- bad input ---------------------------------------------------------------------------------
def test_existing_target_needs_overwrite(tmp_path, small_nc):
    shardload.prepare(cfg(small_nc, tmp_path / "s"))
    with pytest.raises(StoreExistsError, match="--overwrite"):
        shardload.prepare(cfg(small_nc, tmp_path / "s"))
    s = shardload.prepare(cfg(small_nc, tmp_path / "s", overwrite=True, chunk_rows=10))
    assert s.manifest.chunk_rows == 10 and not list(tmp_path.glob("s.old-*"))


@pytest.mark.parametrize(
    ("change", "err", "match"),
    [
        ({"source": {"paths": ["missing.nc"]}}, SourceError, "missing.nc"),
        ({"arrays": {"x": ["a", "nope"]}}, ViewError, "'nope'"),
        ({"sample_dims": ["samp"]}, ViewError, "samp"),
        ({"format": "tiff"}, ConfigError, "tiff"),  # unknown (parquet is a format now)
        ({"compression": "gzip"}, ConfigError, "gzip"),
        ({"chunk_size": 3}, ConfigError, "chunk_rows"),
        ({"format": "npy", "compression": "zstd"}, ConfigError, "npy"),
        ({"chunk_rows": 0}, ConfigError, "chunk_rows"),
    ],
)
def test_bad_config_names_the_culprit(tmp_path, small_nc, change, err, match):
    c = cfg(small_nc, tmp_path / "s")
    if "source" in change:
        change = {"source": {"paths": [str(tmp_path / "missing.nc")]}}
    c.update(change)
    with pytest.raises(err, match=match):
        shardload.prepare(c)
    assert not (tmp_path / "s").exists()


def test_mismatched_lengths_and_non_numeric(tmp_path):
    ds = xr.Dataset(
        {
            "a": (("sample",), np.arange(5.0)),
            "b": (("sample2",), np.arange(6.0)),
            "s": (("sample",), np.array(["a", "b", "c", "d", "e"])),
        }
    )
    src = tmp_path / "bad.nc"
    ds.to_netcdf(src)
    with pytest.raises(ViewError, match="mismatched"):
        shardload.prepare(
            cfg(
                src,
                tmp_path / "o",
                sample_dims=["sample"],
                arrays={"x": ["a"]},
                view="userfuncs:unequal",
            )
        )
    with pytest.raises(ViewError, match="non-numeric"):
        shardload.prepare(cfg(src, tmp_path / "o", arrays={"x": ["a", "s"]}))
    times = xr.Dataset(
        {
            "t": (
                ("sample",),
                xr.date_range("2000-01-01", periods=5, calendar="noleap", use_cftime=True),
            )
        }
    )
    times.to_netcdf(tmp_path / "cf.nc")
    with pytest.raises(ViewError, match="non-numeric"):
        shardload.prepare(cfg(tmp_path / "cf.nc", tmp_path / "o", arrays={"x": ["t"]}))


def test_nan_counted_or_fail(tmp_path):
    make_dataset(30, nan_at=(17, 1)).to_netcdf(tmp_path / "n.nc")
    s = shardload.prepare(cfg(tmp_path / "n.nc", tmp_path / "s", arrays={"y": ["b"]}))
    assert s.manifest.stats["y"].nan_count.tolist() == [0, 1, 0]
    with pytest.raises(NaNError, match=r"'y' \(b\[v\]\) in chunk 2"):
        shardload.prepare(cfg(tmp_path / "n.nc", tmp_path / "t", arrays={"y": ["b"]}, nan="fail"))
    with pytest.raises(IncompleteStoreError):
        shardload.open_store(tmp_path / "t")


def test_disk_full_leaves_incomplete_store_then_resume(tmp_path, small_nc, monkeypatch):
    import errno

    from shardload.formats.npy import write as npy

    real = npy.NpyWriter.write_block
    calls = {"n": 0}

    def flaky(self, root, name, chunk_index, start, data, *, bounds):
        calls["n"] += 1
        if chunk_index == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, root, name, chunk_index, start, data, bounds=bounds)

    monkeypatch.setattr(npy.NpyWriter, "write_block", flaky)
    c = cfg(
        small_nc, tmp_path / "s", format="npy", compression="none", execution={"scheduler": "sync"}
    )
    out = tmp_path / "s"
    with pytest.raises(DiskFullError) as info:
        shardload.prepare(c)
    msg = str(info.value)
    # names the output, the failed chunk, the bytes still needed, how to resume
    assert f"the disk holding {out} is full" in msg
    assert "chunk 4 (rows 28:35) of array 'x'" in msg
    needed = int(re.search(r"about ([\d,]+) more bytes", msg).group(1).replace(",", ""))
    assert "re-run the same command to resume" in msg
    assert not (tmp_path / "s").exists() and (tmp_path / "s.partial").exists()
    with pytest.raises(IncompleteStoreError, match="interrupted"):
        shardload.open_store(tmp_path / "s")
    monkeypatch.setattr(npy.NpyWriter, "write_block", real)
    calls["n"] = 0
    monkeypatch.setattr(
        npy.NpyWriter,
        "write_block",
        lambda *a, **k: (calls.__setitem__("n", calls["n"] + 1), real(*a, **k))[1],
    )
    recorded = {int(p.stem[6:]) for p in (tmp_path / "s.partial" / "_progress").glob("block-*")}
    done = len(recorded)
    assert 4 <= done < 8 and 4 not in recorded  # blocks 0-3 were written before the failure
    s = shardload.prepare(c)  # resumes: only the missing blocks are written
    assert calls["n"] == 2 * (8 - done)  # arrays x and y of each missing block
    row_bytes = sum(a.row_bytes for a in s.manifest.arrays.values())
    rows_left = sum(min(7 * i + 7, 50) - 7 * i for i in range(8) if i not in recorded)
    assert needed == rows_left * row_bytes  # the rows of the blocks not recorded (28:50 or less)
    np.testing.assert_array_equal(s.read("x"), expected_flat(xr.open_dataset(small_nc))["x"])
    np.testing.assert_allclose(
        s.manifest.stats["x"].mean,
        expected_flat(xr.open_dataset(small_nc))["x"].mean(0),
        rtol=1e-10,
    )


@pytest.mark.parametrize("comp", ["none", "zstd", "lz4"])
def test_zarr_chunks_written_directly_read_back_by_plain_zarr(tmp_path, small_nc, comp):
    """Chunks shardload encodes itself (no sharding) are valid Zarr v3 for any Zarr reader,
    the short last chunk included."""
    import zarr

    shardload.prepare(cfg(small_nc, tmp_path / "s", format="zarr", compression=comp))
    ref = expected_flat(xr.open_dataset(small_nc))
    group = zarr.open_group(tmp_path / "s", mode="r")
    for name, want in ref.items():
        np.testing.assert_array_equal(group[name][:], want)
    assert sorted(p.name for p in (tmp_path / "s" / "x" / "c").iterdir()) == sorted(
        str(i) for i in range(8)
    )


def test_zarr_store_opens_in_xarray(tmp_path, small_nc):
    """Named dims: xarray users open a shardload Zarr store as a dataset, rows on 'sample';
    consolidated metadata, so zarr does not list the non-Zarr files beside the arrays."""
    store = shardload.prepare(cfg(small_nc, tmp_path / "s", format="zarr", compression="zstd"))
    ds = xr.open_zarr(tmp_path / "s")
    assert ds["x"].dims == ("sample", "x_feature") and ds.sizes["sample"] == len(store)
    np.testing.assert_array_equal(ds["x"].values, store.read("x"))


def test_splits_are_not_part_of_the_write_fingerprint(tmp_path, small_nc, monkeypatch):
    """Changing split fractions or seed resumes an interrupted run instead of rewriting it."""
    import errno

    from shardload.formats.npy import write as npy

    real = npy.NpyWriter.write_block
    calls = {"n": 0}

    def failing_at_4(self, root, name, chunk_index, start, data, *, bounds):
        if chunk_index == 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, root, name, chunk_index, start, data, bounds=bounds)

    def counting(self, *a, **k):
        calls["n"] += 1
        return real(self, *a, **k)

    c = cfg(
        small_nc,
        tmp_path / "s",
        format="npy",
        compression="none",
        execution={"scheduler": "sync"},
        splits={"train": 0.5, "val": 0.5},
    )
    monkeypatch.setattr(npy.NpyWriter, "write_block", failing_at_4)
    with pytest.raises(DiskFullError):
        shardload.prepare(c)
    monkeypatch.setattr(npy.NpyWriter, "write_block", counting)
    done = len(list((tmp_path / "s.partial" / "_progress").glob("block-*.npz")))
    assert 4 <= done < 8
    s = shardload.prepare({**c, "splits": {"train": 0.75, "test": 0.25}, "split_seed": 3})
    assert calls["n"] == 2 * (8 - done)  # x and y of the missing blocks only: the rest kept
    assert sorted(s.manifest.splits) == ["test", "train"]
    assert len(s.manifest.splits["train"]) == 6 and len(s.manifest.splits["test"]) == 2
    np.testing.assert_array_equal(s.read("x"), expected_flat(xr.open_dataset(small_nc))["x"])


def test_too_few_chunks_split_by_rows(tmp_path, small_nc, caplog):
    """2 chunks cannot give train/val/test a whole chunk each: contiguous row ranges instead,
    said in the log, and the loader serves exactly those rows."""
    from shardload.load.select import select_rows

    with caplog.at_level("WARNING", logger="shardload.pipeline"):
        s = shardload.prepare(cfg(small_nc, tmp_path / "s", chunk_rows=25))
    assert "contiguous row ranges" in caplog.text
    m = s.manifest
    assert m.split_rows == {"train": (0, 40), "val": (40, 45), "test": (45, 50)}
    assert m.splits == {"train": (0, 1), "val": (1,), "test": (1,)}
    want = expected_flat(xr.open_dataset(small_nc))["x"]
    seen = []
    for name, (a, b) in m.split_rows.items():
        rows = select_rows(s, split=name).global_rows()
        np.testing.assert_array_equal(rows, np.arange(a, b))
        assert m.split_num_rows(name) == b - a
        seen.extend(rows.tolist())
    assert sorted(seen) == list(range(50))  # a partition: no row in two splits
    batch = next(iter(shardload.iter_batches(s, batch_size=5, split="val", shuffle=False)))
    np.testing.assert_array_equal(batch["x"], want[40:45])
    reopened = shardload.open_store(tmp_path / "s")  # survives the JSON round trip
    assert reopened.manifest.split_rows == m.split_rows


def test_window_splits_are_time_ranges_that_never_share_a_time_step(tmp_path):
    from shardload.load.select import select_rows

    T, lookback, stride, horizon = 40, 4, 2, 1
    rng = np.random.default_rng(2)
    ds = xr.Dataset({"t": (("time", "lat"), rng.normal(size=(T, 3)).astype("f4"))})
    ds.to_netcdf(tmp_path / "w.nc")
    view = {
        "name": "window",
        "time_dim": "time",
        "lookback": lookback,
        "stride": stride,
        "horizon": horizon,
        "targets": {"y": ["t"]},
    }
    s = shardload.prepare(
        cfg(
            tmp_path / "w.nc",
            tmp_path / "s",
            sample_dims=["lat"],
            view=view,
            arrays={"x": ["t"]},
            chunk_rows=4,
            split_seed=5,
        )
    )
    S = 3
    times = {}
    for name in ("train", "val", "test"):
        rows = select_rows(s, split=name).global_rows()
        assert len(rows) and len(rows) % S == 0  # whole windows (all space points together)
        w = np.unique(rows // S)
        times[name] = {t for k in w for t in range(k * stride, k * stride + lookback + horizon)}
    assert max(times["train"]) < min(times["val"]) and max(times["val"]) < min(times["test"])
    assert not (times["train"] & times["val"]) and not (times["val"] & times["test"])
    # the gap is the smallest that works: one window less and they would share a step
    (_, a_end), (b_start, _) = s.manifest.split_rows["train"], s.manifest.split_rows["val"]
    assert (b_start // S - (a_end // S - 1)) * stride == -(-(lookback + horizon) // stride) * stride


def test_window_store_too_small_for_time_splits_fails_before_writing(tmp_path):
    ds = xr.Dataset({"t": (("time", "lat"), np.zeros((5, 2), "f4"))})  # 4 windows
    ds.to_netcdf(tmp_path / "w.nc")
    view = {"name": "window", "time_dim": "time", "lookback": 2}
    with pytest.raises(ConfigError, match=r"splits: \[.*'test'\] would be empty.*gap"):
        shardload.prepare(
            cfg(
                tmp_path / "w.nc",
                tmp_path / "s",
                sample_dims=["lat"],
                view=view,
                arrays={"x": ["t"]},
            )
        )
    assert not (tmp_path / "s.partial").exists() and not (tmp_path / "s").exists()


def test_disk_full_during_the_hdf5_merge_then_resume(tmp_path, small_nc, monkeypatch):
    """ENOSPC while data.h5 is built from the staged blocks: a clear error, the blocks stay
    recorded, and the re-run rebuilds data.h5 from scratch without re-reading the source."""
    import errno

    from shardload.formats.hdf5 import write as hdf5

    real = hdf5.Hdf5Writer.write_block
    seen = {"n": 0}

    def full_at_third(self, *a, **k):
        seen["n"] += 1
        if seen["n"] == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *a, **k)

    c = cfg(small_nc, tmp_path / "s", format="hdf5", compression="none")
    monkeypatch.setattr(hdf5.Hdf5Writer, "write_block", full_at_third)
    with pytest.raises(DiskFullError, match=rf"disk holding {tmp_path / 's'} is full"):
        shardload.prepare(c)
    progress = tmp_path / "s.partial" / "_progress"
    assert len(list(progress.glob("block-*.npz"))) == 8  # every block recorded and staged
    assert len(list((tmp_path / "s.partial" / "_staged").glob("*.npy"))) == 16
    monkeypatch.setattr(hdf5.Hdf5Writer, "write_block", real)
    from shardload.prep import tasks as pipeline

    monkeypatch.setattr(pipeline, "run_block", lambda *a: pytest.fail("a block was rewritten"))
    s = shardload.prepare(c)
    want = expected_flat(xr.open_dataset(small_nc))
    for name in ("x", "y"):
        np.testing.assert_array_equal(s.read(name), want[name])


def test_check_plan_shows_the_splits_prepare_will_write(tmp_path, small_nc):
    from shardload.cli.prepare import check_plan
    from shardload.prep.config import load_config

    p = check_plan(load_config(cfg(small_nc, tmp_path / "s", chunk_rows=25)))
    assert p["splits"] == {
        "train": {"chunks": 2, "rows": 40},  # rows 0:40 touch chunks 0 and 1
        "val": {"chunks": 1, "rows": 5},
        "test": {"chunks": 1, "rows": 5},
    }
    assert not (tmp_path / "s.partial").exists()
