"""Reading from far away: the loader keeps the reads its plan has queued in flight at once (up
to ``URL_IN_FLIGHT`` per reader), so a round trip is paid once per wave of requests, not once
per chunk. Checked through a latency-injecting proxy (not a timed test: the proxy counts the
requests in flight), and the batches stay those of the same store read from its folder."""

from __future__ import annotations

from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
from _stores import make_store
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
