"""Reads by URL stop once their iterator is closed (issue 28): a read still running when the
loader closes (an error in another group, or the caller's ``close``) whose server then goes
away must not go on retrying (warnings in the log, requests at whatever answers the URL) for
seconds after nobody wants its bytes (``move/retries.py::stop_on``, set by ``load/pool.py``)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

import shardload
from shardload.errors import ChunkReadError, RemoteError
from shardload.move.retries import call_with_retries, stop_on
from test_url_shard_fetch import KW, epoch, served_url, sharded  # noqa: F401 (a fixture)

pytestmark = pytest.mark.timeout(60)


class Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if "retry" in record.getMessage():
            self.seen.append(record.getMessage())


def test_reads_of_a_closed_loader_stop_retrying(sharded, monkeypatch) -> None:  # noqa: F811
    """A shard gone in a later epoch ends the iterator with an error naming it while other
    reads run; the server then shuts down: those reads give up instead of retrying (before:
    ``reading 0 (.../store/y/c/0/0) failed (ClientConnectorError ...); retry 5/5`` for seconds
    after the test ended)."""
    monkeypatch.setenv("SHARDLOAD_RETRY_BACKOFF_S", "0.1")
    root, local = sharded
    handler = Retries()
    log = logging.getLogger("shardload.remote")
    log.addHandler(handler)
    try:
        with served_url(root) as (url, _):
            store = shardload.open_store(url)
            epoch(store, local)
            (root / "store" / "x" / "c" / "2" / "0").unlink()
            with pytest.raises(ChunkReadError, match=r"shard 2 of array 'x' is missing"):
                list(shardload.iter_batches(store, **KW))
        handler.seen.clear()  # from here on the server is gone
        time.sleep(2.0)  # backoff 0.1, 0.2, 0.4, 0.8 s: several retries would have run by now
        assert handler.seen == [], f"{len(handler.seen)} retries after close: {handler.seen[0]}"
    finally:
        log.removeHandler(handler)


def test_a_set_stop_ends_retries_at_once() -> None:
    calls = []

    def fail() -> None:
        calls.append(1)
        raise ConnectionError("refused")

    stop = threading.Event()
    threading.Timer(0.2, stop.set).start()
    t0 = time.monotonic()
    with stop_on(stop), pytest.raises(RemoteError, match=r"chunk 3 .*reader was closed"):
        call_with_retries(fail, url="http://h/x", what="chunk 3", retries=5, backoff_s=1.0)
    assert time.monotonic() - t0 < 1.5 and len(calls) == 1
