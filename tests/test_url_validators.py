"""What a reader by URL does with a server's validators (issue 28, ``move/pinned.py``), against
a small server whose answers each test chooses: with neither ``ETag`` nor ``Last-Modified`` a
checked file cannot be tied to its version, so each read of it fetches it whole and checks it
again; with a date only, ``If-Unmodified-Since`` rides on the range requests; a server that
ignores ``Range`` and the preconditions is caught by the version its answer names."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from email.utils import formatdate
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

import shardload
from shardload.errors import ChunkReadError, RemoteChangedError
from shardload.formats.zarr.kept import KEEP_ENV
from test_url_changed import ROW, rewrite_row, store_of

pytestmark = pytest.mark.timeout(120)


@contextlib.contextmanager
def plain_server(
    root: Path, *, etag: bool, date: bool, ranges: bool, weak: bool = False
) -> Iterator[tuple]:
    """``http://127.0.0.1:PORT/store`` serving ``root``, and the requests answered: (path,
    status, Range header or None)."""
    seen: list[tuple[str, int, str | None]] = []

    class Handler(SimpleHTTPRequestHandler):
        def __init__(self, *a, **kw):
            super().__init__(*a, directory=str(root), **kw)

        def log_message(self, *a):  # quiet
            pass

        def do_GET(self):
            path = Path(self.translate_path(self.path))
            if not path.is_file():
                seen.append((self.path, 404, None))
                self.send_error(404)
                return
            st, data = path.stat(), path.read_bytes()
            tag, stamp = (
                f'"{st.st_mtime_ns:x}-{st.st_size:x}"',
                formatdate(st.st_mtime, usegmt=True),
            )
            tag = f"W/{tag}" if weak else tag  # If-Match compares strongly: never matches
            match, since = self.headers.get("If-Match"), self.headers.get("If-Unmodified-Since")
            refused = match and (match != tag or match.startswith("W/"))
            if ranges and (refused or (since and since != stamp)):
                seen.append((self.path, 412, self.headers.get("Range")))
                self.send_error(412)
                return
            status, body = 200, data
            asked = self.headers.get("Range")
            if ranges and asked:
                a, b = asked.removeprefix("bytes=").split("-")
                body, status = data[int(a) : int(b) + 1], 206
            seen.append((self.path, status, asked))
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            if etag:
                self.send_header("ETag", tag)
            if date:
                self.send_header("Last-Modified", stamp)
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/store", seen
    finally:
        server.shutdown()
        server.server_close()


def checked_then_read(url: str) -> tuple[object, np.ndarray]:
    store = shardload.open_store(url)
    for _ in shardload.iter_batches(store, epoch=0, seed=3, batch_size=32, split=None):
        pass
    return store, np.asarray(store.read("x", ROW, ROW + 2))


@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_without_validators_a_checked_file_is_fetched_whole_and_checked_again(
    tmp_path, monkeypatch, fmt
) -> None:
    monkeypatch.setenv(KEEP_ENV, "0")
    root = store_of(tmp_path, fmt)
    with plain_server(root, etag=False, date=False, ranges=True) as (url, seen):
        store, want = checked_then_read(url)
        seen.clear()
        np.testing.assert_array_equal(store.read("x", ROW, ROW + 2), want)
        assert [r for p, s, r in seen if "/x/" in p and r is None], seen  # fetched whole again
        rewrite_row(root, ROW, keep_mtime=False)
        with pytest.raises(ChunkReadError, match=r"is corrupt"):
            store.read("x", ROW, ROW + 2)


@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_a_date_only_server_gets_if_unmodified_since(tmp_path, monkeypatch, fmt) -> None:
    monkeypatch.setenv(KEEP_ENV, "0")
    root = store_of(tmp_path, fmt)
    with plain_server(root, etag=False, date=True, ranges=True) as (url, seen):
        store, want = checked_then_read(url)
        seen.clear()
        np.testing.assert_array_equal(store.read("x", ROW, ROW + 2), want)
        assert {s for p, s, r in seen if "/x/" in p} == {206}, seen  # ranges, no check again
        # a date has whole seconds: a rewrite within the second of the check is not seen
        rewrite_row(root, ROW, keep_mtime=False, later_s=2)
        with pytest.raises(RemoteChangedError, match=r"changed on the server since"):
            store.read("x", ROW, ROW + 2)


def test_a_server_ignoring_ranges_and_preconditions_is_caught_by_its_etag(
    tmp_path, monkeypatch
) -> None:
    """200 answers with the whole file: cut to the range asked while they name the version
    pinned; one naming another is the changed file (before: the whole file taken for the
    range)."""
    monkeypatch.setenv(KEEP_ENV, "0")
    root = store_of(tmp_path, "npy")
    with plain_server(root, etag=True, date=True, ranges=False) as (url, _):
        store, want = checked_then_read(url)
        np.testing.assert_array_equal(store.read("x", ROW, ROW + 2), want)
        rewrite_row(root, ROW, keep_mtime=False)
        with pytest.raises(RemoteChangedError, match=r"changed on the server since"):
            store.read("x", ROW, ROW + 2)


def test_a_weak_etag_is_compared_not_sent(tmp_path, monkeypatch) -> None:
    """A weak ETag (``W/"..."``) never matches ``If-Match`` (RFC 9110 compares strongly): sent,
    every read of a checked file would be refused. The answers' weak ETags are compared
    instead: the file rewritten is still an error."""
    monkeypatch.setenv(KEEP_ENV, "0")
    root = store_of(tmp_path, "zarr")
    with plain_server(root, etag=True, date=False, ranges=True, weak=True) as (url, seen):
        store, want = checked_then_read(url)
        np.testing.assert_array_equal(store.read("x", ROW, ROW + 2), want)
        rewrite_row(root, ROW, keep_mtime=False)
        with pytest.raises(RemoteChangedError, match=r"changed on the server since"):
            store.read("x", ROW, ROW + 2)
        assert 412 not in [s for _, s, _ in seen], seen
