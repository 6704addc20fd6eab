"""Reading from far away: the loader keeps the reads its plan has queued in flight at once (up
to ``URL_IN_FLIGHT`` per reader), so a round trip is paid once per wave of requests, not once
per chunk. Checked through a latency-injecting proxy (not a timed test: the proxy counts the
requests in flight), and the batches stay those of the same store read from its folder."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.formats.zarr import shard_fetch
from shardload.formats.zarr.kept import KEEP_ENV
from shardload.move.remote import URL_IN_FLIGHT
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy

pytestmark = pytest.mark.timeout(120)


def test_a_reader_keeps_the_planned_reads_in_flight(tmp_path) -> None:
    store = make_store(tmp_path, fmt="npy", n=1024, chunk_rows=8, splits={"train": 1.0})
    group = 2 * URL_IN_FLIGHT  # chunks per shuffle group: more reads queued than the bound
    kw = {"batch_size": 64, "seed": 5, "shuffle_chunks": group}
    local = [b["index"] for b in shardload.iter_batches(store, **kw)]
    with serving(tmp_path) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.05) as (proxy, port):
            url = f"http://127.0.0.1:{port}/store"
            got = list(shardload.iter_batches(url, **kw))
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)
    # each of the group's reads is a request (x and y of each chunk), all queued at once
    assert proxy.max_waiting >= URL_IN_FLIGHT, proxy.max_waiting
    assert proxy.max_waiting <= URL_IN_FLIGHT + 1  # the bound holds (+1: a metadata read)


def test_a_call_keeps_its_small_range_requests_in_flight_together(tmp_path, monkeypatch) -> None:
    """A sharded array by URL, checks done (a later epoch of the same Store): a call's range
    requests of a few KB each are kept in flight up to the reader's ``URL_IN_FLIGHT``, not
    ``URL_THREADS`` (8, sized for runs of ``URL_RUN_BYTES``), so a group waits a few round trips,
    not one per 8 requests. Counted by the proxy: requests in flight at once and the round
    trips waited in turn (before: 16 in flight at most, the group's call and the next one read
    ahead, 8 each; 36 round trips for 450 requests)."""
    monkeypatch.setenv(KEEP_ENV, "0")  # every group's call makes its own requests
    monkeypatch.setattr(shard_fetch, "URL_GAP_BYTES", 0)  # a request per inner chunk or run
    monkeypatch.setattr(shard_fetch, "URL_WHOLE_SHARE", 2.0)  # never the whole shard again
    store = make_store(
        tmp_path, fmt="zarr", compression="lz4", n=2048, chunk_rows=4, shard_chunks=128
    )
    kw = {"batch_size": 32, "seed": 3, "split": None, "shuffle_chunks": 64, "arrays": ["x"]}
    local = [b["index"] for b in shardload.iter_batches(store, **kw)]
    with serving(tmp_path) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.05) as (proxy, port):
            opened = shardload.open_store(f"http://127.0.0.1:{port}/store")
            list(shardload.iter_batches(opened, **kw))  # the checks: each shard fetched whole
            proxy.reset_counts()
            since = time.monotonic()
            got = list(shardload.iter_batches(opened, **kw))
            trips = proxy.round_trips(since=since)
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))
    assert proxy.requests > 4 * URL_IN_FLIGHT, proxy.requests  # many small range requests
    assert proxy.max_waiting > 2 * shard_fetch.URL_THREADS, proxy.max_waiting
    assert proxy.max_waiting <= URL_IN_FLIGHT + 1, proxy.max_waiting
    assert trips * 2 * shard_fetch.URL_THREADS < proxy.requests, (trips, proxy.requests)
