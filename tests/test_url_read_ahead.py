"""Chunk files by URL are requested a group ahead (issue 28): while the loader waits for one
shuffle group's chunk files, the next group's are already in flight (``prefetch`` segments
of the groups after the current one, ``load/gather.py``; by default a whole group for stores
read by whole chunks, ``load/options.py::resolve_prefetch``). Behind a 100 ms proxy an epoch
of G groups read one group at a time waits at least G round trips; a group ahead (the
default before), about G; now up to ``URL_IN_FLIGHT`` chunk files ahead across groups within
the same decoded bytes (``resolve_prefetch``), a fraction of that.
The control (``prefetch=0``) shows the measure tells the two apart."""

from __future__ import annotations

import time
from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy

pytestmark = pytest.mark.timeout(120)

RTT = 0.1
#: 64 chunk files of 16 rows per array, 16 groups of 4
KW = {"batch_size": 64, "seed": 2, "split": None, "shuffle_chunks": 4}
GROUPS = 16


#: chunk files a group reads: 4 chunks of each of the store's 2 arrays
GROUP_FILES = 8


def timed_epoch(store, proxy=None, **kw) -> tuple[float, list[dict], int]:
    """An epoch's time, its batches, and the most requests the proxy saw in flight at once."""
    if proxy is not None:
        proxy.reset_counts()
    t = time.perf_counter()
    got = list(shardload.iter_batches(store, **KW, **kw))
    return time.perf_counter() - t, got, (proxy.max_waiting if proxy is not None else 0)


def test_next_groups_chunk_files_are_in_flight_while_one_group_waits(tmp_path) -> None:
    store = make_store(tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=16)
    local = list(shardload.iter_batches(store, **KW))
    with serving(tmp_path) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=RTT) as (proxy, port):
            remote = shardload.open_store(f"http://127.0.0.1:{port}/store")
            timed_epoch(remote)  # metadata, checksums and connections: the later epochs read data
            ahead, got, ahead_in_flight = timed_epoch(remote, proxy)
            one_by_one, _, one_in_flight = timed_epoch(remote, proxy, prefetch=0)
    assert len(got) == len(local)
    for b, want in zip(got, local, strict=True):
        for k in want:
            np.testing.assert_array_equal(b[k], want[k])
    # the control: one group's files at a time, a round trip per group at least
    assert one_in_flight <= GROUP_FILES and one_by_one >= GROUPS * RTT, (one_in_flight, one_by_one)
    # by default the files of more than two groups are requested together (counted by the
    # proxy, not timed: a loaded machine stretches both epochs), and the epoch waits less
    assert ahead_in_flight > 2 * GROUP_FILES, ahead_in_flight
    assert ahead < one_by_one, (ahead, one_by_one)


def test_a_missing_chunk_file_read_ahead_is_named(tmp_path) -> None:
    make_store(tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=16)
    (tmp_path / "store" / "x" / "c" / "37" / "0").unlink()
    missing = pytest.raises(ChunkReadError, match=r"chunk 37 of array 'x' is missing")
    with serving(tmp_path) as base, missing:
        list(shardload.iter_batches(f"{base}store", **KW))
