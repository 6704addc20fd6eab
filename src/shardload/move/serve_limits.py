"""The connection limits of ``shardload serve``: at most so many open connections (503 beyond)
and so many from one client address (429 beyond), a deadline for each request header and for
an idle connection, whatever the aiohttp version."""

from __future__ import annotations

import asyncio
import logging
import time

log = logging.getLogger("shardload.serve")

#: the listen backlog: connections accepted before their refusal closes them
BACKLOG = 128
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
)
_TOO_MANY = (
    b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 0\r\nRetry-After: 1\r\n"
    b"Connection: close\r\n\r\n"
)


class ConnectionLimits:
    """Connection limit and header deadline, shared by the connections of one server."""

    def __init__(
        self,
        max_connections: int,
        header_timeout_s: float,
        idle_timeout_s: float,
        max_client_connections: int | None = None,
    ):
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.idle_timeout_s = idle_timeout_s
        self.max_client_connections = max_client_connections or max_connections
        self.open = 0
        self.by_client: dict[str, int] = {}  # open connections per client address
        self.refused = 0  # since the last warning
        self.warned_at = -1e9

    def refuse(self, why: str = "max_connections") -> None:
        """Count a refused connection; warn at most every 10 s (a flood must not flood the log)."""
        self.refused += 1
        now = time.monotonic()
        if now - self.warned_at >= 10:
            log.warning(
                "refused %d connection(s): %d open, a limit (%s)", self.refused, self.open, why
            )
            self.refused, self.warned_at = 0, now


class GuardedProtocol(asyncio.Protocol):
    """Wraps aiohttp's protocol for one connection: refuses it when too many are open, and
    closes it when a request header takes longer than ``header_timeout_s`` to arrive, or no
    byte comes within ``idle_timeout_s`` of opening (any aiohttp version)."""

    def __init__(self, inner, limits: ConnectionLimits) -> None:
        self.inner = inner
        self.limits = limits
        self.transport: asyncio.Transport | None = None
        self.counted = False
        self.timer: asyncio.TimerHandle | None = None
        self.in_header = False  # bytes of a request header received, its end not yet
        self.tail = b""
        self.client = "?"

    def connection_made(self, transport) -> None:
        self.transport = transport
        limits = self.limits
        if limits.open >= limits.max_connections:
            limits.refuse()
            transport.write(_BUSY)
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        self.client = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
        if limits.by_client.get(self.client, 0) >= limits.max_client_connections:
            limits.refuse("max_client_connections, from " + self.client)
            transport.write(_TOO_MANY)
            transport.close()
            return
        limits.by_client[self.client] = limits.by_client.get(self.client, 0) + 1
        limits.open += 1
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
            left = self.limits.by_client[self.client] - 1
            if left:
                self.limits.by_client[self.client] = left
            else:
                del self.limits.by_client[self.client]
            self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self.counted:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if self.counted:
            self.inner.resume_writing()


def fit_max_connections(wanted: int) -> int:
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
    return max(1, min(wanted, (soft - BACKLOG - 50) // 2))
