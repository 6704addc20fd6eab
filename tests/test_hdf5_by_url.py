"""HDF5 read by URL cannot wedge fsspec's event loop (issue #26 row 3).

h5py holds its global lock while it calls the file object, whose reads wait on fsspec's
event-loop thread; a garbage collection in that thread that frees an h5py object waits for the
same lock. Before the fix every request then timed out, retries included, even with the server
healthy (after a server outage, whose errors leave such garbage: 383 s, then ChunkReadError).
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.move import remote
from shardload.move.serve import serving


@pytest.fixture()
def low_gc_threshold():
    old = gc.get_threshold()
    gc.set_threshold(50)
    yield
    gc.set_threshold(*old)


def test_a_collection_on_the_event_loop_does_not_wedge_hdf5_reads(
    tmp_path: Path, monkeypatch, low_gc_threshold
) -> None:
    make_store(tmp_path / "served", fmt="hdf5", n=3000, chunk_rows=100, name="h")
    local = shardload.open_store(tmp_path / "served" / "h")
    other = h5py.File(tmp_path / "other.h5", "w")
    other["d"] = np.arange(3)
    real = remote._RemoteFile._fetch_range
    injected = []
    handles = [other["d"]]  # made here: making one takes h5py's lock too

    def garbage_on_the_loop() -> None:
        """What a failed request leaves in the loop thread: a cycle holding an h5py object,
        then enough allocations for an automatic collection there."""
        cycle: list = [handles.pop()]
        cycle.append(cycle)
        del cycle
        junk = [[i] for i in range(2000)]
        del junk

    def fetch_range(self, start: int, end: int) -> bytes:
        if not injected:  # while h5py holds its lock, waiting for this read
            injected.append(True)
            self.fs.target.loop.call_soon_threadsafe(garbage_on_the_loop)
            time.sleep(0.2)
        return real(self, start, end)

    monkeypatch.setattr(remote._RemoteFile, "_fetch_range", fetch_range)
    with serving(tmp_path / "served") as url:
        store = shardload.open_store(url + "h", retries=1, timeout_s=1, backoff_s=0.05)
        t0 = time.monotonic()
        got = store.read("x", 0, 3000)
        elapsed = time.monotonic() - t0
    other.close()
    assert injected and not handles
    np.testing.assert_array_equal(got, local.read("x", 0, 3000))
    assert elapsed < 2, f"the read took {elapsed:.1f} s"


def test_cycles_are_still_collected_while_remote_reads_overlap() -> None:
    import weakref

    from shardload.formats.hdf5.read import no_cyclic_gc

    class Node:
        pass

    assert gc.isenabled()
    with no_cyclic_gc(True):  # a read that never ends (reader threads taking turns)
        assert not gc.isenabled()
        node = Node()
        node.self = node
        ref = weakref.ref(node)
        del node
        kept = []
        for _ in range(50):
            with no_cyclic_gc(True):  # the next reads, each allocating
                kept.append([[i] for i in range(1000)])
        assert ref() is None
    assert gc.isenabled()
