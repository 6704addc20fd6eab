"""Opening a store by URL in few round trips (issue 28): the manifest, then every metadata file
the reader needs (each array's ``zarr.json`` or last chunk header, ``checksums.npz``) in one
concurrent batch, then the data. Counted by the latency-injecting proxy as the longest chain of
requests each sent after the previous one was answered (not a timed test). Before, the
metadata files came one after another: an epoch of a two-array store waited five round trips
or more before its data arrived, and a DataLoader worker (a pickled Store) three."""

from __future__ import annotations

import doctest
import pickle
import time
from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
import shardload.testing.latency
from _stores import make_store
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy

pytestmark = pytest.mark.timeout(120)

RTT_S = 0.1  # long beside a busy CPU's delays: a late thread is not a round trip
STORES = {
    # 2 shards per array: the first epoch fetches each whole (its checksum), all at once
    "zarr-shards": {"fmt": "zarr", "compression": "lz4", "chunk_rows": 8, "shard_chunks": 32},
    "zarr-chunks": {"fmt": "zarr", "compression": "zstd", "chunk_rows": 64},
    "npy": {"fmt": "npy", "chunk_rows": 64},
}
KW = {"batch_size": 64, "seed": 5, "split": None}


def test_round_trips_doctest() -> None:
    assert doctest.testmod(shardload.testing.latency).failed == 0


def check_epoch(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for b, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(b["index"], w["index"])
        np.testing.assert_array_equal(b["x"], w["x"])
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)


@pytest.mark.parametrize("kind", sorted(STORES))
def test_an_epoch_by_url_waits_three_round_trips(tmp_path, kind) -> None:
    """The whole epoch of a small store (one wave of data requests): the manifest, the
    metadata batch, the data. A worker given the opened Store (pickled): two."""
    store = make_store(tmp_path, n=512, **STORES[kind])
    want = list(shardload.iter_batches(store, **KW))
    with serving(tmp_path) as base:
        target = urlparse(base)
        list(shardload.iter_batches(f"{base}store", **KW))  # imports and page cache: warm
        with latency_proxy(target.hostname, target.port, rtt_s=RTT_S) as (proxy, port):
            url = f"http://127.0.0.1:{port}/store"
            opened = shardload.open_store(url)
            got = list(shardload.iter_batches(opened, **KW))
            parent = proxy.round_trips()
            check_epoch(got, want)
            worker = pickle.loads(pickle.dumps(opened))  # as a DataLoader worker gets it
            worker._pid = -1  # another process: its reader opens anew
            since = time.monotonic()
            got = list(shardload.iter_batches(worker, **KW))
            in_worker = proxy.round_trips(since=since)
    check_epoch(got, want)
    assert parent <= 3, (kind, parent, proxy.turns)
    assert in_worker <= 2, (kind, in_worker, proxy.turns)


@pytest.mark.parametrize("damage", ["missing", "garbage"])
@pytest.mark.parametrize("kind", ["zarr-shards", "npy"])
def test_a_checksum_file_fetched_at_open_is_still_required(tmp_path, kind, damage) -> None:
    """The checksum file comes with the manifest (or the metadata batch); one missing or
    unreadable on the server is still an error naming it at the first check, never rows
    served unchecked."""
    from shardload.errors import ShardloadError

    make_store(tmp_path, n=512, **STORES[kind])
    sums = tmp_path / "store" / "checksums.npz"
    if damage == "missing":
        sums.unlink()
    else:
        sums.write_bytes(b"PK\x03\x04 not an npz")
    with serving(tmp_path) as base:
        store = shardload.open_store(f"{base}store")
        with pytest.raises(ShardloadError, match=r"checksums\.npz") as err:
            list(shardload.iter_batches(store, **KW))
    assert ("missing" if damage == "missing" else "not readable") in str(err.value)
