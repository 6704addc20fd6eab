"""Window views store the series once by default, in every format and codec (issue 29 item 3):
the loader cuts the windows, and every batch equals the written windows' of the same config
(``at_load: false``), shuffled, on two workers; a compressed series chunk is decoded once per
reader while it stays in the reader's cache."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.store.windows import WindowReader

pytestmark = pytest.mark.timeout(300)

VIEW = {"name": "window", "lookback": 5, "stride": 2, "horizon": 1, "targets": {"y": ["t"]}}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    rng = np.random.default_rng(7)
    T, LAT, LON = 90, 4, 5
    ds = xr.Dataset(
        {
            "t": (("time", "lat", "lon", "lev"), rng.normal(size=(T, LAT, LON, 3)).astype("f4")),
            "z": (("time", "lat", "lon"), rng.normal(size=(T, LAT, LON)).astype("f4")),
        },
        coords={"lev": [300, 500, 850]},
    )
    path = tmp_path_factory.mktemp("src") / "series.nc"
    ds.to_netcdf(path)
    return path


def _cfg(src: Path, out: Path, **kw):
    return {
        "source": str(src),
        "sample_dims": ["lat", "lon"],
        "view": VIEW,
        "arrays": {"x": ["t", "z"]},
        "chunk_rows": 50,
        # small series chunks: a batch's windows span several of them
        "target_chunk_bytes": 4096,
        "splits": {"train": 0.7, "val": 0.3},
        "out": str(out),
        **kw,
    }


CASES = {
    "zarr-default": {},  # zarr, lz4
    "zarr-zstd": {"format": "zarr", "compression": "zstd"},
    "zarr-zstd-shards": {"format": "zarr", "compression": "zstd", "shard_chunks": 2},
    "zarr-none": {"format": "zarr", "compression": "none"},
    "npy": {"format": "npy", "compression": "none"},
    "hdf5-lz4": {"format": "hdf5", "compression": "lz4"},
    "hdf5-none": {"format": "hdf5", "compression": "none"},
    "parquet-zstd": {"format": "parquet", "compression": "zstd"},
}


def _batches(store, *, worker: int, shuffle):
    return list(
        shardload.iter_batches(
            store,
            batch_size=16,
            split="train",
            seed=3,
            epoch=1,
            shuffle=shuffle,
            worker=worker,
            num_workers=2,
        )
    )


@pytest.mark.parametrize("case", list(CASES))
def test_series_once_by_default_and_every_batch_equals_written_windows(tmp_path, source, case):
    if case.startswith("parquet") and importlib.util.find_spec("pyarrow") is None:
        pytest.skip("pyarrow is not installed (shardload[parquet])")
    kw = CASES[case]
    cut = shardload.prepare(_cfg(source, tmp_path / "cut", **kw))  # at_load not given
    written = shardload.prepare(
        _cfg(source, tmp_path / "written", **kw, view={**VIEW, "at_load": False})
    )
    assert cut.manifest.static["window"]["at_load"] is True
    assert isinstance(cut.reader, WindowReader)
    assert "at_load" not in written.manifest.static["window"]
    assert len(cut) == len(written) and cut.manifest.split_rows == written.manifest.split_rows
    for a in ("x", "y"):
        np.testing.assert_array_equal(cut.read(a), written.read(a))
    # in order: the very batches of the written store
    for shuffle in (False,):
        for worker in (0, 1):
            got = _batches(cut, worker=worker, shuffle=shuffle)
            want = _batches(written, worker=worker, shuffle=shuffle)
            assert len(got) == len(want) > 1
            for g, w in zip(got, want, strict=True):
                np.testing.assert_array_equal(g["index"], w["index"])
                for a in ("x", "y"):
                    np.testing.assert_array_equal(g[a], w[a], err_msg=f"{case} {a}")
    # shuffled (windows cut at load are read where they lie, as raw rows are: the default
    # shuffle draws pieces from the whole split, "uniform" is a permutation; written
    # compressed windows shuffle by chunks, so the orders differ): every batch the written
    # windows' values of its samples, each train window once per epoch
    full = {a: written.read(a) for a in ("x", "y")}
    for shuffle in (True, "uniform"):
        rows = []
        for worker in (0, 1):
            for g in _batches(cut, worker=worker, shuffle=shuffle):
                rows.extend(g["index"].tolist())
                for a in ("x", "y"):
                    np.testing.assert_array_equal(g[a], full[a][g["index"]], err_msg=f"{a}")
        lo, hi = cut.manifest.split_rows["train"]
        assert sorted(rows) == list(range(lo, hi))


def test_streaming_dataloader_two_workers_compressed_equals_written(tmp_path, source):
    pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    kw = {"format": "zarr", "compression": "zstd"}
    cut = shardload.prepare(_cfg(source, tmp_path / "cut", **kw))
    written = shardload.prepare(
        _cfg(source, tmp_path / "written", **kw, view={**VIEW, "at_load": False})
    )

    def batches(store, shuffle):
        ds = StreamingDataset(store, batch_size=16, split="train", seed=5, shuffle=shuffle)
        return list(StreamingDataLoader(ds, num_workers=2))

    got, want = batches(cut, False), batches(written, False)
    assert len(got) == len(want) > 2
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g["index"].numpy(), w["index"].numpy())
        for a in ("x", "y"):
            np.testing.assert_array_equal(g[a].numpy(), w[a].numpy())
    full = {a: written.read(a) for a in ("x", "y")}
    rows = []
    for g in batches(cut, True):
        idx = g["index"].numpy()
        rows.extend(idx.tolist())
        for a in ("x", "y"):
            np.testing.assert_array_equal(g[a].numpy(), full[a][idx])
    lo, hi = cut.manifest.split_rows["train"]
    assert sorted(rows) == list(range(lo, hi))


def test_compressed_series_chunks_are_decoded_once_per_reader(tmp_path, source, monkeypatch):
    cut = shardload.prepare(_cfg(source, tmp_path / "cut", compression="zstd"))
    reader = cut.reader
    assert isinstance(reader, WindowReader) and reader.raw("series-00", 0) is None
    calls: list[tuple[str, int, int]] = []
    inner = reader.series.read

    def counting(name, start, stop):
        calls.append((name, start, stop))
        return inner(name, start, stop)

    monkeypatch.setattr(reader.series, "read", counting)
    seen = 0
    for epoch in range(3):
        for batch in shardload.iter_batches(cut, batch_size=16, split="train", epoch=epoch):
            seen += len(batch["index"])
    series_chunks = -(-reader.geometry.series_length // reader.geometry.chunk_rows)
    assert series_chunks > 2 and seen > 3 * series_chunks
    assert len(calls) == len(set(calls))  # no chunk decoded twice
    assert len(calls) <= 2 * series_chunks  # two series arrays
    g = reader.geometry
    assert all(b - a == min(g.chunk_rows, g.series_length - a) for _, a, b in calls)  # whole


def test_decoded_cache_is_bounded(tmp_path, source, monkeypatch):
    import shardload.store.windows as windows

    cut = shardload.prepare(_cfg(source, tmp_path / "cut", compression="zstd"))
    monkeypatch.setattr(windows, "DECODED_BYTES_KEPT", 1)  # keeps one chunk at most
    full = {a: cut.read(a) for a in ("x", "y")}
    reader = cut.reader
    for batch in shardload.iter_batches(cut, batch_size=16, split="val", shuffle="uniform"):
        for a in ("x", "y"):
            np.testing.assert_array_equal(batch[a], full[a][batch["index"]])
        assert len(reader._decoded) <= 1
