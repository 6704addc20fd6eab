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
from shardload.move import remote_fsspec
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
    real = remote_fsspec.RemoteFile._fetch_range
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
            self.fs.remote.target.loop.call_soon_threadsafe(garbage_on_the_loop)
            time.sleep(0.2)
        return real(self, start, end)

    monkeypatch.setattr(remote_fsspec.RemoteFile, "_fetch_range", fetch_range)
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


def test_threads_reading_while_the_first_use_checks_the_metadata(tmp_path: Path, monkeypatch):
    """By URL the arrays' metadata is checked at the reader's first use; that check must not
    close the handle other threads of the process are already reading with (it did: "Unable to
    synchronously get dataspace (identifier is not of specified type)", seen in `shardload copy`
    of an HDF5 store by URL, whose write tasks read in threads)."""
    import threading

    from shardload.formats.hdf5 import read as h5read

    make_store(tmp_path / "served", fmt="hdf5", n=600, chunk_rows=50, name="h")
    want = shardload.open_store(tmp_path / "served" / "h").read("x")
    real_close = h5read.Hdf5Reader.close
    started = threading.Event()

    def slow_close(self) -> None:  # other threads read with the handle before it closes
        started.set()
        time.sleep(0.5)
        real_close(self)

    monkeypatch.setattr(h5read.Hdf5Reader, "close", slow_close)
    with serving(tmp_path / "served", port=0) as url:
        store = shardload.open_store(f"{url.rstrip('/')}/h")
        got: dict[int, np.ndarray] = {}
        errors: list[BaseException] = []

        def read(k: int) -> None:
            try:
                if k:
                    started.wait(2)  # (the fixed check closes no shared handle)
                got[k] = store.read("x", 0, len(want))
                end = time.monotonic() + 1.0  # reading on while the check's close comes
                while k and time.monotonic() < end:
                    np.testing.assert_array_equal(store.read("x", 100, 110), want[100:110])
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=read, args=(k,)) for k in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    assert errors == []
    for k in range(3):
        np.testing.assert_array_equal(got[k], want)
