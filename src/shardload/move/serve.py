"""Serve a folder of stores read-only over HTTP (aiohttp).

The store at ``DIR/name`` is served as ``http://HOST:PORT/name``, its files as
``/name/path/inside``. Files go through aiohttp's ``FileResponse``, which implements single byte
ranges (206 + ``Content-Range``, 416 when unsatisfiable), ``ETag``, ``Last-Modified`` and the
conditional requests. Folders answer with a listing (see :mod:`shardload.move.serve_index`).

Security: the request target is decoded segment by segment from the raw path; ``.``/``..``
segments, encoded slashes or backslashes and NUL bytes are refused (403), and the resolved path
(after following symlinks) must stay inside the served folder (403 otherwise). Nothing is ever
written.

Limits (so idle or slow clients cannot hold the server): a connection must send a complete
request header within ``header_timeout_s`` of its first byte, must start a request within
``idle_timeout_s`` of opening or of its last response (aiohttp's keep-alive timeout), and at most
``max_connections`` connections are open at once; the next ones get ``503`` and are closed.
``Range: bytes=-0`` (an empty suffix) is unsatisfiable: 416.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import unquote

from shardload.errors import require

log = logging.getLogger("shardload.serve")

SHUTDOWN_TIMEOUT_S = 2.0
#: a request's header block must arrive within this many seconds of its first byte
HEADER_TIMEOUT_S = 10.0
#: a connection with no request for this long (since opening, or since its last response) closes
IDLE_TIMEOUT_S = 30.0
#: open connections at most (lowered to fit the open-file limit); more get 503
MAX_CONNECTIONS = 512
_BACKLOG = 128
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
)


class PathRefused(Exception):
    """The request target tries to leave the served folder (answered with 403)."""


def resolve_request_path(root: Path, raw_path: str) -> Path | None:
    """Map a raw request path to a file or folder inside ``root``.

    Parameters
    ----------
    root : Path
        The served folder, already resolved (absolute, no symlinks).
    raw_path : str
        The request target as received (percent-encoded, query string allowed).

    Returns
    -------
    Path or None
        The resolved path inside ``root``, or None when nothing exists there.

    Raises
    ------
    PathRefused
        For ``.``/``..`` segments, encoded ``/`` or ``\\``, NUL bytes, bad encodings, or a
        symlink whose target resolves outside ``root``.
    """
    path = raw_path.split("?", 1)[0].split("#", 1)[0]
    if not path.startswith("/"):
        raise PathRefused(raw_path)
    parts = []
    for segment in path.split("/"):
        if not segment:
            continue  # "//" and the trailing "/" of folders
        try:
            name = unquote(segment, errors="strict")
        except UnicodeDecodeError as exc:
            raise PathRefused(raw_path) from exc
        if name in (".", "..") or any(c in name for c in ("/", "\\", "\0")):
            raise PathRefused(raw_path)
        parts.append(name)
    try:
        real = root.joinpath(*parts).resolve(strict=True)
    except (OSError, RuntimeError):  # missing, symlink loop, name too long
        return None
    if real != root and root not in real.parents:
        raise PathRefused(raw_path)  # a symlink pointing out of the served folder
    return real


def _make_app(root: Path):
    web = require("aiohttp.web", "serve")
    from shardload.move import serve_index

    async def handle(request):
        try:
            path = await asyncio.to_thread(resolve_request_path, root, request.raw_path)
        except PathRefused:
            raise web.HTTPForbidden(text="path outside the served folder\n") from None
        if path is None:
            raise web.HTTPNotFound(text="not found\n")
        if path.is_file():
            if _empty_suffix_range(request.headers.get("Range", "")):
                size = (await asyncio.to_thread(path.stat)).st_size
                raise web.HTTPRequestRangeNotSatisfiable(
                    headers={"Content-Range": f"bytes */{size}"}
                )
            return web.FileResponse(path)
        if not path.is_dir():
            raise web.HTTPNotFound(text="not a file\n")
        query_format = request.query.get("format", "")
        accept = request.headers.get("Accept", "")
        if path == root:
            as_html = query_format == "html" or (query_format != "json" and "text/html" in accept)
            stores = await asyncio.to_thread(serve_index.list_stores, root)
            if as_html:
                return web.Response(text=serve_index.stores_html(stores), content_type="text/html")
            return web.json_response({"stores": stores})
        as_json = query_format == "json" or (
            query_format != "html" and "application/json" in accept and "text/html" not in accept
        )
        rel = path.relative_to(root).as_posix()
        entries = await asyncio.to_thread(serve_index.list_folder, root, path)
        if as_json:
            return web.json_response({"path": rel + "/", "entries": entries})
        return web.Response(text=serve_index.folder_html(rel, entries), content_type="text/html")

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)  # HEAD is allowed too; other methods get 405
    return app


def _empty_suffix_range(header: str) -> bool:
    """``bytes=-0``: the last zero bytes, which RFC 9110 calls unsatisfiable (416)."""
    unit, _, spec = header.partition("=")
    spec = spec.strip()
    return (
        unit.strip().lower() == "bytes"
        and spec.startswith("-")
        and spec[1:].isdigit()
        and int(spec[1:]) == 0
    )


class _Limits:
    """Connection limit and header deadline, shared by the connections of one server."""

    def __init__(self, max_connections: int, header_timeout_s: float, idle_timeout_s: float):
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.open = 0
        self.refused = 0  # since the last warning
        self.warned_at = -1e9

    def refuse(self) -> None:
        """Count a refused connection; warn at most every 10 s (a flood must not flood the log)."""
        self.refused += 1
        now = time.monotonic()
        if now - self.warned_at >= 10:
            log.warning(
                "refused %d connection(s): %d open, the limit (max_connections)",
                self.refused,
                self.open,
            )
            self.refused, self.warned_at = 0, now


class _Guarded(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection: refuses it when too many are open, and
    closes it when a request header takes longer than ``header_timeout_s`` to arrive, or no
    byte comes within ``idle_timeout_s`` of opening (any aiohttp version)."""

    def __init__(self, inner, limits: _Limits) -> None:
        self.inner = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.counted = False
        self.timer: asyncio.TimerHandle | None = None
        self.in_header = False  # bytes of a request header received, its end not yet
        self.tail = b""

    def connection_made(self, transport) -> None:
        self.transport = transport
        if self.limits.open >= self.limits.max_connections:
            self.limits.refuse()
            transport.write(_BUSY)
            transport.close()
            return
        self.limits.open += 1
        self.counted = True
        self.inner.connection_made(transport)
        self._arm(self.limits.idle_timeout_s)

    def _arm(self, seconds: float | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        if seconds is not None:
            self.timer = asyncio.get_running_loop().call_later(seconds, self._expire)

    def _expire(self) -> None:
        self.timer = None
        if self.transport is not None and not self.transport.is_closing():
            what = "a request header" if self.in_header else "a request"
            log.info("closing a connection that sent no complete %s in time", what)
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if not self.counted:
            return
        if not self.in_header and self.timer is not None and not self.tail:
            self._arm(None)  # the first bytes came: now the header deadline counts
        window = self.tail + data
        end = window.rfind(b"\r\n\r\n")
        if end >= 0:
            rest = window[end + 4 :]
            self.in_header = bool(rest.strip(b"\r\n"))  # pipelined bytes of the next request
            self._arm(self.limits.header_timeout_s if self.in_header else None)
        elif not self.in_header and data:
            self.in_header = True
            self._arm(self.limits.header_timeout_s)
        self.tail = window[-3:]
        self.inner.data_received(data)

    def eof_received(self):
        return self.inner.eof_received() if self.counted else None

    def connection_lost(self, exc) -> None:
        self._arm(None)
        if self.counted:
            self.counted = False
            self.limits.open -= 1
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.counted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.counted:
            self.inner.resume_writing()


def _max_connections(wanted: int) -> int:
    """``wanted``, lowered to what the open-file limit can hold: two descriptors per connection
    (its socket and a file being sent), a burst of ``listen`` backlog connections accepted before
    their refusal closes them, and 50 for the rest of the process."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return wanted
    if soft <= 0:  # RLIM_INFINITY
        return wanted
    return max(1, min(wanted, (soft - _BACKLOG - 50) // 2))


def _access_logger_class():
    from aiohttp.abc import AbstractAccessLogger

    class AccessLogger(AbstractAccessLogger):
        """One line per request: method path status bytes time."""

        def log(self, request, response, time):
            sent = 0 if request.method == "HEAD" or response.status == 304 else None
            self.logger.info(
                "%s %s %d %d %.1fms",
                request.method,
                request.raw_path,
                response.status,
                sent if sent is not None else (response.content_length or 0),
                time * 1000,
            )

    return AccessLogger


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.listen(_BACKLOG)
    sock.setblocking(False)
    return sock


def is_loopback(host: str) -> bool:
    """True when ``host`` only accepts connections from this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


async def _run(
    root: Path,
    host: str,
    port: int,
    ready: Callable[[str], None] | None,
    stop: asyncio.Event,
    limits: _Limits | None = None,
) -> None:
    web = require("aiohttp.web", "serve")
    if limits is None:
        limits = _Limits(_max_connections(MAX_CONNECTIONS), HEADER_TIMEOUT_S, IDLE_TIMEOUT_S)
    if not root.is_dir():
        raise FileNotFoundError(f"cannot serve {root}: not a folder")
    if not is_loopback(host):
        log.warning(
            "serving %s on %s, which is reachable from other machines; anyone who can reach "
            "this address can read every file under it",
            root,
            host,
        )
    runner = web.AppRunner(
        _make_app(root),
        access_log_class=_access_logger_class(),
        access_log=log,
        handle_signals=False,
        shutdown_timeout=SHUTDOWN_TIMEOUT_S,
        keepalive_timeout=limits.idle_timeout_s,
    )
    await runner.setup()
    server = None
    try:
        sock = _bind(host, port)
        loop = asyncio.get_running_loop()
        handler = runner.server
        assert handler is not None
        server = await loop.create_server(lambda: _Guarded(handler(), limits), sock=sock)
        url = _url(sock)
        log.info("serving %s at %s", root, url)
        if ready is not None:
            ready(url)
        await stop.wait()
    finally:
        if server is not None:
            server.close()  # stop accepting; runner.cleanup closes the open connections
        await runner.cleanup()


def serve(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    ready: Callable[[str], None] | None = None,
    *,
    max_connections: int = MAX_CONNECTIONS,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> None:
    """Serve ``root`` in the foreground until Ctrl-C or SIGTERM, then return.

    SIGINT and SIGTERM stop the server only while this call runs (the foreground is its job);
    the caller's handlers are put back when it returns. :func:`serving` touches no signal.

    Parameters
    ----------
    root : str or Path
        The folder whose stores (sub-folders) are served.
    host : str
        Address to bind; loopback by default. Other addresses log a warning.
    port : int
        TCP port; 0 picks a free one (passed to ``ready`` in the URL).
    ready : callable, optional
        Called with the base URL (``http://HOST:PORT/``) once the server accepts connections.
    max_connections, header_timeout_s, idle_timeout_s
        Limits on clients (see the module docstring).
    """
    root = Path(root).expanduser().resolve()
    limits = _Limits(_max_connections(max_connections), header_timeout_s, idle_timeout_s)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        installed = {}
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(sig)
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop.set)
                installed[sig] = previous
        try:
            await _run(root, host, port, ready, stop, limits)
        finally:
            for sig, previous in installed.items():
                loop.remove_signal_handler(sig)
                # remove_signal_handler leaves SIG_DFL: give the caller its own handler back
                with contextlib.suppress(TypeError, ValueError):
                    signal.signal(sig, previous)

    asyncio.run(main())


@contextlib.contextmanager
def serving(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_connections: int = MAX_CONNECTIONS,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
) -> Iterator[str]:
    """Run the server in a background thread for the duration of a ``with`` block.

    Parameters
    ----------
    root : str or Path
        The folder to serve.
    host : str
        Address to bind (loopback by default).
    port : int
        TCP port; 0 (the default) picks a free one.
    max_connections, header_timeout_s, idle_timeout_s
        Limits on clients (see the module docstring).

    Yields
    ------
    str
        The base URL, e.g. ``http://127.0.0.1:41234/``.

    Examples
    --------
    >>> with serving(tmp_path) as url:  # doctest: +SKIP
    ...     requests.get(url).json()
    """
    root = Path(root).expanduser().resolve()
    limits = _Limits(_max_connections(max_connections), header_timeout_s, idle_timeout_s)
    started = threading.Event()
    state: dict = {}

    def on_ready(url: str) -> None:
        state["url"] = url
        started.set()

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = asyncio.Event()
        await _run(root, host, port, on_ready, state["stop"], limits)

    def target() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:  # reported to the caller below
            state["error"] = exc
        finally:
            started.set()

    thread = threading.Thread(target=target, name="shardload-serve", daemon=True)
    thread.start()
    started.wait(timeout=30)
    if "url" not in state:
        thread.join(timeout=5)
        raise RuntimeError(f"the server for {root} did not start") from state.get("error")
    try:
        yield state["url"]
    finally:
        deadline = time.monotonic() + SHUTDOWN_TIMEOUT_S + 5
        with contextlib.suppress(RuntimeError):  # loop already closed
            state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
