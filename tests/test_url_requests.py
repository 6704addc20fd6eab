"""The requests one epoch by URL makes (issues 25 and 28): each stored file fetched once, each
metadata file once, nothing else. Counted at ``shardload serve`` (its access log), reached
through a latency-injecting proxy so that the reader's threads ask for the same file at once:
a Zarr store of compressed chunk files was fetched three times per chunk (a size query, the
checksum's read, zarr-python's own read), a shard of a sharded store whole once per reader
thread that met it first (eight times over), and an array's ``zarr.json`` once per thread."""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy

pytestmark = pytest.mark.timeout(120)

METADATA = ("shardload.json", "checksums.npz", "x/zarr.json", "y/zarr.json")


class Seen(list):
    """The access log's lines so far. ``clear()`` first waits until no line has come for
    ``QUIET_S``: aiohttp logs a request after its body is sent, so the line of a request the
    client has already received (an open's reads) can come after the client went on."""

    QUIET_S = 0.3

    def clear(self) -> None:
        deadline, count, since = time.monotonic() + 10, len(self), time.monotonic()
        while time.monotonic() < deadline:
            time.sleep(0.02)
            if len(self) != count:
                count, since = len(self), time.monotonic()
            elif time.monotonic() - since >= self.QUIET_S:
                break
        super().clear()


@contextlib.contextmanager
def access_log() -> Iterator[list[tuple[str, str, int]]]:
    """(method, path, status) of each request ``shardload serve`` answers meanwhile."""
    seen: list[tuple[str, str, int]] = Seen()

    class Record(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            parts = record.getMessage().split()
            if len(parts) >= 3 and parts[2].isdigit():
                seen.append((parts[0], parts[1], int(parts[2])))

    log = logging.getLogger("shardload.serve")
    handler, level = Record(), log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        yield seen
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


def epoch_requests(tmp_path, store) -> tuple[list[tuple[str, str, int]], list[str]]:
    """The requests of one shuffled epoch of ``store`` by URL (checked against the store read
    from its folder), and the store's data files (relative paths)."""
    kw = {"batch_size": 64, "seed": 5, "split": None}
    local = [b["index"] for b in shardload.iter_batches(store, **kw)]
    with access_log() as seen, serving(tmp_path) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.02) as (_, port):
            got = list(shardload.iter_batches(f"http://127.0.0.1:{port}/store", **kw))
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)
    root = tmp_path / "store"
    files = sorted(p.relative_to(root).as_posix() for p in root.glob("[xy]/c/**/*") if p.is_file())
    return [(m, p.removeprefix("/store/"), s) for m, p, s in seen], files


def assert_same_batches(want, *epochs) -> None:
    """Each of ``epochs`` is the batches of ``want``: index, x and y equal, in order."""
    for epoch in epochs:
        for b, w in zip(epoch, want, strict=True):
            for k in ("index", "x", "y"):
                np.testing.assert_array_equal(b[k], w[k])


def spans_read_twice(folder, *, verify: str) -> list[tuple[str, str, int]]:
    """The requests of two calls of one reader by URL (``verify``) reading 96 one-row spans of
    ``x`` (rows 0, 2, ..., 190) of ``folder/store`` served; each call's rows checked against
    the store read from its folder."""
    local = shardload.open_store(folder / "store")
    spans = [(r, r + 1) for r in range(0, 192, 2)]
    with access_log() as seen, serving(folder) as base:
        reader = shardload.open_store(f"{base}store", verify=verify).reader
        for _ in range(2):
            outs = [np.full((1, 4), np.nan, "f4") for _ in spans]
            reader.read_spans_into("x", spans, outs)
            for (a, b), out in zip(spans, outs, strict=True):
                np.testing.assert_array_equal(out, local.read("x", a, b))
    return seen


def test_chunk_files_by_url_are_each_fetched_once(tmp_path) -> None:
    store = make_store(tmp_path, fmt="zarr", compression="zstd", n=1024, chunk_rows=16)
    seen, files = epoch_requests(tmp_path, store)
    count = collections.Counter(p for _, p, _ in seen)
    assert [m for m, _, _ in seen if m != "GET"] == []  # no size queries
    assert {f: count[f] for f in files} == {f: 1 for f in files}
    assert {f: count[f] for f in METADATA} == {f: 1 for f in METADATA}
    assert len(seen) == len(files) + len(METADATA), sorted(count.items())


def test_shards_by_url_are_each_fetched_whole_once(tmp_path) -> None:
    store = make_store(
        tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32
    )
    seen, files = epoch_requests(tmp_path, store)
    assert len(files) == 8  # 4 shards of x, 4 of y
    whole = collections.Counter(p for m, p, s in seen if m == "GET" and s == 200)
    # each shard checked once (the whole file), its inner chunks then read by range
    assert {f: whole[f] for f in files} == {f: 1 for f in files}
    assert {f: whole[f] for f in METADATA} == {f: 1 for f in METADATA}
    assert [m for m, _, _ in seen if m != "GET"] == []
    assert all(p in files for _, p, s in seen if s == 206)


@pytest.mark.parametrize("call", ["read", "read_spans_into"])
def test_threads_meeting_one_shard_fetch_it_whole_once(tmp_path, call) -> None:
    """Eight reader threads asking for inner chunks of one shard at once (the default load of
    a large store does: its tasks split a group's chunks of a few shards): one of them fetches
    the shard whole and checks it, the others wait for that check, then read their chunks
    from the bytes it checked (the loader's path) or by range requests."""
    make_store(tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32)
    with access_log() as seen, serving(tmp_path) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.05) as (_, port):
            store = shardload.open_store(f"http://127.0.0.1:{port}/store")

            def read(j: int) -> np.ndarray:
                a, b = 8 * j, 8 * j + 8  # inner chunk j of shard 0 (256 rows)
                if call == "read":
                    return np.asarray(store.read("y", a, b))
                out = np.empty((8, 1), "i8")
                store.reader.read_spans_into("y", [(a, b)], [out])
                return out

            with ThreadPoolExecutor(8) as pool:
                got = list(pool.map(read, range(0, 32, 4)))
    for j, y in zip(range(0, 32, 4), got, strict=True):
        np.testing.assert_array_equal(y[:, 0], np.arange(8 * j, 8 * j + 8) * 10)
    whole = [p for m, p, s in seen if m == "GET" and s == 200 and p.endswith("/y/c/0/0")]
    assert len(whole) == 1, seen
    if call == "read_spans_into":  # the loader's path: the waiting threads read those bytes
        assert [p for _, p, s in seen if s == 206] == [], seen
