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

Beyond loopback (:mod:`shardload.move.serve_auth`): bearer ``tokens`` (401 without one),
TLS from ``tls_cert`` / ``tls_key``, at most ``max_client_connections`` connections at once per
client address (429 beyond); a non-loopback ``host`` without a token is refused unless ``insecure``.
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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from shardload.errors import require
from shardload.move.serve_app import access_logger_class, make_app
from shardload.move.serve_auth import (
    MAX_CLIENT_CONNECTIONS,
    Access,
    check_bind,
    read_tokens,
    tls_context,
)
from shardload.move.serve_limits import (
    BACKLOG,
    ConnectionLimits,
    GuardedProtocol,
    fit_max_connections,
)

log = logging.getLogger("shardload.serve")

SHUTDOWN_TIMEOUT_S = 2.0
#: a request's header block must arrive within this many seconds of its first byte
HEADER_TIMEOUT_S = 10.0
#: a connection with no request for this long (since opening, or since its last response) closes
IDLE_TIMEOUT_S = 30.0
#: open connections at most (lowered to fit the open-file limit); more get 503
MAX_CONNECTIONS = 512


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(addr)
    except OSError:
        sock.close()
        raise
    sock.listen(BACKLOG)
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


def _url(sock: socket.socket, scheme: str = "http") -> str:
    host, port = sock.getsockname()[:2]
    if ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}/"


def make_access(
    host: str,
    *,
    tokens: Sequence[str] = (),
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
    insecure: bool = False,
    max_client_connections: int | None = None,
) -> Access:
    """Who may read (checked before anything binds): the tokens, the TLS context, the
    per-client limit (None: ``MAX_CLIENT_CONNECTIONS`` beyond loopback, none on loopback,
    where every client has the same address); refuses a non-loopback ``host`` without a
    token unless ``insecure``."""
    checked = read_tokens(tokens, env=False)
    check_bind(host, checked, insecure=insecure, loopback=is_loopback(host))
    if max_client_connections is None:  # loopback: every client is 127.0.0.1, so no limit
        max_client_connections = 0 if is_loopback(host) else MAX_CLIENT_CONNECTIONS
    elif max_client_connections < 1:
        from shardload.errors import ConfigError

        raise ConfigError(f"--max-client-connections must be >= 1, got {max_client_connections}")
    return Access(
        tokens=tuple(t.encode() for t in checked),
        ssl_context=tls_context(tls_cert, tls_key),
        max_client_connections=int(max_client_connections),
    )


async def _run(
    root: Path,
    host: str,
    port: int,
    ready: Callable[[str], None] | None,
    stop: asyncio.Event,
    limits: ConnectionLimits | None = None,
    access: Access | None = None,
) -> None:
    web = require("aiohttp.web", "serve")
    if access is None:
        access = make_access(host)
    if limits is None:
        limits = ConnectionLimits(
            fit_max_connections(MAX_CONNECTIONS),
            HEADER_TIMEOUT_S,
            IDLE_TIMEOUT_S,
            access.max_client_connections,
        )
    if not root.is_dir():
        raise FileNotFoundError(f"cannot serve {root}: not a folder")
    if not is_loopback(host) and not access.tokens:  # insecure=True said so
        log.warning(
            "serving %s on %s without a token (--insecure); anyone who can reach this address "
            "can read every file under it",
            root,
            host,
        )
    logging.getLogger("aiohttp.server").addFilter(_quiet_bad_requests)
    runner = web.AppRunner(
        make_app(root, access),
        access_log_class=access_logger_class(),
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
        server = await loop.create_server(
            lambda: GuardedProtocol(handler(), limits),
            sock=sock,
            ssl=access.ssl_context,
            ssl_handshake_timeout=limits.header_timeout_s if access.ssl_context else None,
        )
        url = _url(sock, access.scheme)
        log.info("serving %s at %s", root, url)
        if ready is not None:
            ready(url)
        await stop.wait()
    finally:
        if server is not None:
            server.close()  # stop accepting; runner.cleanup closes the open connections
        await runner.cleanup()


def _limits(
    root: str | Path, access: Access, max_connections: int, header_s: float, idle_s: float
) -> tuple[Path, ConnectionLimits]:
    limits = ConnectionLimits(
        fit_max_connections(max_connections), header_s, idle_s, access.max_client_connections
    )
    return Path(root).expanduser().resolve(), limits


def _quiet_bad_requests(record: logging.LogRecord) -> bool:
    """Drop aiohttp's "Error handling request" record (a full traceback) for a malformed
    request: the access log already has its one line (``UNKNOWN / 400``), and any client could
    otherwise write a dozen lines to the log per request. Other errors keep their traceback."""
    from aiohttp.http_exceptions import HttpProcessingError

    exc = record.exc_info[1] if record.exc_info else None
    return not isinstance(exc, HttpProcessingError)


def serve(
    root: str | Path,
    host: str = "127.0.0.1",
    port: int = 8000,
    ready: Callable[[str], None] | None = None,
    *,
    max_connections: int = MAX_CONNECTIONS,
    header_timeout_s: float = HEADER_TIMEOUT_S,
    idle_timeout_s: float = IDLE_TIMEOUT_S,
    tokens: Sequence[str] = (),
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
    insecure: bool = False,
    max_client_connections: int | None = None,
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
    tokens, tls_cert, tls_key, insecure, max_client_connections
        Who may read (:func:`make_access`; :mod:`shardload.move.serve_auth`).
    """
    access = make_access(
        host,
        tokens=tokens,
        tls_cert=tls_cert,
        tls_key=tls_key,
        insecure=insecure,
        max_client_connections=max_client_connections,
    )
    root, limits = _limits(root, access, max_connections, header_timeout_s, idle_timeout_s)

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
            await _run(root, host, port, ready, stop, limits, access)
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
    tokens: Sequence[str] = (),
    tls_cert: str | Path | None = None,
    tls_key: str | Path | None = None,
    insecure: bool = False,
    max_client_connections: int | None = None,
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
    tokens, tls_cert, tls_key, insecure, max_client_connections
        As :func:`serve`.

    Yields
    ------
    str
        The base URL, e.g. ``http://127.0.0.1:41234/``.

    Examples
    --------
    >>> with serving(tmp_path) as url:  # doctest: +SKIP
    ...     requests.get(url).json()
    """
    access = make_access(
        host,
        tokens=tokens,
        tls_cert=tls_cert,
        tls_key=tls_key,
        insecure=insecure,
        max_client_connections=max_client_connections,
    )
    root, limits = _limits(root, access, max_connections, header_timeout_s, idle_timeout_s)
    started = threading.Event()
    state: dict = {}

    def on_ready(url: str) -> None:
        state["url"] = url
        started.set()

    async def main() -> None:
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = asyncio.Event()
        await _run(root, host, port, on_ready, state["stop"], limits, access)

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
