"""Direct chunk reads of simple Zarr v3 arrays (formats/zarr_chunks.py) against zarr-python."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

import shardload
from _stores import check_values, make_store, sharded_store
from shardload.errors import ChunkReadError
from shardload.formats.zarr.chunks import plan_chunk_layout


@pytest.mark.parametrize("compression", ["none", "zstd", "lz4"])
def test_direct_reads_equal_zarr_python(tmp_path, compression):
    store = make_store(tmp_path, fmt="zarr", compression=compression, n=100, chunk_rows=7)
    reader = store.reader
    for name in store.arrays:
        assert reader.layout(name) is not None  # shardload's own layout: read directly
        info = store.manifest.arrays[name]
        for a, b in [(0, 100), (3, 5), (6, 8), (7, 14), (95, 100), (13, 13)]:
            out = np.empty((b - a, *info.row_shape), info.dtype)
            reader.read_into(name, a, b, out)
            np.testing.assert_array_equal(out, reader.read(name, a, b))  # zarr-python
    batches = list(shardload.iter_batches(store, batch_size=6, seed=3))
    for b in batches:
        check_values(store, b)


def test_sharded_store_is_read_natively(tmp_path):
    store = sharded_store(tmp_path, np.arange(60, dtype="f4"))
    layout = store.reader.layout("x")
    assert layout is not None and layout.shard is not None  # formats/zarr_shards.py
    idx = np.concatenate([b["index"] for b in shardload.iter_batches(store, batch_size=7)])
    assert sorted(idx.tolist()) == list(range(60))
    for b in shardload.iter_batches(store, batch_size=7):
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("damage", ["missing", "truncated"])
def test_missing_or_damaged_chunk_names_chunk_and_file(tmp_path, compression, damage):
    store = make_store(tmp_path, fmt="zarr", compression=compression, n=60, chunk_rows=7)
    path = tmp_path / "store" / "x" / "c" / "3" / "0"
    if damage == "missing":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ChunkReadError, match=r"chunk 3 .*x/c/3/0"):
        list(shardload.iter_batches(store, batch_size=5))


def test_plain_zarr_missing_chunk_is_fill_value(tmp_path):
    root = tmp_path / "plain.zarr"
    ds = xr.Dataset({"a": (("t", "f"), np.ones((40, 3), "f4"))}).chunk({"t": 10})
    ds.to_zarr(root, zarr_format=3, encoding={"a": {"compressors": None}}, consolidated=False)
    (root / "a" / "c" / "2" / "0").unlink()
    store = shardload.open_store(str(root))
    if store.reader.layout("a") is None:
        pytest.skip("xarray wrote a layout the direct reader does not take")
    out = np.empty((40, 3), "f4")
    store.reader.read_into("a", 0, 40, out)
    np.testing.assert_array_equal(out, store.reader.read("a", 0, 40))
    assert np.isnan(out[20:30]).all() and (out[:20] == 1).all()  # xarray's fill value: NaN


META = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [20, 3],
    "data_type": "float32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 3]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0.0,
    "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
}


@pytest.mark.parametrize(
    ("change", "simple"),
    [
        ({}, True),
        ({"codecs": [*META["codecs"], {"name": "blosc", "configuration": {}}]}, True),
        ({"codecs": [*META["codecs"], {"name": "zstd", "configuration": {}}]}, False),
        ({"codecs": [{"name": "sharding_indexed", "configuration": {}}]}, False),
        ({"codecs": [{"name": "transpose"}, *META["codecs"]]}, False),
        ({"chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [8, 1]}}}, False),
        ({"chunk_key_encoding": {"name": "v2"}}, False),
        ({"data_type": "int32"}, False),
        ({"zarr_format": 2}, False),
        ({"storage_transformers": [{"name": "x"}]}, False),
    ],
)
def test_layout_only_for_simple_metadata(change, simple):
    layout = plan_chunk_layout(
        {**META, **change},
        folder="/s/x",
        dtype=np.dtype("f4"),
        shape=(20, 3),
        chunk_bounds=[0, 8, 16, 20],
        strict=True,
    )
    assert (layout is not None) == simple
    if simple:
        assert layout.chunk_path(2) == "/s/x/c/2/0"
    other_bounds = plan_chunk_layout(
        META,
        folder="/s/x",
        dtype=np.dtype("f4"),
        shape=(20, 3),
        chunk_bounds=[0, 10, 20],
        strict=True,
    )
    assert other_bounds is None


def test_whole_file_reads_land_in_page_aligned_buffers(tmp_path):
    """The kernel copies a file into a buffer 16 bytes into a page (where ``np.empty`` starts
    a large array) at 3-4x the CPU of an aligned one: the compressed chunk's scratch and the
    loader's group buffers are page-aligned."""
    from concurrent.futures import ThreadPoolExecutor

    from shardload.formats.base import READ_ALIGN, aligned_empty
    from shardload.formats.zarr import chunks as zarr_chunks
    from shardload.load.reader import BufferPool

    for n in (1, 4095, 3 << 20):
        a = aligned_empty(n)
        assert a.nbytes == n and a.ctypes.data % READ_ALIGN == 0 and a.flags.writeable
    pool = BufferPool(keep=1)
    first = pool.take("x", (1000, 3), np.dtype("f4"))
    assert first.ctypes.data % READ_ALIGN == 0
    pool.give("x", first)
    again = pool.take("x", (900, 3), np.dtype("f4"))  # the same memory, reused
    assert again.ctypes.data % READ_ALIGN == 0 and again.shape == (900, 3)
    store = make_store(tmp_path, fmt="zarr", compression="zstd", n=64, chunk_rows=16)

    def read() -> int:  # in a fresh thread: its own scratch
        out = np.empty((16, *store.manifest.arrays["x"].row_shape), "f4")
        store.reader.read_into("x", 0, 16, out)
        return int(zarr_chunks._SCRATCH.buf.ctypes.data)

    with ThreadPoolExecutor(1) as ex:
        assert ex.submit(read).result() % READ_ALIGN == 0
