"""A store by URL opens one fsspec target per process, however many reader threads make their
first read at once: before, each racing thread opened its own and all but the last were
dropped unclosed, each keeping a pooled connection to the server for good (a closed store
held connections: ``tests/test_url_connections.py`` failed on a busy machine)."""

from __future__ import annotations

import threading
import time

from shardload.move import remote


def test_threads_reading_first_at_once_open_one_target(monkeypatch):
    opened: list[object] = []

    def slow_open(self):
        time.sleep(0.05)  # a session being set up while the other threads arrive
        target = object()
        opened.append(target)
        return target, "/root"

    monkeypatch.setattr(remote.RemoteSpec, "open_target", slow_open)
    fs = remote.RemoteFileSystem(remote.RemoteSpec(url="http://127.0.0.1:9/store"))
    start = threading.Barrier(8)
    got: list[object] = []

    def first_read() -> None:
        start.wait()
        got.append(fs.target)

    threads = [threading.Thread(target=first_read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(opened) == 1, f"{len(opened)} targets opened, one kept"
    assert all(g is opened[0] for g in got)
