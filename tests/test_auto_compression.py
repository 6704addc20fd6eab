"""``compression: auto``, the default (issue 29): each array is stored lz4-compressed only where
lz4 shrinks its first chunks by at least 10%; data it cannot shrink (noise) is stored raw (no
compressor in its Zarr codec chain, no HDF5 filter, Parquet NONE), decided once per array
before the store is created, the same for every scheduler, logged and written in the
manifest. Every reader returns the same values as from a compressed store."""

from __future__ import annotations

import doctest
import json
import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.load.kinds import read_kind, stores_raw_rows
from shardload.move.serve import serving

pytestmark = pytest.mark.timeout(300)

N = 4096


def test_doctests() -> None:
    import shardload.formats.base
    import shardload.prep.codecs

    for mod in (shardload.prep.codecs, shardload.formats.base):
        result = doctest.testmod(mod)
        assert result.attempted > 0 and result.failed == 0


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``noise`` (float32 white noise: lz4 saves ~6%) and ``smooth`` (a smooth field: lz4
    saves > 90%), 4,096 samples of 64 values each."""
    rng = np.random.default_rng(0)
    t = np.linspace(0, 10, N)
    ds = xr.Dataset(
        {
            "noise": (("time", "f"), rng.normal(size=(N, 64)).astype("f4")),
            "smooth": (("time", "f"), (280 + np.sin(t)[:, None] * np.ones(64)).astype("f4")),
        }
    )
    path = tmp_path_factory.mktemp("auto") / "src.nc"
    ds.to_netcdf(path)
    return path


def prepare(src: Path, out: Path, **config: Any) -> shardload.Store:
    return shardload.prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "arrays": {"x": ["noise"], "y": ["smooth"]},
            "out": str(out),
            **config,
        }
    )


def codec_names(array_dir: Path) -> list[str]:
    """The names of an array's codecs, those inside its sharding codec included."""
    meta = json.loads((array_dir / "zarr.json").read_text())
    names = []
    for c in meta["codecs"]:
        names.append(c["name"])
        names += [i["name"] for i in c.get("configuration", {}).get("codecs", [])]
    return names


def store_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        # the manifest and metadata.json say how, when and where it was written
        if p.is_file() and p.name not in ("metadata.json", "shardload.json")
    }


def test_noise_is_stored_raw_and_a_smooth_field_lz4(
    source: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture
) -> None:
    """Default config: the noise array's codec chain has no blosc, the smooth field's has;
    the manifest, the log and ``shardload inspect`` say which and why; the values are the
    source's."""
    with caplog.at_level(logging.INFO, logger="shardload"):
        store = prepare(source, tmp_path / "s")
    assert "blosc" not in codec_names(tmp_path / "s" / "x")
    assert "blosc" in codec_names(tmp_path / "s" / "y")
    opts = store.manifest.options
    assert opts["compression"] == "auto"
    assert opts["array_compression"] == {"x": "none", "y": "lz4"}
    said = [r.getMessage() for r in caplog.records if "lz4 saved" in r.getMessage()]
    assert any(m.startswith("array 'x'") and m.endswith("stored uncompressed") for m in said)
    assert any(m.startswith("array 'y'") and m.endswith("stored lz4") for m in said)
    ds = xr.open_dataset(source)
    np.testing.assert_array_equal(store.read("x", 0, N), ds.noise.values)
    np.testing.assert_array_equal(store.read("y", 0, N), ds.smooth.values)
    from shardload.cli.app import main

    capsys.readouterr()
    assert main(["inspect", str(tmp_path / "s")]) == 0
    assert "format    zarr (auto: x none, y lz4)" in capsys.readouterr().out


@pytest.mark.parametrize("compression", ["lz4", "zstd", "none", "auto"])
def test_an_explicit_compression_is_obeyed(source: Path, tmp_path: Path, compression: str) -> None:
    """``compression:`` given is what every array gets (``auto`` given: as the default)."""
    store = prepare(source, tmp_path / "s", compression=compression)
    x, y = codec_names(tmp_path / "s" / "x"), codec_names(tmp_path / "s" / "y")
    if compression == "auto":
        assert ("blosc" in x, "blosc" in y) == (False, True)
    else:
        assert ("blosc" in x, "blosc" in y) == ((compression != "none",) * 2)
    assert store.manifest.options["compression"] == compression
    blosc = [c for c in json.loads((tmp_path / "s" / "y" / "zarr.json").read_text())["codecs"]]
    if compression in ("lz4", "zstd"):
        assert compression in json.dumps(blosc)


def test_the_decision_is_the_same_for_every_scheduler(source: Path, tmp_path: Path) -> None:
    """Threads, processes, dask distributed and sync write the same store bytes: the codecs
    are decided once, in the driver, before the tasks run."""
    want = None
    for scheduler in ("threads", "processes", "sync", "distributed"):
        if scheduler == "distributed":
            pytest.importorskip("distributed")
        out = tmp_path / scheduler
        execution = {"scheduler": scheduler, "num_workers": 2}
        store = prepare(source, out, execution=execution, chunk_rows=256)
        assert store.manifest.options["array_compression"] == {"x": "none", "y": "lz4"}
        got = store_files(out)
        assert "blosc" not in codec_names(out / "x")
        if want is None:
            want = got
        assert got.keys() == want.keys() and all(got[k] == want[k] for k in want), scheduler


def test_auto_in_other_formats(source: Path, tmp_path: Path) -> None:
    """HDF5: no filter on the noise dataset, Blosc2 on the field's; Parquet: NONE and LZ4."""
    import h5py

    h5 = prepare(source, tmp_path / "h", format="hdf5")
    with h5py.File(tmp_path / "h" / "data.h5") as f:
        assert not f["x"]._filters and f["y"]._filters
    assert h5.manifest.options["array_compression"] == {"x": "none", "y": "lz4"}
    np.testing.assert_array_equal(h5.read("x", 0, N), xr.open_dataset(source).noise.values)
    pq = pytest.importorskip("pyarrow.parquet")
    store = prepare(source, tmp_path / "p", format="parquet")
    codec = {n: pq.ParquetFile(next((tmp_path / "p" / n).glob("*"))) for n in ("x", "y")}
    got = {n: f.metadata.row_group(0).column(0).compression for n, f in codec.items()}
    assert got == {"x": "UNCOMPRESSED", "y": "LZ4"}
    np.testing.assert_array_equal(store.read("y", 0, N), xr.open_dataset(source).smooth.values)


@pytest.mark.parametrize("level", [0, 9, None])
def test_hdf5_keeps_the_level_given_zero_included(
    source: Path, tmp_path: Path, level: int | None
) -> None:
    """``compression_level: 0`` (Blosc's copy, 0-9 in docs/config.md) is written as 0, not
    as the default level 5; ``None`` is the default."""
    import h5py

    prepare(source, tmp_path / "h", format="hdf5", compression="lz4", compression_level=level)
    with h5py.File(tmp_path / "h" / "data.h5") as f:
        (options,) = f["y"]._filters.values()  # Blosc2's: clevel at index 4
    assert options[4] == (5 if level is None else level)


def test_raw_arrays_are_read_in_place_and_batches_are_those_of_lz4(
    source: Path, tmp_path: Path
) -> None:
    """Without shards (chunk_rows given) the raw array is read by the scatter reader (rows
    from the page cache straight into batches), the lz4 one by the gather reader; with the
    default layout (shards) the plan, hence every batch, is that of the same store in lz4."""
    plain = prepare(source, tmp_path / "plain", chunk_rows=256)
    assert stores_raw_rows(plain.manifest, ["x"]) and not stores_raw_rows(plain.manifest, ["y"])
    assert read_kind(plain, ["x"]) == "scatter" and read_kind(plain, ["x", "y"]) == "gather"
    auto = prepare(source, tmp_path / "auto")
    lz4 = prepare(source, tmp_path / "lz4", compression="lz4")
    assert auto.manifest.options["shard_chunks"] == lz4.manifest.options["shard_chunks"]
    kw: dict[str, Any] = {"batch_size": 100, "seed": 3, "split": None}
    got, want = list(shardload.iter_batches(auto, **kw)), list(shardload.iter_batches(lz4, **kw))
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("layout", ["shards", "plain"])
def test_readers_by_url_and_node_cache_return_the_same_values(
    source: Path, tmp_path: Path, layout: str
) -> None:
    """A store with a raw and an lz4 array: by URL, and through a node cache, every batch is
    the local store's."""
    extra = {"chunk_rows": 256} if layout == "plain" else {}
    prepare(source, tmp_path / "srv" / "s", **extra)
    local = shardload.open_store(tmp_path / "srv" / "s")
    assert local.manifest.options["array_compression"] == {"x": "none", "y": "lz4"}
    kw: dict[str, Any] = {"batch_size": 128, "seed": 1, "split": None}
    want = list(shardload.iter_batches(local, **kw))
    with serving(tmp_path / "srv") as base:
        for opts in ({}, {"cache_dir": tmp_path / "cache"}):
            remote = shardload.open_store(f"{base}s", **opts)
            got = list(shardload.iter_batches(remote, **kw))
            assert len(got) == len(want)
            for a, b in zip(got, want, strict=True):
                assert all(np.array_equal(a[k], b[k]) for k in b), opts
            np.testing.assert_array_equal(remote.read("x", 0, N), local.read("x", 0, N))


class _CountingView:
    """A view whose reads are counted (rows)."""

    def __init__(self, view: Any) -> None:
        self._view, self.rows = view, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def read(self, start: int, stop: int) -> Any:
        self.rows += stop - start
        return self._view.read(start, stop)


@pytest.mark.parametrize("chunk_rows", [256, None])
def test_the_sample_reads_no_row_twice(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunk_rows: int | None
) -> None:
    """With the threads scheduler the rows read for the decision (write block 0) are the ones
    block 0's task writes: every row is read from the source once."""
    import shardload.prep.driver as driver

    views: list[_CountingView] = []
    share = driver.share_view

    def counting(fingerprint: str, view: Any) -> None:
        views.append(_CountingView(view))
        share(fingerprint, views[-1])

    monkeypatch.setattr(driver, "share_view", counting)
    extra = {"chunk_rows": chunk_rows} if chunk_rows else {}
    store = prepare(source, tmp_path / "s", execution={"scheduler": "threads"}, **extra)
    assert store.manifest.options["array_compression"] == {"x": "none", "y": "lz4"}
    assert [v.rows for v in views] == [N]


def test_raw_inner_chunks_of_a_shard_are_read_into_place(source: Path, tmp_path: Path) -> None:
    """The default layout's raw array (shards of raw inner chunks): whole inner chunks are
    read by the local shard reader straight into their buffers, the source's values; a shard
    cut short is an error naming the array and the file."""
    from shardload.errors import ChunkReadError
    from shardload.formats.zarr.shard_local import read_whole_chunks

    store = prepare(source, tmp_path / "s")
    layout = store.reader.layout("x")
    assert layout is not None and layout.shard is not None and not layout.blosc
    rows = layout.chunk_rows
    spans = [(i * rows, (i + 1) * rows) for i in (3, 0, 7, 8)]
    outs = [np.empty((rows, 64), "f4") for _ in spans]
    assert read_whole_chunks(layout, "x", spans, outs, None, None, 1 << 20)
    want = xr.open_dataset(source).noise.values
    for (a, b), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, want[a:b])
    shard = Path(layout.chunk_path(0))
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(ChunkReadError, match="'x'"):
        read_whole_chunks(layout, "x", [(0, rows)], [outs[0]], None, None, 1 << 20)


def test_raw_inner_chunks_survive_short_reads(
    source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``preadv`` may return fewer bytes than asked before the end of a file (network and
    parallel file systems do): the raw inner chunks' run is finished, as a Blosc run is, not
    called truncated."""
    import os

    from shardload.formats.zarr.shard_local import read_whole_chunks

    store = prepare(source, tmp_path / "s")
    layout = store.reader.layout("x")
    assert layout is not None and layout.shard is not None and not layout.blosc
    rows = layout.chunk_rows
    spans = [(i * rows, (i + 1) * rows) for i in range(6)]  # one run of 6 chunks
    outs = [np.empty((rows, 64), "f4") for _ in spans]
    real, calls = os.preadv, []

    def short(fd: int, buffers: list, offset: int) -> int:  # at most 1,000 bytes of the first
        calls.append(offset)
        return real(fd, [memoryview(buffers[0]).cast("B")[:1000]], offset)

    monkeypatch.setattr(os, "preadv", short)
    assert read_whole_chunks(layout, "x", spans, outs, None, None, 1 << 20)
    monkeypatch.undo()
    want = xr.open_dataset(source).noise.values
    for (a, b), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, want[a:b])
    assert len(calls) > len(spans)  # the run was read in short pieces
