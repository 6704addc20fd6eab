"""An epoch the node cache holds whole (issue 28) is read as the same store from a local folder:
the loader keeps as many reads ahead, in as many threads, as it does for the local store (not
the by-URL plan of 32 requests in flight, whose threads only cost CPU once nothing waits on
the network), and a Blosc chunk file's copy is opened once per read, its check included."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
import shardload.load.batches as batches

sys.path.insert(0, str(Path(__file__).parent))
from _stores import make_store
from test_node_cache import epoch_rows, serving, warm_epoch_opens

GROUP_READERS = ("gather_batches", "scatter_batches", "window_batches")
STORES = {
    "zarr-lz4": dict(fmt="zarr", compression="lz4"),
    "zarr-raw": dict(fmt="zarr", compression="none"),
    "npy": dict(fmt="npy"),
}


def spy_read_ahead(monkeypatch) -> list[tuple[int, int]]:
    """``(prefetch, threads)`` the loader's group reader gets, one entry per epoch read."""
    seen: list[tuple[int, int]] = []
    for name in GROUP_READERS:
        real = getattr(batches, name)

        def spy(*a: Any, _real: Any = real, **kw: Any) -> Any:
            seen.append((kw["prefetch"], kw["threads"]))
            return _real(*a, **kw)

        monkeypatch.setattr(batches, name, spy)
    return seen


@pytest.mark.parametrize("kind", STORES)
def test_a_warm_epoch_reads_ahead_as_the_local_store(tmp_path: Path, monkeypatch, kind) -> None:
    """Epoch 1 fills the cache (the by-URL read-ahead, many requests in flight); epoch 2, in a
    fresh handle (a new worker), finds every file cached and reads with the prefetch and
    threads the same store gets from a local folder."""
    make_store(tmp_path / "src", n=203, chunk_rows=7, name="store", **STORES[kind])
    root, cache = tmp_path / "src" / "store", tmp_path / "cache"
    with serving(tmp_path / "src") as srv:
        url = f"{srv.url}/store"
        seen = spy_read_ahead(monkeypatch)
        epoch_rows(shardload.open_store(url, cache_dir=cache), 0)
        filled = len(srv.paths)
        epoch_rows(shardload.open_store(url, cache_dir=cache), 1)
        assert srv.data_requests(since=filled) == []
    epoch_rows(shardload.open_store(root), 1)
    fill, warm, local = seen
    assert warm == local, f"warm epoch {warm}, local store {local} (prefetch, threads)"
    if kind != "npy":  # a Zarr store's chunk files by URL: requests kept in flight
        assert fill[1] > local[1]


def test_a_copy_is_opened_once_per_read_its_check_included(tmp_path: Path, monkeypatch) -> None:
    """The first epoch of a new process (a fresh handle) over a warm cache, of Blosc chunk
    files read whole once an epoch: each copy is checked by its record and read through the
    same descriptor, one open, not two."""
    make_store(tmp_path / "src", n=203, chunk_rows=7, name="store", **STORES["zarr-lz4"])
    root, cache = tmp_path / "src" / "store", tmp_path / "cache"
    with serving(tmp_path / "src") as srv:
        n, x, opens = warm_epoch_opens(f"{srv.url}/store", cache, monkeypatch)
    opened = Counter(path for path, ahead in opens if not ahead and "/c/" in path)  # chunk files
    local = shardload.open_store(root)
    assert n == len(local) and np.array_equal(x, local.read("x", 0, len(local)))
    assert opened and max(opened.values()) == 1, f"copies opened {max(opened.values())} times"
