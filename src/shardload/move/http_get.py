"""The GETs of data by http(s) URL on Python's own ``http.client``, each answer read from the
socket straight into its buffer (issues 25 and 28).

fsspec's HTTP filesystem runs every request of a process on one event-loop thread (aiohttp):
each block of an answer is parsed there, handed over as a new ``bytes`` and copied into the
buffer, and every call from a reading thread goes to that loop and back. For the shards a first
epoch fetches whole, that loop thread cost about one core on loopback: the default store's two
shards (95 MiB) took 0.19-0.47 s by fsspec's plain GETs, 0.08-0.18 s on ``http.client``
(docs/benchmarks.md, "shards by URL on http.client"). Here the thread that wants the bytes makes
the request on a kept-alive connection of its own and ``readinto``\\ s the body, a piece at a time,
into one preallocated buffer: the kernel copies the bytes once, into their place. That buffer is
one this process used before once it is free (:mod:`.buffers`): no fresh pages to zero.

The same guarantees as the aiohttp path (:func:`.pinned._http_get`), which stays for what this
reader does not do: the same headers (the bearer token of ``storage_options`` or
``SHARDLOAD_TOKEN``), TLS verified with the same context (the system's authorities and
``ca_file``), the connect and read-stall timeout ``timeout_s`` on the socket and a deadline on the
whole answer (``2 * timeout_s + 1``, as the event loop's), the version preconditions and checks of
:mod:`.pinned` (the caller's), a 404 as ``FileNotFoundError``, other statuses as
:class:`HTTPStatusError` (5xx, 408 and 429 retried by :mod:`.retries`, as aiohttp's), a body cut
short or garbled as :class:`BrokenAnswer` (retried). A connection found closed by the server
while idle is replaced once at once. At most ``CONNECTIONS_PER_STORE`` connections per opened
store and process at once (besides fsspec's pool, for everything else), an idle one closed
after ``IDLE_KEEPALIVE_S``; all of them closed by :meth:`HttpReader.close` (``Store.close``,
through ``http_client.close_client``); a forked child never uses its parent's.

It is used only where the filesystem's options are ones it reproduces (headers, an
``ssl.SSLContext``, the timeout set by :mod:`.http_client`); any other client option (an
``auth``, a custom ``get_client``, ``ssl=False``), a redirect or an encoded answer goes through
aiohttp as before.
"""

from __future__ import annotations

import http.client
import os
import ssl
import threading
import time
from typing import Any
from urllib.parse import urlsplit

from shardload.move.buffers import BufferPool, shared_pool
from shardload.move.http_client import (
    CONNECTIONS_PER_STORE,
    IDLE_KEEPALIVE_S,
    bounded_client,
    is_http,
)

__all__ = ["BrokenAnswer", "HTTPStatusError", "HttpReader", "Unsupported", "reader_of"]

#: An answer is read into its buffer at most this many bytes per call (the deadline's checks).
PIECE_BYTES = 1 << 20

#: this thread's watcher of the answer it reads (``cb(buf, at, n)`` after each piece)
WATCH = threading.local()


class HTTPStatusError(OSError):
    """An answer of status >= 400 (other than 404 and 412): ``status`` as aiohttp's error."""

    def __init__(self, status: int, reason: str, url: str) -> None:
        super().__init__(f"{status} {reason} for {url}")
        self.status = status


class BrokenAnswer(ConnectionError):
    """An answer cut short or not HTTP (``http.client``'s errors; retried, as aiohttp's)."""


class Unsupported(Exception):
    """An answer this reader does not take (a redirect, an encoded body): read it by aiohttp."""


class HttpReader:
    """One process's GETs for one opened store (see the module docstring)."""

    def __init__(self, headers: dict[str, str], context: ssl.SSLContext | None, timeout_s: float):
        self.headers, self.context, self.timeout_s = headers, context, timeout_s
        self._idle: list[tuple[float, tuple[str, str, int], http.client.HTTPConnection]] = []
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(CONNECTIONS_PER_STORE)
        self._pid, self._closed = os.getpid(), False
        self.requests = 0  # made here (tests count them)

    @property
    def buffers(self) -> BufferPool:
        """The process's pool of answer buffers (:mod:`.buffers`)."""
        return shared_pool()

    @classmethod
    def of(cls, target: Any, timeout_s: float) -> HttpReader | None:
        """A reader for fsspec's HTTP filesystem ``target``, or None when its options ask for
        what only aiohttp does."""
        kwargs = dict(getattr(target, "kwargs", None) or {})
        client = dict(getattr(target, "client_kwargs", None) or {})
        if getattr(target, "get_client", None) is not bounded_client:
            return None
        if set(kwargs) - {"headers", "ssl"} or set(client) - {"timeout"}:
            return None
        context = kwargs.get("ssl")
        if context is not None and not isinstance(context, ssl.SSLContext):
            return None
        headers = {str(k): str(v) for k, v in dict(kwargs.get("headers") or {}).items()}
        return cls(headers, context, timeout_s)

    def get(self, url: str, start: int | None, end: int | None, headers: dict[str, str]) -> Any:
        """GET ``url`` (bytes ``[start, end)`` when given) with the extra ``headers``: the
        answer's status, its headers and its body in one buffer (a read-only memoryview).
        ``start == end`` is the caller's (no request)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise Unsupported(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        sent = {**self.headers, **headers}
        if start is not None or end is not None:
            sent["Range"] = f"bytes={start or 0}-{'' if end is None else end - 1}"
        deadline = time.monotonic() + 2 * self.timeout_s + 1
        with self._slots:
            conn, reused = self._take(key)
            try:
                try:
                    r = self._ask(conn, target, sent)
                except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                    if not reused:
                        raise
                    conn.close()  # closed by the server while idle: once more, on a new one
                    conn, reused = self._new(key), False
                    r = self._ask(conn, target, sent)
                self.requests += 1
                body = self._body(r, url, deadline)
            except http.client.HTTPException as exc:  # (RemoteDisconnected is an OSError)
                conn.close()
                raise BrokenAnswer(f"{url}: {type(exc).__name__}: {exc}") from exc
            except BaseException:
                conn.close()
                raise
            if r.will_close:
                conn.close()
            else:
                self._give(key, conn)
        return r.status, r.headers, body

    def _ask(self, conn: http.client.HTTPConnection, target: str, headers: dict[str, str]) -> Any:
        conn.request("GET", target, headers=headers)
        return conn.getresponse()

    def _body(self, r: http.client.HTTPResponse, url: str, deadline: float) -> memoryview:
        """The body of ``r`` (statuses 200 and 206) read into one buffer; other statuses
        raised, a redirect or an encoded body :class:`Unsupported`."""
        if r.status == 404:
            raise FileNotFoundError(url)
        if r.status == 412:  # the version pinned is gone: the caller says so
            r.read()
            return memoryview(b"")
        if 300 <= r.status < 400:
            raise Unsupported(f"{r.status} for {url}")
        if r.status not in (200, 206):
            raise HTTPStatusError(r.status, r.reason, url)
        if r.headers.get("Content-Encoding", "identity").lower() != "identity":
            raise Unsupported(f"{url}: Content-Encoding {r.headers['Content-Encoding']}")
        if r.length is None:  # no Content-Length (chunked): read as it comes
            return memoryview(r.read()).toreadonly()
        n = int(r.length)
        buf = self.buffers.take(n)  # no zero-fill: every byte is written below
        at = 0
        watch = getattr(WATCH, "cb", None)
        if watch is not None:
            watch(buf, 0, n)
        while at < n:
            got = r.readinto(buf[at : min(n, at + PIECE_BYTES)])
            if not got:
                raise http.client.IncompleteRead(bytes(0), n - at)
            at += got
            if watch is not None:
                watch(buf, at, n)
            if time.monotonic() > deadline:
                raise TimeoutError(f"{url}: the answer took over {deadline:.0f} s")
        return buf.toreadonly()

    def _take(self, key: tuple[str, str, int]) -> tuple[http.client.HTTPConnection, bool]:
        """An idle connection to ``key`` (True), else a new one (False); those idle too long
        closed."""
        now = time.monotonic()
        with self._lock:
            if self._pid != os.getpid():  # a forked child: never its parent's sockets
                self._idle, self._lock, self._pid = [], threading.Lock(), os.getpid()
            stale = [c for t, _, c in self._idle if now - t > IDLE_KEEPALIVE_S]
            self._idle = [e for e in self._idle if now - e[0] <= IDLE_KEEPALIVE_S]
            found = next((i for i, (_, k, _) in enumerate(self._idle) if k == key), None)
            conn = self._idle.pop(found)[2] if found is not None else None
        for c in stale:
            c.close()
        return (conn, True) if conn is not None else (self._new(key), False)

    def _new(self, key: tuple[str, str, int]) -> http.client.HTTPConnection:
        scheme, host, port = key
        if scheme == "https":
            context = self.context or ssl.create_default_context()
            return http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=context)
        return http.client.HTTPConnection(host, port, timeout=self.timeout_s)

    def _give(self, key: tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if self._pid == os.getpid() and not self._closed:
                self._idle.append((time.monotonic(), key, conn))
                return
        conn.close()  # closed meanwhile (or a fork while this thread read)

    def close(self) -> None:
        """Close the idle connections (those in use close when their answer is read)."""
        with self._lock:
            idle, self._idle, self._closed = self._idle, [], True
            mine = self._pid == os.getpid()
        if mine:
            for _, _, conn in idle:
                conn.close()


#: the attribute of fsspec's filesystem holding its reader (``http_client.close_client`` closes it)
READER_ATTR = "_shardload_reader"
_MAKING = threading.Lock()


def reader_of(target: Any, timeout_s: float) -> HttpReader | None:
    """The reader of fsspec's HTTP filesystem ``target`` (one per opened store and process: a
    ``RemoteFileSystem`` opens its own ``target`` in each process), made on first use; None
    where ``target`` is not http(s) or its options ask for aiohttp."""
    got = getattr(target, READER_ATTR, None)
    if got is None:
        with _MAKING:
            got = getattr(target, READER_ATTR, None)
            if got is None:
                protocol = (
                    target.protocol if isinstance(target.protocol, str) else target.protocol[0]
                )
                reader = HttpReader.of(target, timeout_s) if is_http(f"{protocol}://") else None
                got = reader or False
                setattr(target, READER_ATTR, got)
    return got if isinstance(got, HttpReader) else None
