"""By URL, a reader's receive buffers are used again once free (``move/buffers.py``).

Each shard was read into a new buffer: fresh pages the kernel zeroed at their first write
(22% of the client's CPU in a first epoch of the default store by URL). Counted here: the page
faults of the thread that reads the answers (``RUSAGE_THREAD``), the buffers allocated; and the
guarantees: a buffer is never used again while any view of it is held (a slice, a numpy
array, a chunk kept for later), the same batches with every answer pooled, a corrupt shard
still named, the free buffers bounded."""

from __future__ import annotations

import contextlib
import functools
import http.server
import resource
import threading
import time
from collections.abc import Iterator

import numpy as np
import pytest

import shardload
import shardload.move.buffers as buffers
from shardload.errors import ConfigError
from shardload.move.buffers import FREE_BUFFERS, BufferPool
from shardload.move.http_get import HttpReader
from test_url_shard_fetch import (  # noqa: F401 (a fixture)
    KW,
    assert_corrupt_shard_named,
    epoch,
    served_url,
    sharded,
)

pytestmark = pytest.mark.timeout(120)

SIZE = 32 << 20  # an answer of the default store's shard size (tens of MiB)
HUGE_PAGE = 2 << 20  # the largest page a fresh buffer is faulted in by (THP)


@contextlib.contextmanager
def file_server(root) -> Iterator[str]:  # type: ignore[no-untyped-def]
    """A plain HTTP server of ``root`` in threads of this process."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        t = threading.Thread(target=httpd.serve_forever, daemon=True)
        t.start()
        try:
            yield f"http://127.0.0.1:{httpd.server_address[1]}"
        finally:
            httpd.shutdown()


def faults() -> int:
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt


def test_answers_fetched_again_fault_in_no_new_pages(tmp_path) -> None:
    """Eight whole GETs of a 32 MiB file after a first, each by a reader of its own (a store
    opened anew: ``iter_batches(url)`` each epoch), each answer dropped before the next: before,
    each faulted in a new buffer (at least one fault per 2 MiB huge page, 128 in all); now they
    reuse the first one's pages. The bytes are the file's each time."""
    want = np.random.default_rng(0).integers(0, 256, SIZE, dtype=np.uint8)
    (tmp_path / "f.bin").write_bytes(want.tobytes())

    def get(url: str) -> memoryview:
        reader = HttpReader({}, None, 30.0)
        status, _, body = reader.get(url, None, None, {})
        reader.close()
        assert status == 200 and len(body) == SIZE
        return body  # type: ignore[no-any-return]

    with file_server(tmp_path) as base:
        get(f"{base}/f.bin")  # (dropped at once)
        n, before = 8, faults()
        for _ in range(n):
            body = get(f"{base}/f.bin")
            assert body[:16] == want[:16].tobytes() and body[-16:] == want[-16:].tobytes()
            del body
        got = faults() - before
    assert got < n * SIZE // HUGE_PAGE // 2, got  # before: >= 128 (one per huge page at best)


def test_a_buffer_is_given_back_only_when_no_view_of_it_remains() -> None:
    pool = BufferPool()
    view = pool.take(3 << 20).toreadonly()
    arr = np.frombuffer(view[100:200], np.uint8)
    part = view[1 << 20 :]
    del view
    assert pool.free == 0  # a numpy array and a slice still read it
    del arr
    assert pool.free == 0
    held = bytes(part[:10])  # a copy (as a kept chunk) does not hold it
    del part
    assert pool.free == 1 and len(held) == 10
    again = pool.take(3 << 20)
    assert (pool.allocated, pool.reused, pool.free) == (1, 1, 0)
    other = pool.take(3 << 20)  # the first is in use: a new one
    assert pool.allocated == 2 and other.nbytes == again.nbytes == 3 << 20


def test_free_buffers_are_bounded_and_dropped_on_close() -> None:
    pool = BufferPool()
    views = [pool.take(2 << 20) for _ in range(FREE_BUFFERS + 3)]
    del views
    assert pool.free == FREE_BUFFERS
    big = pool.take(9 << 20)  # none of its size free: one free buffer dropped, one allocated
    assert pool.free == FREE_BUFFERS - 1 and pool.allocated == FREE_BUFFERS + 4
    del big
    pool.close()
    assert pool.free == 0
    pool.take(2 << 20)
    assert pool.free == 0  # a closed pool keeps none


def test_free_buffers_are_dropped_once_idle() -> None:
    """A buffer free for ``idle_s`` goes back to the system (a timer): memory is not held
    between reads far apart; one given back later waits its own time."""
    pool = BufferPool()
    pool.idle_s = 0.2
    pool.take(2 << 20)  # (dropped at once: free)
    assert pool.free == 1
    for _ in range(200):
        if not pool.free:
            break
        time.sleep(0.05)
    assert pool.free == 0
    pool.take(2 << 20)
    assert (pool.allocated, pool.free) == (2, 1)  # a new one (none left), free again


def test_small_answers_are_not_pooled() -> None:
    pool = BufferPool()
    view = pool.take(1000)
    del view
    assert (pool.allocated, pool.free) == (0, 0)


def test_no_free_buffer_kept_when_the_environment_says_0(monkeypatch) -> None:
    monkeypatch.setenv(buffers.FREE_ENV, "0")
    pool = BufferPool()
    pool.take(2 << 20)  # (dropped at once)
    assert pool.free == 0
    monkeypatch.setenv(buffers.FREE_ENV, "many")
    with pytest.raises(ConfigError, match=buffers.FREE_ENV):
        BufferPool()


@pytest.fixture
def every_answer_pooled(monkeypatch):
    """A fresh process pool that takes every answer (the store's shards are of KiB)."""
    monkeypatch.setattr(buffers, "MIN_POOL_BYTES", 1)
    monkeypatch.setattr(buffers, "_SHARED", [])


def test_the_same_batches_with_every_answer_in_a_reused_buffer(
    sharded,  # noqa: F811
    every_answer_pooled,
) -> None:
    """A first epoch (shards whole, checked, chunks kept for later groups) and a later one
    (range requests) of one store, every answer in a pooled buffer: the folder's batches, and
    buffers were used again."""
    root, local = sharded
    pool = buffers.shared_pool()
    allocated, reused = pool.allocated, pool.reused
    with served_url(root) as (url, _):
        store = shardload.open_store(url)
        epoch(store, local)
        epoch(store, local)
    from shardload.move.http_get import reader_of

    reader = reader_of(store.fs.target, 30)
    assert reader is not None and reader.buffers is pool
    assert pool.reused > reused, vars(pool)
    assert pool.allocated - allocated < reader.requests


def test_a_corrupt_shard_is_still_named_with_reused_buffers(
    sharded,  # noqa: F811
    every_answer_pooled,
) -> None:
    assert_corrupt_shard_named(sharded[0])
