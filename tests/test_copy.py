"""``shardload copy SRC DST``: any store rewritten in prepare's layout, values equal (issue 25).

Sources in every format (Zarr chunked and sharded, npy, HDF5; plain Zarr data; variable-length
arrays), locally and by URL; the copy keeps every array, row, dtype, attr, feature name,
split (row for row), statistic, static value and sample coordinate. It is prepare's run:
``DST.partial`` resumes after a kill -9, a second copy is refused by the lock, ``verify``
passes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from _stores import split_rows
from conftest import python_env
from shardload.errors import ConfigError, ShardloadError, StoreExistsError, StoreLockedError
from shardload.move.serve import serving

NUMBER, TIME = 3, 67  # 201 samples
SOURCES = {  # name -> prepare's layout keys
    "zarr": {"format": "zarr", "compression": "zstd", "chunk_rows": 7},
    "zarr-sharded": {"format": "zarr", "compression": "zstd", "chunk_rows": 8, "shard_chunks": 2},
    "npy": {"format": "npy", "compression": "none", "chunk_rows": 7},
    "hdf5": {"format": "hdf5", "compression": "lz4", "chunk_rows": 9},
}


def _dataset() -> xr.Dataset:
    rng = np.random.default_rng(25)
    shape = (NUMBER, TIME)
    ds = xr.Dataset(
        {
            "a": (("number", "time"), rng.standard_normal(shape).astype("f4")),
            "b": (("number", "time", "lev"), rng.standard_normal((*shape, 3)).astype("f4")),
            "c": (("number", "time"), rng.integers(-(10**12), 10**12, shape, dtype="i8")),
        },
        coords={
            "number": np.arange(NUMBER),
            "time": np.arange(TIME, dtype="i8") * 3600,
            "lev": [850, 500, 250],
        },
    )
    ds["a"].attrs["units"] = "K"
    ds["a"][1, 5] = np.nan  # NaN counts are statistics too
    return ds


def _prepare(src_nc: Path, out: Path, layout: dict) -> shardload.Store:
    return shardload.prepare(
        {
            "source": {"paths": [str(src_nc)]},
            "sample_dims": ["number", "time"],
            "arrays": {"x": ["a", "b"], "y": ["c"]},
            "out": str(out),
            **layout,
        },
        progress=False,
    )


@pytest.fixture(scope="module")
def sources(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("copy-sources")
    _dataset().to_netcdf(root / "src.nc")
    for name, layout in SOURCES.items():
        _prepare(root / "src.nc", root / "stores" / name, layout)
    return root / "stores"


def _split_rows(store: shardload.Store, split: str) -> np.ndarray:
    """The rows of a split: its row range (``split_rows``; inside the chunks it lists), or
    the rows of its chunks."""
    rows = split_rows(store, split)
    if split in store.manifest.split_rows:
        a, b = store.manifest.split_rows[split]
        assert rows[0] <= a and b <= rows[-1] + 1, (split, a, b)
        return np.arange(a, b)
    return rows


def assert_same_store(src: shardload.Store, dst: shardload.Store) -> None:
    """Every array, row, dtype, attr, feature name, split, statistic, static value and sample
    coordinate of ``src`` in ``dst``."""
    a, b = src.manifest, dst.manifest
    assert len(dst) == len(src)
    assert list(b.arrays) == list(a.arrays)
    for name, info in a.arrays.items():
        got = b.arrays[name]
        assert (got.shape, got.dtype, dict(got.attrs)) == (info.shape, info.dtype, dict(info.attrs))
        assert list(got.features or []) == list(info.features or []), name
        want = src.read(name)
        have = dst.read(name)
        if info.is_ragged:
            np.testing.assert_array_equal(have.lengths, want.lengths)
            want, have = want.values, have.values
        assert have.dtype == want.dtype
        np.testing.assert_array_equal(have, want)  # NaNs in the same places
        assert b.stats[name] == a.stats[name], name
    assert sorted(b.splits) == sorted(a.splits)
    for split in a.splits:
        np.testing.assert_array_equal(_split_rows(dst, split), _split_rows(src, split))
    assert dict(b.static) == dict(a.static)
    assert b.options.get("sample_coords") == a.options.get("sample_coords")
    if a.options.get("sample_coords"):
        xa, xb = src.to_xarray(), dst.to_xarray()
        for c in a.options["sample_coords"]:
            np.testing.assert_array_equal(xb[c].values, xa[c].values)


@pytest.mark.parametrize("name", list(SOURCES))
def test_copy_of_every_format_into_the_default_layout_is_equal(sources, name, tmp_path):
    src = shardload.open_store(sources / name)
    dst = shardload.copy(sources / name, tmp_path / "dst", progress=False)
    # what assert_same_store compares is there to compare
    assert src.manifest.options["sample_coords"] == ["number", "time"]
    assert list(src.manifest.arrays["x"].features or []) == ["a", "b[850]", "b[500]", "b[250]"]
    assert len(src.manifest.splits) == 3 and np.isnan(src.read("x")).any()
    assert_same_store(src, dst)
    default = shardload.prepare(  # prepare's default layout, from the same netCDF
        {
            "source": {"paths": [str(sources.parent / "src.nc")]},
            "sample_dims": ["number", "time"],
            "arrays": {"x": ["a", "b"], "y": ["c"]},
            "out": str(tmp_path / "prepared"),
        },
        progress=False,
    )
    mine, theirs = dst.manifest, default.manifest
    assert mine.format == theirs.format
    for k in ("compression", "level"):
        assert mine.options.get(k) == theirs.options.get(k), k
    # shards or not as prepare's default (their size may follow the chunk rows, which the
    # splits fix here)
    assert bool(mine.options.get("shard_chunks")) == bool(theirs.options.get("shard_chunks"))
    assert mine.provenance["copied_from"]["store"] == str(sources / name)


@pytest.mark.parametrize(("name", "rows"), [("zarr-sharded", 4), ("hdf5", 3), ("npy", 7)])
def test_copy_by_url_is_equal(sources, name, rows, tmp_path):
    with serving(sources, port=0) as url:
        src_url = f"{url.rstrip('/')}/{name}"
        dst = shardload.copy(src_url, tmp_path / "dst", progress=False, chunk_rows=rows)
    assert dst.manifest.chunk_rows == rows
    assert_same_store(shardload.open_store(sources / name), dst)


def _cli(capsys, *args: str) -> tuple[int, str, str]:
    """``shardload ARGS`` in this process: exit status, stdout, stderr."""
    from shardload.cli.app import main

    try:
        rc = main(list(args))
    except SystemExit as exc:  # --help
        rc = int(exc.code or 0)
    out, err = capsys.readouterr()
    return rc, out, err


def test_cli_chunk_rows_and_layout_options_honoured_and_verify_passes(sources, tmp_path, capsys):
    dst = tmp_path / "dst"
    rc, out, err = _cli(
        capsys, "copy", str(sources / "npy"), str(dst), "--chunk-rows", "7", "--shard-chunks",
        "3", "--compression", "lz4", "--no-progress",
    )  # fmt: skip
    assert rc == 0, err
    assert "copied" in out and "201 samples" in out
    store = shardload.open_store(dst)
    m = store.manifest
    assert (m.format, m.chunk_rows, m.options["shard_chunks"], m.options["compression"]) == (
        "zarr",
        7,
        3,
        "lz4",
    )
    assert_same_store(shardload.open_store(sources / "npy"), store)
    rc, out, err = _cli(capsys, "verify", str(dst))
    assert rc == 0 and "all good" in out, out + err
    rc, out, err = _cli(
        capsys, "-q", "copy", str(sources / "npy"), str(tmp_path / "q"), "--format", "npy"
    )
    assert rc == 0 and out == "" and "chunk/s" not in err, err  # no line, no progress bar
    assert shardload.open_store(tmp_path / "q").manifest.format == "npy"


@pytest.mark.parametrize(
    ("name", "layout"),
    [
        ("zarr-sharded", {"format": "hdf5", "compression": "lz4"}),
        ("hdf5", {"format": "npy", "scheduler": "processes"}),
    ],
)
def test_copy_into_other_formats_and_from_worker_processes(sources, name, layout, tmp_path):
    """HDF5 (blocks staged, then merged) as the copy's format; write tasks in other processes
    (each reopens the source from its path: a task carries no chunk list)."""
    layout = dict(layout)
    scheduler = layout.pop("scheduler", None)
    execution = {"scheduler": scheduler, "num_workers": 2} if scheduler else None
    dst = shardload.copy(
        sources / name, tmp_path / "dst", execution=execution, progress=False, **layout
    )
    assert dst.manifest.format == layout["format"]
    assert_same_store(shardload.open_store(sources / name), dst)


def test_copy_origin_pickles_without_its_store(sources):
    import pickle

    from shardload.prep.copy.origin import StoreOrigin

    origin = StoreOrigin(shardload.open_store(sources / "npy"), str(sources / "npy"))
    blob = pickle.dumps(origin)
    assert b"chunk_bounds" not in blob and len(blob) < 1000
    again = pickle.loads(blob)
    np.testing.assert_array_equal(again.open_view().read(3, 9)["x"], origin.store.read("x", 3, 9))


def test_coarser_chunks_when_the_splits_allow_them(sources, tmp_path):
    """Without splits any chunk rows go; the source's 7-row chunks become 50-row ones."""
    nc = sources.parent / "src.nc"
    src = _prepare(nc, tmp_path / "one-split", {"chunk_rows": 7, "splits": {"train": 1.0}})
    dst = shardload.copy(src.url, tmp_path / "dst", chunk_rows=50, progress=False)
    assert dst.manifest.chunk_bounds == (0, 50, 100, 150, 200, 201)
    assert_same_store(src, dst)


def test_chunk_rows_cutting_a_split_is_refused_before_writing(sources, tmp_path):
    with pytest.raises(ConfigError, match=r"chunk_rows 5 would cut .* split boundary: row \d+"):
        shardload.copy(sources / "zarr", tmp_path / "dst", chunk_rows=5)
    assert not (tmp_path / "dst").exists() and not (tmp_path / "dst.partial").exists()


def test_planned_chunks_shrink_to_keep_the_splits(sources, tmp_path):
    """The 8-row chunks of the sharded source are split boundaries: a planned 16 MiB chunk
    becomes 8 rows (or a divisor), and every split keeps its rows (checked in
    assert_same_store)."""
    dst = shardload.copy(
        sources / "zarr-sharded", tmp_path / "dst", target_chunk_bytes="1MiB", progress=False
    )
    assert 8 % dst.manifest.chunk_rows == 0


@pytest.mark.parametrize(
    "bad",
    ["missing", "empty-folder", "a-file", "a-partial.partial", "url-missing"],
)
def test_bad_source_is_an_error_naming_it_before_writing(sources, tmp_path, bad):
    (tmp_path / "empty-folder").mkdir()
    (tmp_path / "a-file").write_text("not a store")
    (tmp_path / "a-partial.partial").mkdir()
    with serving(sources, port=0) as url:
        src = f"{url.rstrip('/')}/no-such-store" if bad == "url-missing" else str(tmp_path / bad)
        with pytest.raises(ShardloadError) as err:
            shardload.copy(src, tmp_path / "dst")
    assert src in str(err.value), str(err.value)
    assert not (tmp_path / "dst").exists() and not (tmp_path / "dst.partial").exists()


def test_cli_bad_source_and_bad_option_exit_2_naming_them(sources, tmp_path, capsys):
    rc, _, err = _cli(capsys, "copy", str(tmp_path / "nope"), str(tmp_path / "dst"))
    assert rc == 2 and str(tmp_path / "nope") in err, err
    rc, _, err = _cli(
        capsys, "copy", str(sources / "npy"), str(tmp_path / "dst"), "--compression", "snappy"
    )
    assert rc == 2 and "compression" in err and "snappy" in err, err
    assert not (tmp_path / "dst").exists()


def test_existing_dst_refused_then_overwritten_and_src_never_the_dst(sources, tmp_path):
    shardload.copy(sources / "npy", tmp_path / "dst", format="npy", progress=False)
    with pytest.raises(StoreExistsError):
        shardload.copy(sources / "zarr", tmp_path / "dst", progress=False)
    dst = shardload.copy(sources / "zarr", tmp_path / "dst", overwrite=True, progress=False)
    assert dst.manifest.format == "zarr"
    with pytest.raises(ConfigError, match="overlaps the source store"):
        shardload.copy(tmp_path / "dst", tmp_path / "dst", overwrite=True)
    with pytest.raises(ConfigError, match="overlaps the source store"):
        shardload.copy(tmp_path / "dst", tmp_path / "dst" / "inner")
    with pytest.raises(ConfigError, match="overlaps the source store"):
        shardload.copy(tmp_path / "dst", tmp_path, overwrite=True)
    assert_same_store(
        shardload.open_store(sources / "zarr"), shardload.open_store(tmp_path / "dst")
    )


def test_help_names_every_option(capsys):
    rc, out, _ = _cli(capsys, "copy", "--help")
    assert rc == 0
    for opt in (
        "SRC", "DST", "--chunk-rows", "--target-chunk-bytes", "--format", "--compression",
        "--compression-level", "--shard-chunks", "--overwrite", "--scheduler", "--workers",
        "--no-progress", "--quiet", "resumes", "split", "URL",
    ):  # fmt: skip
        assert opt in out, opt
    rc, out, _ = _cli(capsys, "--help")
    assert "copy" in out


def test_an_old_store_gets_todays_layout(sources, tmp_path):
    """A store as an early shardload wrote it (manifest version 1: feature names and statistics
    inline, no checksums) copies into a store of today's manifest, with checksums."""
    import shutil

    from shardload.layout import CHECKSUMS_NAME, FEATURES_DIR, MANIFEST_NAME
    from shardload.manifest.core import MANIFEST_VERSION

    old = tmp_path / "old"
    shutil.copytree(sources / "npy", old)
    d = json.loads(shardload.open_store(old).manifest.to_json())  # everything inline
    d.update(version=1, checksums="")
    (old / MANIFEST_NAME).write_text(json.dumps(d))
    shutil.rmtree(old / FEATURES_DIR)
    (old / CHECKSUMS_NAME).unlink()
    src = shardload.open_store(old)
    assert src.manifest.version == 1 and not src.manifest.checksums
    dst = shardload.copy(old, tmp_path / "dst", progress=False)
    assert dst.manifest.version == MANIFEST_VERSION and dst.manifest.checksums == "xxh3_64"
    assert_same_store(src, dst)
    assert_same_store(shardload.open_store(sources / "npy"), dst)


def test_python_api_is_exported_with_the_others():
    from shardload.prep.copy import copy_store

    assert "copy" in shardload.__all__ and "copy" in dir(shardload)
    assert shardload.copy is copy_store


def test_plain_zarr_data_is_copied(tmp_path):
    """Zarr data shardload did not write (xarray's to_zarr) opens as a store and copies."""
    rng = np.random.default_rng(1)
    ds = xr.Dataset({"v": (("s", "f"), rng.standard_normal((90, 5)).astype("f4"))})
    ds.chunk({"s": 20}).to_zarr(tmp_path / "plain.zarr", zarr_format=3, consolidated=False)
    src = shardload.open_store(tmp_path / "plain.zarr")
    dst = shardload.copy(tmp_path / "plain.zarr", tmp_path / "dst", progress=False)
    np.testing.assert_array_equal(dst.read("v"), ds.v.values)
    np.testing.assert_array_equal(dst.read("v"), src.read("v"))


def test_window_stores_row_range_splits_kept(tmp_path):
    """A written window store's splits are time ranges with gaps (``split_rows``): they keep
    their rows on other chunks."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_window_at_load import _prepare as prepare_windows
    from test_window_at_load import _source

    nc = _source(tmp_path)
    written = prepare_windows(nc, tmp_path / "written", at_load=False)
    assert written.manifest.split_rows
    dst = shardload.copy(written.url, tmp_path / "dst", chunk_rows=13, progress=False)
    assert dst.manifest.chunk_rows == 13
    assert dict(dst.manifest.split_rows) == dict(written.manifest.split_rows)
    assert_same_store(written, dst)


@pytest.fixture(scope="module")
def at_load(tmp_path_factory) -> shardload.Store:
    """A window store as prepare writes window views by default: the series stored once,
    windows cut at load time (npy, 40-sample chunks, three time-range splits)."""
    sys.path.insert(0, str(Path(__file__).parent))
    from test_window_at_load import _prepare as prepare_windows
    from test_window_at_load import _source

    tmp = tmp_path_factory.mktemp("at-load")
    store = prepare_windows(_source(tmp), tmp / "src", at_load=True)
    assert store.manifest.static["window"]["at_load"] and store.manifest.split_rows
    return store


def assert_same_windows(src: shardload.Store, dst: shardload.Store) -> None:
    """Every window ``dst`` yields equals ``src``'s: whole arrays, every split's batches in
    order (``iter_batches`` with the index), statistics, splits, the window options."""
    a, b = src.manifest, dst.manifest
    assert len(dst) == len(src) and list(b.arrays) == list(a.arrays)
    for name, info in a.arrays.items():
        got = b.arrays[name]
        assert (got.shape, got.dtype, dict(got.attrs)) == (info.shape, info.dtype, dict(info.attrs))
        assert list(got.features or []) == list(info.features or [])
        np.testing.assert_array_equal(dst.read(name), src.read(name))
        np.testing.assert_array_equal(dst.read(name, 17, 53), src.read(name, 17, 53))
        assert b.stats[name] == a.stats[name], name
    assert dict(b.split_rows) == dict(a.split_rows) and sorted(b.splits) == sorted(a.splits)
    for split in a.splits:
        mine, theirs = (
            list(shardload.iter_batches(s, batch_size=16, split=split, shuffle=False))
            for s in (dst, src)
        )
        assert len(mine) == len(theirs) > 0, split
        for x, y in zip(mine, theirs, strict=True):
            np.testing.assert_array_equal(np.asarray(x["index"]), np.asarray(y["index"]))
            for name in a.arrays:
                np.testing.assert_array_equal(np.asarray(x[name]), np.asarray(y[name]))

    def options(m):
        return {k: v for k, v in m.static["window"].items() if k != "series"}

    assert options(b) == options(a)
    assert b.options["view"] == a.options["view"]


def test_windows_at_load_copied_into_the_default_layout(at_load, tmp_path, capsys):
    """The default window store (series once, windows cut at load time) copies: its series
    arrays re-chunked as prepare chunks them, every window equal, ``verify`` passes."""
    dst = shardload.copy(at_load.url, tmp_path / "dst", progress=False)
    assert_same_windows(at_load, dst)
    w = dst.manifest.static["window"]
    assert w["at_load"] is True and dst.manifest.format == "zarr"
    steps = w["steps"]
    assert w["series"]["chunk_rows"] % steps == 0  # whole space points
    assert sorted(w["series"]["arrays"]) == sorted(
        at_load.manifest.static["window"]["series"]["arrays"]
    )
    from shardload.store.windows import WindowReader

    assert isinstance(dst.reader, WindowReader)
    rc, out, err = _cli(capsys, "verify", str(tmp_path / "dst"))
    assert rc == 0, out + err


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
def test_windows_at_load_copied_by_url_into_other_chunks(at_load, fmt, tmp_path):
    """By URL, into series chunks of one space point and 13-sample chunks: equal windows."""
    root = Path(at_load.url).parent
    with serving(root, port=0) as url:
        src_url = f"{url.rstrip('/')}/{Path(at_load.url).name}"
        dst = shardload.copy(
            src_url,
            tmp_path / "dst",
            progress=False,
            format=fmt,
            chunk_rows=13,
            target_chunk_bytes=1,
        )
    w = dst.manifest.static["window"]
    assert w["series"]["chunk_rows"] == w["steps"]  # one space point a chunk
    assert dst.manifest.chunk_rows == 13 and dst.manifest.format == fmt
    assert_same_windows(at_load, dst)


def test_windows_at_load_copied_from_worker_processes(at_load, tmp_path):
    """Write tasks in other processes reopen the source and read its series arrays."""
    dst = shardload.copy(
        at_load.url,
        tmp_path / "dst",
        progress=False,
        execution={"scheduler": "processes", "num_workers": 2},
        target_chunk_bytes=1,
        format="npy",
        compression="none",
    )
    assert len(dst.manifest.options["blocks"]) > 2  # more than one block per worker
    assert_same_windows(at_load, dst)


def test_shrunk_default_chunks_keep_the_default_shard_bytes(sources, tmp_path):
    """The default layout's inner chunks shrink to the source's 8-row split boundaries; its
    shards keep the rows (so the bytes) the default layout planned, up to the whole store."""
    from shardload.plan.default_layout import plan_default_layout

    src = shardload.open_store(sources / "zarr-sharded")
    row_bytes = sum(
        int(np.prod(a.row_shape)) * np.dtype(a.dtype).itemsize for a in src.manifest.arrays.values()
    )
    rows, per_shard = plan_default_layout(row_bytes, length=len(src))
    dst = shardload.copy(sources / "zarr-sharded", tmp_path / "dst", progress=False)
    m = dst.manifest
    assert 8 % m.chunk_rows == 0 and m.chunk_rows < rows  # shrunk
    shard_rows = m.chunk_rows * m.options["shard_chunks"]
    assert shard_rows >= min(rows * per_shard, len(src))
    assert_same_store(src, dst)


def test_variable_length_arrays_are_copied(tmp_path):
    sys.path.insert(0, str(Path(__file__).parent))
    from test_ragged import make

    src = make(tmp_path, "npy", "none", None)
    assert src.ragged
    dst = shardload.copy(src.url, tmp_path / "dst", progress=False)
    assert dst.ragged == src.ragged
    assert_same_store(src, dst)


# -- the run: resume after kill -9, the lock ---------------------------------------------------
def _launch_copy(src: Path, dst: Path, throttle_s: float) -> subprocess.Popen:
    env = {**python_env(), "SHARDLOAD_THROTTLE_S": str(throttle_s)}
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "shardload", "copy", str(src), str(dst), "--chunk-rows", "7"),
            *("--format", "npy", "--no-progress", "--scheduler", "threads", "--workers", "2"),
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def _records(dst: Path) -> int:
    progress = dst.with_name(dst.name + ".partial") / "_progress"
    try:
        return sum(1 for e in os.scandir(progress) if e.name.startswith("block-"))
    except FileNotFoundError:
        return 0


def _wait_for(proc: subprocess.Popen, ready, timeout_s: float = 60) -> None:
    t0 = time.monotonic()
    while not ready():
        assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
        assert time.monotonic() - t0 < timeout_s, "the copy never got there"
        time.sleep(0.01)


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != "shardload.json"
    }


def _manifest(root: Path) -> dict:
    d = json.loads((root / "shardload.json").read_text())
    d.pop("provenance")  # its time and host
    return d


def test_kill_9_mid_copy_then_rerun_resumes_to_an_identical_store(sources, tmp_path, caplog):
    dst = tmp_path / "dst"
    proc = _launch_copy(sources / "zarr", dst, throttle_s=0.3)  # 29 blocks, 2 at a time
    try:
        _wait_for(proc, lambda: _records(dst) >= 4)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.communicate()
    done = _records(dst)
    assert 4 <= done < 29 and not dst.exists()
    with caplog.at_level("INFO", logger="shardload"):
        resumed = shardload.copy(sources / "zarr", dst, chunk_rows=7, format="npy", progress=False)
    assert any("resuming" in r.getMessage() for r in caplog.records), caplog.text
    clean = shardload.copy(
        sources / "zarr", tmp_path / "clean", chunk_rows=7, format="npy", progress=False
    )
    assert _files(dst) == _files(tmp_path / "clean")
    assert _manifest(dst) == _manifest(tmp_path / "clean")
    assert_same_store(shardload.open_store(sources / "zarr"), resumed)
    assert_same_store(clean, resumed)


def test_a_second_copy_into_the_same_dst_is_refused_by_the_lock(sources, tmp_path):
    dst = tmp_path / "dst"
    proc = _launch_copy(sources / "npy", dst, throttle_s=0.5)
    try:
        _wait_for(proc, lambda: _records(dst) >= 1)
        with pytest.raises(StoreLockedError):
            shardload.copy(sources / "npy", dst, chunk_rows=7, format="npy", progress=False)
        assert proc.poll() is None  # refused while the first copy ran, not after it
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
    # the lock dies with its holder: the next copy resumes and finishes
    dst_store = shardload.copy(sources / "npy", dst, chunk_rows=7, format="npy", progress=False)
    assert_same_store(shardload.open_store(sources / "npy"), dst_store)


# -- the pure planner (plan/rechunk.py) --------------------------------------------------------
def test_rechunk_doctests():
    import doctest

    from shardload.plan import rechunk

    assert doctest.testmod(rechunk).failed == 0


@pytest.mark.parametrize("seed", range(40))
def test_planned_chunks_keep_every_split_row_for_row(seed):
    """Any regular source chunking, splits over its chunks (shuffled, some chunks in none),
    any planned chunk rows: the kept chunk rows divide every boundary, are at most the planned
    ones, and each split holds exactly its rows on the new chunks."""
    from shardload.plan.chunks import plan_chunk_bounds
    from shardload.plan.rechunk import plan_kept_chunk_rows, plan_kept_splits, split_boundaries

    rng = np.random.default_rng(seed)
    length = int(rng.integers(1, 500))
    old = plan_chunk_bounds(length, int(rng.integers(1, 40)))
    labels = rng.integers(0, 4, len(old) - 1)  # 3: in no split
    splits = {n: tuple(np.flatnonzero(labels == k).tolist()) for k, n in enumerate("abc")}
    planned = int(rng.integers(1, 2 * length + 2))
    rows = plan_kept_chunk_rows(planned, split_boundaries(old, splits), given=False)
    assert 1 <= rows <= planned
    new = plan_chunk_bounds(length, rows)
    kept = plan_kept_splits(new, old, splits)

    def rows_of(bounds, chunks):
        return set().union(*(range(bounds[i], bounds[i + 1]) for i in chunks))

    for name, chunks in splits.items():
        assert rows_of(new, kept[name]) == rows_of(old, chunks), name
