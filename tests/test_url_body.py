"""A large answer by URL is read into one buffer as its blocks arrive (``move/pinned.py``).

aiohttp's ``read()`` keeps every block of a body until it joins them into a new ``bytes``: a
shard of 64 MiB fetched whole for its checksum held 128 MiB at the end of its request, all of it
fresh memory (about 0.10 CPU s of 0.35 in a first epoch by URL of the default store). Counted
here with tracemalloc: the memory a whole fetch allocates, against the size of the answer. The
guarantees stay: a body cut short is retried and never served, and a store read this way gives
the same batches as its folder and names a corrupt shard. The client's read-stall timeout of
such a read is one timer made once a period (before: one made and cancelled per block received),
counted at the event loop; a body that stalls half way is still a (retried) timeout."""

from __future__ import annotations

import asyncio
import contextlib
import tracemalloc
from collections.abc import Iterator

import numpy as np
import pytest
from aiohttp import web

import shardload
import shardload.move.pinned as pinned
from shardload.errors import RemoteError
from shardload.formats.zarr.shards import RangeFile
from shardload.move.remote import open_fs, read_bytes
from shardload.move.serve import serving
from test_remote import PAYLOAD, fast_fs, flaky_server, serving_handler
from test_url_shard_fetch import KW, epoch, served_url, sharded  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(120)

SIZE = 8 << 20


@pytest.fixture
def aiohttp_only(monkeypatch):
    """Every GET through fsspec's aiohttp session, as where ``move/http_get.py`` does not
    apply (other client options): what this file tests of that path."""
    from shardload.move.http_get import HttpReader

    monkeypatch.setattr(HttpReader, "of", classmethod(lambda cls, target, timeout_s: None))


def _peak(fn):
    """``fn()``'s result and the most memory it held at once beyond what it started with."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        out = fn()
        return out, tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()


def test_a_whole_fetch_holds_its_answer_once(tmp_path) -> None:
    """A shard's range fetch of 8 MiB peaks at about 8 MiB (before: about 16, the blocks and
    their join), with the same bytes."""
    data = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    (tmp_path / "blob").write_bytes(data)
    with serving(tmp_path) as base:
        fs, root = open_fs(base.rstrip("/"))
        path = f"{root}/blob"
        assert read_bytes(fs, path, 0, 16) == data[:16]  # the session is open before counting
        (view, got), peak = _peak(lambda: RangeFile(fs, path).fetch(0, SIZE))
        assert got == SIZE and view == data
        assert peak < 1.5 * SIZE, f"a fetch of {SIZE} bytes held {peak} bytes at once"
        whole, peak = _peak(lambda: RangeFile(fs, path).whole())
        assert whole == data and whole.readonly
        assert peak < 1.5 * SIZE, f"a whole read of {SIZE} bytes held {peak} bytes at once"
        assert isinstance(read_bytes(fs, path), bytes)  # other readers still get bytes


@pytest.mark.parametrize("failure", ["half", "drop", "503"])
def test_a_body_cut_short_is_retried_and_never_served(failure, monkeypatch) -> None:
    monkeypatch.setattr(pinned, "INTO_BYTES", 1)  # the 16 KiB payload read into a buffer
    with flaky_server([failure, failure, "ok"]) as (url, seen):
        fs, path = fast_fs(url)
        assert fs.cat_file(path, view=True) == PAYLOAD
        assert fs.cat_file(path, 10, 5000, view=True) == PAYLOAD[10:5000]
    assert seen == [failure, failure, "ok", "ok"]
    with flaky_server(["half"]) as (url, seen):
        fs, path = fast_fs(url, retries=2)
        with pytest.raises(RemoteError, match=r"data\.bin"):
            fs.cat_file(path, view=True)
    assert len(seen) == 3


def test_an_epoch_read_into_buffers_is_the_folders(sharded, monkeypatch, aiohttp_only) -> None:  # noqa: F811
    """Every shard (all under 1 MiB here) read into a buffer: the same batches as the folder."""
    monkeypatch.setattr(pinned, "INTO_BYTES", 1)
    calls = []
    into = pinned._read_into
    monkeypatch.setattr(pinned, "_read_into", lambda r, *a: calls.append(1) or into(r, *a))
    root, local = sharded
    with served_url(root) as (url, _):
        store = shardload.open_store(url)
        epoch(store, local)
        epoch(store, local)  # a later epoch: range requests, also into buffers
    assert len(calls) >= 8  # the 8 shards' checks at least


def test_a_large_answer_makes_no_timer_per_block(tmp_path, monkeypatch, aiohttp_only) -> None:
    """An 8 MiB fetch arrives in dozens of blocks; aiohttp's ``sock_read`` made a timer for
    each (``call_at``); the stall check makes one for the request (and one per period)."""
    (tmp_path / "blob").write_bytes(bytes(SIZE))
    timers = []
    call_at = asyncio.BaseEventLoop.call_at

    def counted(loop, when, callback, *args, **kw):
        timers.append(callback)
        return call_at(loop, when, callback, *args, **kw)

    with serving(tmp_path) as base:
        fs, root = open_fs(base.rstrip("/"), timeout_s=30)
        path = f"{root}/blob"
        assert read_bytes(fs, path, 0, 16) == bytes(16)
        monkeypatch.setattr(asyncio.BaseEventLoop, "call_at", counted)
        blocks = []
        moved = pinned._Stall.moved
        monkeypatch.setattr(pinned._Stall, "moved", lambda st: blocks.append(1) or moved(st))
        view, got = RangeFile(fs, path).fetch(0, SIZE)
        monkeypatch.undo()
    assert got == SIZE and view == bytes(SIZE)
    assert len(blocks) >= 16, blocks  # many blocks: before, a timer each
    assert len(timers) <= 4, f"{len(timers)} timers for {len(blocks)} blocks"


@contextlib.contextmanager
def halting_server(body: bytes) -> Iterator[str]:
    """A server that sends the headers and half of ``body``, then nothing for a minute."""

    async def handle(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_length = len(body)
        await resp.prepare(request)
        await resp.write(body[: len(body) // 2])
        await asyncio.sleep(60)
        return resp

    with serving_handler(handle, shutdown_timeout=0.1) as url:
        yield url


@pytest.mark.parametrize("size", [16 << 10, 2 << 20])  # joined, and into one buffer
def test_a_body_that_stalls_half_way_is_a_timeout(size, monkeypatch, aiohttp_only) -> None:
    """As aiohttp's own read-stall timeout was (fsspec names it ``FSTimeoutError``): retried,
    then an error naming the file, long before the call's hard deadline."""
    fired = []
    error = pinned._Stall.error
    monkeypatch.setattr(pinned._Stall, "error", lambda st, url: fired.append(1) or error(st, url))
    with halting_server(bytes(size)) as url:
        fs, path = fast_fs(url, retries=1, timeout_s=0.5)
        with pytest.raises(RemoteError, match=r"after 2 attempts: FSTimeoutError"):
            fs.cat_file(path, view=True)
    assert len(fired) == 2  # each attempt ended by the stall check, not the hard deadline


@pytest.mark.parametrize("size", [16 << 10, 2 << 20])
def test_a_body_that_stalls_half_way_is_a_timeout_on_http_client(size) -> None:
    """The same on ``move/http_get.py``'s connections: the socket's timeout, retried, then an
    error naming the file."""
    with halting_server(bytes(size)) as url:
        fs, path = fast_fs(url, retries=1, timeout_s=0.5)
        with pytest.raises(RemoteError, match=r"data\.bin.* after 2 attempts: TimeoutError"):
            fs.cat_file(path, view=True)
        from shardload.move.http_get import reader_of

        assert reader_of(fs.target, 0.5).requests == 2


def test_a_raw_zarr_chunk_file_is_checked_from_one_buffer(tmp_path) -> None:
    """A raw Zarr chunk file by URL (4 MiB) fetched whole for its checksum: its answer is held
    once (before: about twice, the blocks and their join); the rows are the folder's."""
    from _stores import make_store

    rows = 1 << 18  # x: 16 bytes a row, one 4 MiB chunk file
    make_store(tmp_path, fmt="zarr", compression="none", n=rows, chunk_rows=rows).close()
    local = shardload.open_store(tmp_path / "store")
    size = (tmp_path / "store" / "x" / "c" / "0" / "0").stat().st_size
    with serving(tmp_path) as base:
        store = shardload.open_store(f"{base}store")
        out = np.zeros((10, 4), np.float32)
        _, peak = _peak(lambda: store.reader.read_spans_into("x", [(5, 15)], [out]))
        np.testing.assert_array_equal(out, local.read("x", 5, 15))
        store.close()
    assert peak < 1.5 * size, f"a check of a {size}-byte chunk file held {peak} bytes at once"
