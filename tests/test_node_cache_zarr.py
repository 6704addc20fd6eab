"""A Zarr store (the default format) read through the node cache (issue 28): its cached chunk
files and shards (and a Parquet store's chunk files) are trusted across processes by their
records, as an npy stack's are (no whole-file read and hash in each new process), raw chunks
are read from the copies without reading them whole, and a copy changed on disk, or a store
changed on the server, is never served silently."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.errors import ChunkReadError
from shardload.move.cache import SUM_SUFFIX

sys.path.insert(0, str(Path(__file__).parent))
from _stores import make_store
from test_node_cache import data_files, epoch_rows, serving, warm_epoch_opens
from test_node_cache_trust import later_epoch_hashes

#: Zarr layouts: raw chunk files (read in place), Blosc chunk files, Blosc shards.
LAYOUTS = {
    "raw": dict(compression="none"),
    "lz4": dict(compression="lz4"),
    "shards": dict(compression="zstd", shard_chunks=2),
}


def zarr_store(tmp_path: Path, layout: str) -> Path:
    make_store(tmp_path / "src", fmt="zarr", n=203, chunk_rows=7, name="store", **LAYOUTS[layout])
    return tmp_path / "src" / "store"


def copy_of(cache: Path, rel: str) -> Path:
    """The cached copy of the store file ``rel`` (found by its record's URL)."""
    (rec,) = [q for q in cache.glob("*" + SUM_SUFFIX) if q.read_text().find(f'/{rel}"') >= 0]
    return cache / rec.name.removesuffix(SUM_SUFFIX)


def rewrite_in_place(path: Path) -> None:
    """Change a file's last 8 bytes, keeping its inode, size and mtime (its ctime moves)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(-8, os.SEEK_END)
        f.write(bytes(255 - b for b in path.read_bytes()[-8:]))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("layout", [*LAYOUTS, "parquet"])
def test_a_later_epoch_in_a_new_process_hashes_no_zarr_copy(tmp_path: Path, layout: str) -> None:
    """Epoch 2 of a Zarr (or Parquet) store in a new process (a new DataLoader worker or
    rank): every copy's record vouches for it; no cached file is hashed (each was read whole
    and hashed once per process before), no data request, the right rows."""
    if layout == "parquet":
        pytest.importorskip("pyarrow")
        make_store(tmp_path / "src", fmt="parquet", n=203, chunk_rows=7, name="store")
        root = tmp_path / "src" / "store"
    else:
        root = zarr_store(tmp_path, layout)
    hashed = later_epoch_hashes(tmp_path, root)
    assert hashed == 0, f"{hashed} whole-file hashes of cached Zarr copies in a later process"


def test_raw_zarr_rows_come_from_the_copies_unhashed(tmp_path: Path) -> None:
    """An uncompressed Zarr array through the cache in a later process: its rows are read from
    the copies (no chunk file read whole out of the cache), each copy checked by its record
    (none hashed), as the local reader reads its folder."""
    import shardload.move.cache as node_cache

    root = zarr_store(tmp_path, "raw")
    local = shardload.open_store(root)
    read: list[str] = []  # the store files read out of their copies
    read_range = node_cache.read_range

    def counted(fd: int, start: int | None, end: int | None) -> bytes:
        copy = os.readlink(f"/proc/self/fd/{fd}")
        read.append(json.loads(Path(copy + SUM_SUFFIX).read_text())["url"].split("/store/")[1])
        return read_range(fd, start, end)

    with serving(tmp_path / "src") as srv:
        url, cache = f"{srv.url}/store", tmp_path / "cache"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        store = shardload.open_store(url, cache_dir=cache)
        node_cache.read_range = counted  # type: ignore[assignment]
        try:
            n, x = epoch_rows(store, 1)
        finally:
            node_cache.read_range = read_range  # type: ignore[assignment]
    assert n == len(local) and np.array_equal(x, local.read("x", 0, len(local)))
    assert set(read).isdisjoint(data_files(root)), "chunk files read out of the cache"
    assert store.reader.verifier.hashed == 0 and store.reader.verifier.vouched > 0


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_a_rewritten_zarr_copy_is_fetched_again(tmp_path: Path, layout: str) -> None:
    """A cached chunk or shard changed in place after it was recorded, its size and mtime put
    back: its ctime moved, so the record no longer vouches for it; a new process hashes it,
    drops it and fetches it again, never serving its bytes."""
    root = zarr_store(tmp_path, layout)
    local = shardload.open_store(root)
    cache = tmp_path / "cache"
    rel = data_files(root)[1]  # a chunk (or shard) file of x
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        rewrite_in_place(copy_of(cache, rel))
        before = len(srv.paths)
        store = shardload.open_store(url, cache_dir=cache)
        n, x = epoch_rows(store, 1)
        assert n == len(local) and np.array_equal(x, local.read("x", 0, len(local)))
        assert [p.split("/", 2)[-1] for p in srv.data_requests(before)] == [rel]
        assert store.fs.node_cache.stats["refetched"] == 1


@pytest.mark.parametrize("layout", ["raw", "shards"])
def test_a_zarr_store_changed_on_the_server_is_refused_by_name(tmp_path: Path, layout: str) -> None:
    """A cached copy that no longer matches the store's checksum is fetched again; when the
    server's file changed too, the fetched bytes are refused with an error naming the file,
    never served."""
    root = zarr_store(tmp_path, layout)
    cache = tmp_path / "cache"
    rel = data_files(root)[1]
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        rewrite_in_place(copy_of(cache, rel))
        rewrite_in_place(root / rel)  # the store on the server changed under its checksums
        with pytest.raises(ChunkReadError, match=rel.replace("/", ".")):
            epoch_rows(shardload.open_store(url, cache_dir=cache), 1)


def test_a_warm_epoch_reads_nothing_ahead(tmp_path: Path, monkeypatch) -> None:
    """Epoch 2, every file of it in an unbounded cache (nothing can evict them): the cache's
    read-ahead, which opened and checked each copy once more before its read, does not run."""
    root = zarr_store(tmp_path, "raw")
    local = shardload.open_store(root)
    with serving(tmp_path / "src") as srv:
        n, x, opens = warm_epoch_opens(f"{srv.url}/store", tmp_path / "cache", monkeypatch)
    ahead = [path for path, is_ahead in opens if is_ahead]
    assert n == len(local) and np.array_equal(x, local.read("x", 0, len(local)))
    assert ahead == []
