"""Opening a store by URL in few round trips (issue 28): the manifest, then every metadata file
the reader needs (each array's ``zarr.json`` or last chunk header, ``checksums.npz``) in one
concurrent batch, then the data. Counted by the latency-injecting proxy as the longest chain of
requests each sent after the previous one was answered (not a timed test). Before, the
metadata files came one after another: an epoch of a two-array store waited five round trips
or more before its data arrived, and a DataLoader worker (a pickled Store) three."""

from __future__ import annotations

import doctest
import pickle
import shutil
import time
import urllib.request
from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
import shardload.testing.latency
from _stores import make_store
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy
from test_url_requests import access_log

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
    assert in_worker <= 1, (kind, in_worker, proxy.turns)


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


def _worker_requests(tmp_path, kind: str, context: str) -> tuple[list[str], list[str]]:
    """A StreamingDataLoader of one ``context`` worker over a store opened by URL in the main
    process (its epoch checked): the paths its worker asked the server for, and the store's
    data files (chunk and shard files; not the manifest, checksums or metadata)."""
    from shardload.torch import StreamingDataLoader, StreamingDataset

    store = make_store(tmp_path, n=512, **STORES[kind])
    want = sorted(int(i) for b in shardload.iter_batches(store, **KW) for i in b["index"])
    root = tmp_path / "store"
    files = sorted(
        f"/store/{p.relative_to(root).as_posix()}"
        for a in ("x", "y")
        for p in (root / a).rglob("*")
        if p.is_file() and p.name != "zarr.json"
    )
    with access_log() as seen, serving(tmp_path) as base:
        opened = shardload.open_store(f"{base}store")
        ds = StreamingDataset(opened, **KW)  # sizes its reads: the main process's reader
        loader = StreamingDataLoader(ds, num_workers=1, multiprocessing_context=context)
        since = _settled(seen, base)  # the requests answered from here on are the worker's
        got = list(loader)
    rows = sorted(int(i) for b in got for i in b["index"])
    assert rows == want
    for b in got:
        np.testing.assert_array_equal(b["y"][:, 0].numpy(), b["index"].numpy() * 10)
    return sorted(p for m, p, _ in seen[since:] if m == "GET"), files


def _settled(seen: list[tuple[str, str, int]], base: str) -> int:
    """How many requests the server has logged once every request made so far is logged: the
    server logs a request after answering it, so the main process's last ones (its feature
    files, read for the dataset's fingerprint) may be logged after it went on. One more
    request, logged after those, marks the point (a CI run had taken one for the worker's)."""
    mark = "/store/shardload.json?settled"
    with urllib.request.urlopen(f"{base}store/shardload.json?settled") as r:
        r.read()
    deadline = time.monotonic() + 30
    while not any(p == mark for _, p, _ in seen) and time.monotonic() < deadline:
        time.sleep(0.01)
    return len(seen)


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_forked_dataloader_worker_fetches_no_metadata(tmp_path, kind) -> None:
    """A DataLoader worker gets the store with what the main process read of its metadata
    (each array's zarr.json, the npy last chunk headers, the checksum file): it asks the
    server for its data files only, each once, so its first batch waits for no metadata round
    trip. (Its round trips in turn are not counted here: on a loaded CPU the loader may start
    a later group's read after the first answers, a second wave of data, not metadata.)"""
    asked, files = _worker_requests(tmp_path, kind, "fork")
    assert asked == files, kind


@pytest.mark.slow  # spawned workers import torch: 10-20 s on 2 cores
@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_spawned_dataloader_worker_fetches_no_metadata(tmp_path, kind) -> None:
    """As with fork: the pickled Store carries the metadata to a spawned worker."""
    asked, files = _worker_requests(tmp_path, kind, "spawn")
    assert asked == files, kind


def _opened_and_read(base: str, **kw: object) -> shardload.Store:
    """The store opened by URL and read for one epoch (its reader fetched its metadata)."""
    opened = shardload.open_store(f"{base}store", **kw)
    list(shardload.iter_batches(opened, **KW))
    return opened


def _as_worker(opened: shardload.Store) -> shardload.Store:
    worker = pickle.loads(pickle.dumps(opened))  # as a spawned DataLoader worker gets it
    worker._pid = -1  # another process: its reader opens anew
    return worker


@pytest.mark.parametrize("kind", sorted(STORES))
def test_a_worker_serves_no_rows_of_a_store_rewritten_since_the_main_process_read_it(
    tmp_path, kind
) -> None:
    """The metadata a worker takes from the main process goes with the checksums read with the
    manifest: a store rewritten on the server since (other values, another layout) is a
    checksum error naming the file in the worker, never rows read through the old metadata
    (or, where the main process read the file, the server's refusal of a request tied to the
    version it read: ``move/pinned.py``)."""
    from shardload.errors import ChunkReadError

    make_store(tmp_path, n=512, **STORES[kind])
    other = {"zarr-shards": "zstd", "zarr-chunks": "lz4", "npy": "none"}[kind]
    make_store(tmp_path / "new", n=500, **{**STORES[kind], "compression": other})
    with serving(tmp_path) as base:
        worker = _as_worker(_opened_and_read(base))
        assert worker.carried_metadata  # what this test is about
        shutil.rmtree(tmp_path / "store")
        shutil.copytree(tmp_path / "new" / "store", tmp_path / "store")
        with pytest.raises(ChunkReadError, match=r"checksum|/x/.* changed on the server since"):
            list(shardload.iter_batches(worker, **KW))


@pytest.mark.parametrize("kind", ["zarr-shards", "npy"])
def test_without_checksums_a_worker_checks_the_server_metadata_itself(tmp_path, kind) -> None:
    """With ``verify="never"`` nothing would catch files of another version, so a worker
    fetches and checks each array's own metadata: edited on the server since the main process
    read it, it is refused, naming the file."""
    from shardload.errors import StoreError

    make_store(tmp_path, n=512, **STORES[kind])
    with serving(tmp_path) as base:
        worker = _as_worker(_opened_and_read(base, verify="never"))
        assert not worker.carried_metadata
        x = tmp_path / "store" / "x"
        if kind == "npy":
            last = sorted(x.glob("*.npy"))[-1]
            last.write_bytes(last.read_bytes().replace(b"<f4", b"<i4", 1))
            what = last.name
        else:
            meta = x / "zarr.json"
            meta.write_text(meta.read_text().replace('"float32"', '"int32"'))
            what = "zarr.json"
        with pytest.raises(StoreError, match=what):
            list(shardload.iter_batches(worker, **KW))
