"""A later epoch of a sharded store opened once by URL (the default layout) fetches no more than
its first (issue 28): the first epoch fetches each shard whole for its checksum; a later one,
whose groups need a dense share of every shard, fetches each shard whole again in one request,
shared by the group calls in flight together and checked again, instead of range requests that
each group made for itself (before: twice the store's bytes for two groups).

Requests counted at ``shardload serve``'s access log behind a latency proxy, bytes at the
client (``shardload.move.remote.read_bytes``)."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardload
import shardload.move.remote as remote
from _stores import make_store
from shardload.errors import ChunkReadError
from test_url_shard_fetch import data_requests, served_url

pytestmark = pytest.mark.timeout(120)

#: 4 shards of 32 inner chunks of 8 rows per array; groups of 64 inner chunks: two groups an
#: epoch, each half of every shard (as the default store of 16,384 rows by URL)
KW = {"batch_size": 32, "split": None, "shuffle_chunks": 64}


@pytest.fixture
def sharded(tmp_path):
    make_store(tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32)
    return tmp_path


def epoch(store, e: int, local) -> None:
    got = list(shardload.iter_batches(store, epoch=e, seed=3, **KW))
    assert len(got) == len(local[e])
    for b, want in zip(got, local[e], strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))


@pytest.fixture
def fetched(monkeypatch) -> list[int]:
    """Bytes of data files (``/c/``) the client fetched, request by request (every read of a
    store by URL, as bytes or as a view, is a ``RemoteFileSystem.cat_file``)."""
    got: list[int] = []
    cat_file = remote.RemoteFileSystem.cat_file

    def counted(fs, path, *args, **kw):
        data = cat_file(fs, path, *args, **kw)
        if "/c/" in str(path):
            got.append(len(data))
        return data

    monkeypatch.setattr(remote.RemoteFileSystem, "cat_file", counted)
    return got


def shard_bytes(root) -> int:
    return sum(p.stat().st_size for p in (root / "store").glob("*/c/*/*") if p.is_file())


def test_a_later_epoch_fetches_no_more_than_the_first(sharded, fetched) -> None:
    root = sharded
    local = [
        [b["index"] for b in shardload.iter_batches(root / "store", epoch=e, seed=3, **KW)]
        for e in range(3)
    ]
    with served_url(root) as (url, seen):
        store = shardload.open_store(url)
        epoch(store, 0, local)
        first, first_bytes = data_requests(seen), sum(fetched)
        for e in (1, 2):
            seen.clear()
            fetched.clear()
            epoch(store, e, local)
            later = data_requests(seen)
            assert sum(later.values()) <= sum(first.values()), (later, first)
            assert sum(fetched) <= first_bytes == shard_bytes(root), (sum(fetched), first_bytes)


@pytest.mark.parametrize("keep_mtime", [False, True])
@pytest.mark.parametrize("where", ["data", "index"])
def test_a_byte_flipped_between_epochs_is_an_error(sharded, where, keep_mtime) -> None:
    """The shard fetched again in a later epoch is checked again: a byte changed on the server
    after the first epoch's check is an error naming the shard, never a wrong value (before:
    the later epoch's range requests were not checked, and served the changed chunk's values;
    the index, checked once and kept, was not read again). The request carries If-Match on
    the version checked, refused by the server (412); with the file's mtime put back (the
    same ETag: ``shardload serve``'s is mtime and size) the checksum catches it."""
    root = sharded
    local = [
        [b["index"] for b in shardload.iter_batches(root / "store", epoch=e, seed=3, **KW)]
        for e in range(2)
    ]
    path = root / "store" / "x" / "c" / "1" / "0"
    with served_url(root) as (url, _):
        store = shardload.open_store(url)
        epoch(store, 0, local)
        data = bytearray(path.read_bytes())
        at = len(data) // 2 if where == "data" else len(data) - 20  # a chunk's bytes, the index
        data[at] ^= 0x01
        st = path.stat()
        path.write_bytes(bytes(data))
        if keep_mtime:
            os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        said = r"shard 1 of array 'x' is corrupt" if keep_mtime else r"/x/c/1/0 changed on the"
        with pytest.raises(ChunkReadError, match=said):
            epoch(store, 1, local)
