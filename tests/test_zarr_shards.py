"""Native reads of Zarr v3 shards of small chunks (formats/zarr_shards.py) against zarr-python."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest

import shardload
from _stores import check_values, make_store, sharded_store
from shardload.errors import ChunkReadError, ShardloadError
from shardload.formats.zarr.chunks import plan_chunk_layout
from shardload.formats.zarr.shards import ShardIndexCache

zarr = pytest.importorskip("zarr")


def _zarr_store(root: Path, *, n: int, compressed: bool, where: str = "end") -> np.ndarray:
    """A plain Zarr v3 group written by zarr-python: array ``a`` (n, 3) float32 in shards of
    32 rows holding inner chunks of 8, fill value -1.5, some inner chunks and the whole
    third shard left at the fill value (zarr writes no bytes for them)."""
    from zarr.codecs import BloscCodec

    x = np.arange(n * 3, dtype="f4").reshape(n, 3)
    x[8:16] = -1.5  # an empty inner chunk
    x[64:96] = -1.5  # an empty shard (no file)
    group = zarr.open_group(str(root), mode="w", zarr_format=3)
    arr = group.create_array(
        "a",
        shape=x.shape,
        chunks=(8, 3),
        shards={"shape": (32, 3), "index_location": where},
        dtype="f4",
        fill_value=-1.5,
        dimension_names=("t", "f"),
        compressors=BloscCodec(cname="zstd", clevel=3, shuffle="shuffle") if compressed else None,
    )
    arr[:] = x
    return x


@pytest.mark.parametrize("where", ["end", "start"])
@pytest.mark.parametrize("n", [128, 101])  # whole shards; a partial last shard and inner chunk
@pytest.mark.parametrize("compressed", [True, False])
def test_zarr_python_shards_read_natively_equal_zarr_python(tmp_path, compressed, n, where):
    root = tmp_path / "plain.zarr"
    x = _zarr_store(root, n=n, compressed=compressed, where=where)
    assert not (root / "a" / "c" / "2" / "0").exists()  # zarr left the fill-value shard out
    store = shardload.open_store(str(root))
    reader = store.reader
    layout = reader.layout("a")  # type: ignore[attr-defined]
    assert layout is not None and layout.shard is not None  # the native path
    assert (layout.shard.chunks, layout.shard.index_at_end) == (4, where == "end")
    arr = zarr.open_array(str(root), path="a", mode="r")
    rng = np.random.default_rng(n)
    ranges = [(0, n), (n - 1, n), (7, 9), (31, 33), (60, 100)]
    ranges += [tuple(sorted(rng.integers(0, n + 1, 2).tolist())) for _ in range(60)]
    for a, b in ranges:
        out = np.full((b - a, 3), np.nan, "f4")
        reader.read_into("a", a, b, out)
        np.testing.assert_array_equal(out, arr[a:b])  # zarr-python's own reading
        np.testing.assert_array_equal(out, x[a:b])
    assert 0 < len(reader._indexes) <= -(-n // 32)  # type: ignore[attr-defined]


def test_index_cache_is_bounded():
    cache = ShardIndexCache(max_bytes=3 * 64)
    for k in range(10):
        cache.put(f"s{k}", np.zeros((4, 2), np.uint64))  # 64 bytes each
    assert len(cache) == 3 and cache.get("s9") is not None and cache.get("s0") is None


META = {
    "zarr_format": 3,
    "node_type": "array",
    "shape": [100, 3],
    "data_type": "float32",
    "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [32, 3]}},
    "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
    "fill_value": 0.0,
    "codecs": [
        {
            "name": "sharding_indexed",
            "configuration": {
                "chunk_shape": [8, 3],
                "codecs": [{"name": "bytes", "configuration": {"endian": "little"}}],
                "index_codecs": [
                    {"name": "bytes", "configuration": {"endian": "little"}},
                    {"name": "crc32c"},
                ],
                "index_location": "end",
            },
        }
    ],
}


def _sharding(meta):
    return meta["codecs"][0]["configuration"]


def _unusual(meta):
    """Variants the native reader must leave to zarr-python."""
    out = []
    m = copy.deepcopy(meta)
    _sharding(m)["codecs"].insert(0, {"name": "transpose", "configuration": {"order": [1, 0]}})
    out.append(m)
    m = copy.deepcopy(meta)  # nested shards
    _sharding(m)["codecs"] = [copy.deepcopy(meta["codecs"][0])]
    out.append(m)
    m = copy.deepcopy(meta)  # inner chunks split columns
    _sharding(m)["chunk_shape"] = [8, 1]
    out.append(m)
    m = copy.deepcopy(meta)  # inner chunks do not tile the shard
    _sharding(m)["chunk_shape"] = [7, 3]
    out.append(m)
    m = copy.deepcopy(meta)  # another index checksum
    _sharding(m)["index_codecs"][1] = {"name": "adler32"}
    out.append(m)
    m = copy.deepcopy(meta)  # big-endian index
    _sharding(m)["index_codecs"][0]["configuration"]["endian"] = "big"
    out.append(m)
    m = copy.deepcopy(meta)
    _sharding(m)["codecs"].append({"name": "gzip", "configuration": {"level": 1}})
    out.append(m)
    m = copy.deepcopy(meta)  # sharding after another codec
    m["codecs"].insert(0, {"name": "transpose", "configuration": {"order": [1, 0]}})
    out.append(m)
    return out


def test_plan_accepts_plain_shards_and_refuses_anything_else():
    kw = {"folder": "/s/a", "dtype": np.dtype("f4"), "shape": (100, 3), "strict": True}
    bounds = [*range(0, 100, 8), 100]
    layout = plan_chunk_layout(META, chunk_bounds=bounds, shards=True, **kw)
    assert layout is not None and layout.chunk_rows == 8 and layout.shard is not None
    assert (layout.shard.chunks, layout.shard.index_crc, layout.shard.index_nbytes) == (4, True, 68)
    assert plan_chunk_layout(META, chunk_bounds=bounds, **kw) is None  # the writer's: no shards
    no_crc = copy.deepcopy(META)
    del _sharding(no_crc)["index_codecs"][1]
    layout = plan_chunk_layout(no_crc, chunk_bounds=bounds, shards=True, **kw)
    assert layout is not None and layout.shard is not None and not layout.shard.index_crc
    for m in _unusual(META):
        assert plan_chunk_layout(m, chunk_bounds=bounds, shards=True, **kw) is None, m
    # the manifest's chunks must be the inner chunks
    assert plan_chunk_layout(META, chunk_bounds=[0, 32, 64, 96, 100], shards=True, **kw) is None


# -- shardload's own sharded stores ---------------------------------------------------------------
@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("sharded")
    make_store(tmp, fmt="zarr", compression="zstd", n=203, chunk_rows=7, shard_chunks=4)
    return tmp / "store"


def test_prepare_shards_read_natively_same_batches(sharded):
    store = shardload.open_store(sharded)
    reader = store.reader
    for name in store.arrays:
        layout = reader.layout(name)  # type: ignore[attr-defined]
        assert layout is not None and layout.shard is not None and layout.strict
        info = store.manifest.arrays[name]
        for a, b in [(0, 203), (3, 5), (27, 29), (26, 58), (200, 203)]:
            out = np.empty((b - a, *info.row_shape), info.dtype)
            reader.read_into(name, a, b, out)
            np.testing.assert_array_equal(out, reader._read_zarr(name, a, b))  # type: ignore[attr-defined]
    batches = list(shardload.iter_batches(store, batch_size=6, seed=3))
    assert sorted(np.concatenate([b["index"] for b in batches]).tolist()) == list(range(203))
    for b in batches:
        check_values(store, b)


def test_prepare_writes_shards_of_zeros(tmp_path):
    """zarr-python leaves out chunks equal to the fill value: a shard of zeros had no file and
    prepare failed hashing it; every shard and inner chunk is written now."""
    a = np.arange(60, dtype="f4")
    a[8:16] = 0  # one inner chunk of zeros
    a[32:48] = 0  # one shard of zeros
    store = sharded_store(tmp_path, a, name="s")
    np.testing.assert_array_equal(store.read("x")[:, 0], a)
    for k in range(4):
        raw = (tmp_path / "s" / "x" / "c" / str(k) / "0").read_bytes()
        index = np.frombuffer(raw[-(2 * 16 + 4) : -4], "<u8")
        assert (index != 2**64 - 1).all(), k  # no empty inner chunk


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))


SHARD = 1  # rows 28..55: chunks 4..7


@pytest.mark.parametrize("damage", ["inner", "header", "index", "truncated", "deleted"])
@pytest.mark.parametrize("verify", ["auto", "never"])
def test_damaged_shard_is_an_error_naming_it(sharded, tmp_path, damage, verify):
    root = tmp_path / "store"
    shutil.copytree(sharded, root)
    with shardload.open_store(root, verify="always") as s:
        want = s.read("x")
    path = root / "x" / "c" / str(SHARD) / "0"
    raw = path.read_bytes()
    first = int(np.frombuffer(raw[-68:-4], "<u8")[0])  # inner chunk 0's offset
    if damage == "inner":
        _flip(path, first + 40)  # inside the compressed bytes
    elif damage == "header":
        _flip(path, first + 5)  # the Blosc header's decoded size
    elif damage == "index":
        _flip(path, len(raw) - 68 + 17)  # inner chunk 1's offset
    elif damage == "truncated":
        path.write_bytes(raw[: len(raw) // 2])
    else:
        path.unlink()
    s = shardload.open_store(root, verify=verify)
    assert s.reader.layout("x").shard is not None  # type: ignore[attr-defined]
    if verify == "never" and damage == "inner":
        # without checksums only zstd's own framing can notice: an error or, at worst, other
        # values of that chunk; never anything outside it
        try:
            got = s.read("x")
        except ChunkReadError as exc:
            assert str(path) in str(exc)
        else:
            ok = np.ones(len(want), bool)
            ok[SHARD * 28 : SHARD * 28 + 7] = False
            np.testing.assert_array_equal(got[ok], want[ok])
        return
    with pytest.raises(ShardloadError) as err:
        s.read("x")
    assert str(path) in str(err.value) and "'x'" in str(err.value)
    if verify == "auto" and damage != "deleted":
        assert "checksum" in str(err.value)  # the store's checksums caught it first
    elif damage == "index":
        assert "crc32c" in str(err.value)
    elif damage == "deleted":
        assert "shard 1" in str(err.value) and "missing" in str(err.value)
    elif damage == "header":
        assert "inner chunk 0 of shard 1" in str(err.value)


def test_plain_zarr_damaged_index_and_missing_shard(tmp_path):
    root = tmp_path / "plain.zarr"
    x = _zarr_store(root, n=128, compressed=True)
    (root / "a" / "c" / "1" / "0").unlink()  # a foreign store: the fill value, as zarr reads it
    store = shardload.open_store(str(root))
    got = store.read("a")
    np.testing.assert_array_equal(got[32:64], np.full((32, 3), -1.5, "f4"))
    np.testing.assert_array_equal(got[:32], x[:32])
    path = root / "a" / "c" / "0" / "0"
    _flip(path, path.stat().st_size - 10)
    with pytest.raises(ChunkReadError, match=r"shard 0 of array 'a' is corrupt.*crc32c") as err:
        shardload.open_store(str(root)).read("a")
    assert str(path) in str(err.value)


@pytest.mark.parametrize("ctx", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_read_shards(sharded, ctx):
    from shardload.torch import StreamingDataLoader, StreamingDataset

    store = shardload.open_store(sharded)
    store.read("x")  # the parent's reader holds parsed indexes when the workers fork
    ds = StreamingDataset(store, batch_size=8, seed=1)
    seen = []
    for b in StreamingDataLoader(ds, num_workers=2, multiprocessing_context=ctx):
        check_values(store, {k: np.asarray(v) for k, v in b.items()})
        seen += np.asarray(b["index"]).tolist()
    assert sorted(seen) == list(range(203))


def test_shards_by_url_through_the_whole_file_cache(tmp_path):
    """A URL with a whole-file cache reads shards natively through the filesystem's opener."""
    pytest.importorskip("aiohttp")
    from shardload.move.serve import serving

    x = _zarr_store(tmp_path / "plain", n=101, compressed=True)
    with serving(tmp_path) as url:
        store = shardload.open_store(url + "plain", cache_dir=tmp_path / "cache")
        layout = store.reader.layout("a")  # type: ignore[attr-defined]
        assert layout is not None and layout.shard is not None and layout.opener is not None
        np.testing.assert_array_equal(store.read("a", 5, 90), x[5:90])
        np.testing.assert_array_equal(store.read("a"), x)


@pytest.mark.parametrize("n", [60, 53])  # whole shards; a short last shard and inner chunk
def test_prepare_writes_the_shard_bytes_zarr_python_writes(tmp_path, monkeypatch, n):
    """prepare encodes whole shards itself (formats/zarr/shard_write.py; zarr-python cost
    about 0.7 ms per inner chunk): no row goes through zarr-python's ``Array.__setitem__``, and
    each shard file is byte for byte what zarr-python writes for the same rows and metadata."""
    a = np.arange(n, dtype="f4") * 0.5
    a[8:16] = 0  # an inner chunk of zeros: written, as zarr-python does with empty chunks on

    setitem = zarr.Array.__setitem__

    def refuse(self, key, value):  # the coordinate arrays beside it still go through zarr
        if self.path == "x":
            raise AssertionError("a shard written through zarr-python")
        setitem(self, key, value)

    with monkeypatch.context() as m:
        m.setattr(zarr.Array, "__setitem__", refuse)
        store = sharded_store(tmp_path, a, name="s")
    root = tmp_path / "s"
    shutil.copytree(root / "x", tmp_path / "again" / "x")
    (tmp_path / "again" / "zarr.json").write_text((root / "zarr.json").read_text())
    for f in (tmp_path / "again" / "x" / "c").rglob("*"):
        if f.is_file():
            f.unlink()
    arr = zarr.open_array(str(tmp_path / "again"), path="x", mode="r+")
    arr.with_config({"write_empty_chunks": True})[:] = store.read("x")
    ours = sorted(p.relative_to(root / "x") for p in (root / "x" / "c").rglob("*") if p.is_file())
    assert len(ours) == -(-n // 16)
    for rel in ours:
        assert (root / "x" / rel).read_bytes() == (tmp_path / "again" / "x" / rel).read_bytes()
    np.testing.assert_array_equal(arr[:][:, 0], a)


@pytest.mark.parametrize("dtype", ["f4", "f8", "u1", "i2", "bool", "M8[ns]"])
@pytest.mark.parametrize("shuffle", ["shuffle", "noshuffle", "bitshuffle"])
def test_shard_encoder_gives_blosc_encode_bytes(dtype, shuffle):
    """The shard writer's Blosc encoder (no per-call checks: 8,193 inner chunks of a 9.3 M-sample
    array cost 0.23 s through ``Blosc.encode``, 0.08 s without) gives ``Blosc.encode``'s bytes,
    the type size included, for every dtype a store holds."""
    from shardload.formats.zarr.chunks import blosc_codec
    from shardload.formats.zarr.shard_write import blosc_encoder

    cfg = {"cname": "lz4", "clevel": 5, "shuffle": shuffle, "blocksize": 0}
    rng = np.random.default_rng(1)
    a = (rng.normal(size=(1139, 3)) * 100).astype(dtype)
    encode, codec = blosc_encoder(cfg), blosc_codec(cfg)
    assert encode(a) == bytes(codec.encode(a))
    assert encode(a[5:17]) == bytes(codec.encode(a[5:17]))  # an inner chunk of a shard


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_shard_written_without_a_joined_copy(tmp_path, monkeypatch, compression):
    """A whole shard goes to its file as the encoded inner chunks themselves (``writev``), never
    joined into one more copy of the shard: Python allocates well under twice the shard's size
    while writing it (a joined copy made it 2x), and the file holds the bytes zarr-python writes
    for the same rows, also when the kernel takes them a few bytes per call."""
    import os
    import tracemalloc

    from shardload.formats.base import FormatOptions
    from shardload.formats.zarr.write import ZarrWriter
    from shardload.manifest.core import ArraySpec
    from shardload.plan.chunks import RegularBounds

    n, rows = 4096, 64
    x = np.random.default_rng(0).normal(size=(n, 64)).astype("f4")
    bounds = RegularBounds(n, rows)
    writer, root = ZarrWriter(), tmp_path / "s"
    spec = {"x": ArraySpec("x", (n, 64), np.dtype("f4"))}
    writer.create(root, spec, bounds, FormatOptions(compression, None, n // rows))
    tracemalloc.start()
    try:
        writer.write_block(root, "x", 0, 0, x, bounds=bounds)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 1.5 * x.nbytes
    shard = (root / "x" / "c" / "0" / "0").read_bytes()

    writev = os.writev
    calls = []

    def trickle(fd, buffers):  # a short write per call: the writer must go on where it stopped
        calls.append(len(buffers))
        return writev(fd, [bytes(memoryview(buffers[0]).cast("B")[:7])])

    monkeypatch.setattr(os, "writev", trickle)
    writer.write_block(root, "x", 0, 0, x, bounds=bounds)
    monkeypatch.undo()
    assert len(calls) > 1 and (root / "x" / "c" / "0" / "0").read_bytes() == shard
    writer.finish(root)
    arr = zarr.open_array(str(root), path="x", mode="r+")
    (root / "x" / "c" / "0" / "0").unlink()
    arr.with_config({"write_empty_chunks": True})[:] = x
    assert (root / "x" / "c" / "0" / "0").read_bytes() == shard
