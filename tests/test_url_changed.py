"""A file read by URL and checked against its checksum, then rewritten on the server, is an
error at the next range read of it, never its new values (issue 28): every request for a file
a reader has read carries a precondition on the version first read (``If-Match`` with the
server's ETag: ``move/pinned.py``), on the same request, and the server refuses it (412).

The store is uncompressed, so a row's bytes can be changed in place (same size) and every
check but the checksum passes: before, a later read of a few rows by range requests (not
hashed: the file was checked) returned the changed values."""

from __future__ import annotations

import os

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError, RemoteChangedError
from shardload.formats.zarr.kept import KEEP_ENV
from test_url_shard_fetch import served_url

pytestmark = pytest.mark.timeout(120)

KW = {"batch_size": 32, "split": None, "shuffle_chunks": 64}
ROW = 300  # a row of the second shard / a later chunk file


def store_of(tmp_path, fmt: str):
    if fmt == "zarr":  # the default layout: shards of inner chunks
        make_store(tmp_path, fmt="zarr", n=1024, chunk_rows=8, shard_chunks=32)
    else:
        make_store(tmp_path, fmt="npy", n=1024, chunk_rows=64)
    return tmp_path


def rewrite_row(root, row: int, *, keep_mtime: bool, later_s: int = 0) -> np.ndarray:
    """Row ``row`` of array x changed in its file on the server, the file's size kept (and
    its mtime, if ``keep_mtime``; else ``later_s`` seconds after the old one at least): the
    new row."""
    local = shardload.open_store(root / "store")
    old = np.ascontiguousarray(local.read("x", row, row + 1))
    new = old + np.float32(1000)
    hits = []
    for p in (root / "store" / "x").rglob("*"):
        if p.is_file() and old.tobytes() in p.read_bytes():
            hits.append(p)
    assert len(hits) == 1, hits
    path, st = hits[0], hits[0].stat()
    data = path.read_bytes()
    path.write_bytes(data.replace(old.tobytes(), new.tobytes()))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    elif later_s:
        os.utime(path, (st.st_atime, max(path.stat().st_mtime, st.st_mtime + later_s)))
    assert path.stat().st_size == st.st_size
    return new


@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_a_file_rewritten_after_its_check_is_an_error_at_a_range_read(
    tmp_path, monkeypatch, fmt
) -> None:
    monkeypatch.setenv(KEEP_ENV, "0")  # no checked bytes kept: later reads are range requests
    root = store_of(tmp_path, fmt)
    with served_url(root) as (url, seen):
        store = shardload.open_store(url)
        for _ in shardload.iter_batches(store, epoch=0, seed=3, **KW):
            pass  # every file read whole and checked
        want = np.asarray(store.read("x", ROW, ROW + 2))
        seen.clear()
        np.testing.assert_array_equal(store.read("x", ROW, ROW + 2), want)
        ranged = [s for m, p, s in seen if "/x/" in p]
        assert ranged and set(ranged) == {206}, seen  # range requests, not a check again
        assert not [m for m, *_ in seen if m != "GET"], seen  # and no request more for them
        rewrite_row(root, ROW, keep_mtime=False)
        seen.clear()
        with pytest.raises(RemoteChangedError, match=r"changed on the server since") as err:
            store.read("x", ROW, ROW + 2)
        assert url in str(err.value)
        assert isinstance(err.value, ChunkReadError)  # as a checksum mismatch is
        assert [s for m, p, s in seen if "/x/" in p] == [412], seen
