"""A store read by URL holds no connection once it is closed, nor once an ``iter_batches(url)``
epoch ends: before, its client session (and every pooled connection, with the server's end of
each) stayed open until a garbage collection found the store's filesystem, which sits in a
reference cycle. A test run or a notebook opening stores by URL again and again so held
hundreds of sockets (over 1,024 open descriptors in one ``make test`` worker)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

import shardload
from _stores import make_store
from shardload.move import http_client
from shardload.move.serve import serving

TIMES = 4


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    base = tmp_path_factory.mktemp("served")
    for fmt in ("zarr", "npy", "hdf5"):
        make_store(base, n=120, chunk_rows=15, name=fmt, fmt=fmt, compression="none")
    with serving(base) as u:
        yield u


@pytest.fixture
def no_collection(monkeypatch) -> Iterator[None]:
    """No garbage collection, and pooled connections kept long after their last use, so only
    closing the store can end them (as in a process whose full collections are rare)."""
    monkeypatch.setattr(http_client, "IDLE_KEEPALIVE_S", 600.0)
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def client_connections(url: str) -> int:
    """This process's open connections to the server of ``url``."""
    port = int(url.rstrip("/").rsplit(":", 1)[1])
    return sum(
        1
        for c in psutil.Process().net_connections("tcp")
        if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
    )


@pytest.mark.parametrize("fmt", ["zarr", "npy", "hdf5"])
def test_a_closed_store_holds_no_connection(url, no_collection, fmt):
    for _ in range(TIMES):
        with shardload.open_store(url + fmt) as st:
            for name in st.arrays:
                st.read(name)
            assert client_connections(url) > 0  # the check below can see connections
        assert client_connections(url) == 0


@pytest.mark.parametrize("fmt", ["zarr", "npy", "hdf5"])
def test_an_epoch_by_url_ends_with_no_connection(url, no_collection, fmt):
    for _ in range(TIMES):
        batches = shardload.iter_batches(url + fmt, batch_size=8, num_workers=2, worker=1)
        first = next(batches)
        assert len(first["index"]) == 8 and client_connections(url) > 0
        for _batch in batches:
            pass
        assert client_connections(url) == 0


def test_a_dropped_epoch_by_url_holds_no_connection(url, no_collection):
    for _ in range(TIMES):
        batches = shardload.iter_batches(url + "zarr", batch_size=8)
        next(batches)
        del batches
        assert client_connections(url) == 0


def test_a_store_reads_again_after_close(url):
    """Closing ends the connections, not the store: a later read opens new ones."""
    st = shardload.open_store(url + "npy")
    first = st.read("x")
    st.close()
    again = st.read("x")
    st.close()
    assert (again == first).all()


def test_a_store_given_to_iter_batches_stays_open(url):
    """``iter_batches`` closes only the store it opened itself from a URL."""
    with shardload.open_store(url + "npy") as st:
        for _batch in shardload.iter_batches(st, batch_size=8):
            pass
        shardload.iter_batches(st, batch_size=8).close()  # closed before its first batch
        unstarted = shardload.iter_batches(st, batch_size=8)
        del unstarted  # dropped before its first batch
        assert client_connections(url) > 0
        assert len(st.read("x")) == len(st)


def test_staging_by_url_leaves_no_connection(url, no_collection, tmp_path):
    """Staging lists, sizes and fetches the store's files, each on a filesystem of its own."""
    from shardload.move.staging import staged

    for k in range(TIMES):
        with staged(url + "zarr", tmp_path / f"to-{k}") as path:
            assert (path / "shardload.json").is_file()
        assert client_connections(url) == 0


def test_a_closed_store_holds_no_copy_of_its_node_cache(url, tmp_path):
    """Copies the node cache serves without keeping (a full cache) stay open for the store's
    next reads of them, and are closed with the store."""
    cache = tmp_path / "cache"

    def open_copies() -> int:
        fds = Path("/proc/self/fd")
        return sum(1 for fd in fds.iterdir() if str(cache) in os.path.realpath(fd))

    for _ in range(TIMES):
        with shardload.open_store(url + "npy", cache_dir=cache, cache_bytes=1) as st:
            st.read("x")
            assert open_copies() > 0 and st.fs.node_cache.stats["bypassed"] > 0
        assert open_copies() == 0


@pytest.mark.parametrize("fmt", ["zarr", "npy", "hdf5"])
def test_a_never_started_epoch_by_url_holds_no_connection_once_dropped(url, no_collection, fmt):
    """An iterator made and dropped before its first batch (as a loop that breaks at once, or
    torchdata on loading a finished state) releases the store it opened at once: a generator
    never started runs no ``finally``, so before, only a garbage collection closed it."""
    for _ in range(TIMES):
        batches = shardload.iter_batches(url + fmt, batch_size=8)
        assert client_connections(url) > 0  # opening the store by URL read its manifest
        del batches
        assert client_connections(url) == 0


def test_a_never_started_epoch_by_url_holds_no_connection_once_closed(url, no_collection):
    for _ in range(TIMES):
        batches = shardload.iter_batches(url + "npy", batch_size=8)
        batches.close()
        assert client_connections(url) == 0
        assert list(batches) == []  # a closed iterator yields nothing more
        with shardload.iter_batches(url + "zarr", batch_size=8) as started:
            assert len(next(started)["index"]) == 8
        assert client_connections(url) == 0
