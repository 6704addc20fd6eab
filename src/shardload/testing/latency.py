"""A latency-injecting TCP proxy on loopback, to test and measure reading from far away.

``with latency_proxy("127.0.0.1", 8000, rtt_s=0.02) as (host, port): ...`` forwards every
connection made to ``host:port`` to the target and delays each direction by ``rtt_s / 2``: a
request reaches the server half a round trip after it was sent, its answer the client half a
round trip after the server sent it. The delay is a delay line, not a throttle: bytes keep
flowing at the link's speed, each arriving ``rtt_s / 2`` late (as on a long fat network). A new
connection also waits one round trip before its first byte is forwarded, as a TCP handshake
would. TLS passes through untouched (the proxy only moves bytes).

The proxy counts requests in flight the only way a byte mover can: a connection is *waiting*
from the first client byte after the server's last answer byte until the next answer byte
arrives from the server. HTTP/1.1 clients send one request at a time per connection, so the
number of waiting connections is the number of requests in flight;
:attr:`LatencyProxy.max_waiting` is its peak. Each request's turn, from the client's first
byte (or, the first on a connection, from the connection's opening: its handshake included)
to the first byte of its answer, is kept in :attr:`LatencyProxy.turns`;
:meth:`LatencyProxy.round_trips` is the longest chain of turns each begun after the previous
one was answered: the round trips a client waited for one after another.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator

#: bytes read from a socket at once
READ_BYTES = 1 << 16


class LatencyProxy:
    """The proxy's state and counters (see the module docstring)."""

    def __init__(self, target_host: str, target_port: int, rtt_s: float) -> None:
        self.target = (target_host, target_port)
        self.rtt_s = float(rtt_s)
        self.waiting = 0
        self.max_waiting = 0
        self.requests = 0  # requests seen (a connection's turns from answered to waiting)
        self.connections = 0
        #: (sent, answered) of each request, ``time.monotonic()`` seconds (module docstring)
        self.turns: list[tuple[float, float]] = []

    def reset_counts(self) -> None:
        self.max_waiting = self.waiting
        self.requests = self.connections = 0
        self.turns = []

    def round_trips(self, *, since: float = float("-inf"), until: float = float("inf")) -> int:
        """The longest chain of requests sent in ``[since, until]`` (``time.monotonic()``)
        each sent after the previous one's answer arrived: round trips waited for in turn.

        >>> p = LatencyProxy("127.0.0.1", 1, rtt_s=1.0)
        >>> p.turns = [(0.0, 1.0), (1.0, 2.0), (1.1, 2.1), (2.1, 3.1), (0.5, 1.5)]
        >>> p.round_trips()
        3
        """
        turns = sorted(t for t in self.turns if since <= t[0] <= until)
        depth: list[int] = []
        for sent, _ in turns:
            before = [d for (_, answered), d in zip(turns, depth, strict=False) if answered <= sent]
            depth.append(1 + max(before, default=0))
        return max(depth, default=0)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the proxy stops: nothing to report
            await self._forward(reader, writer)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        opened = time.monotonic()
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        await asyncio.sleep(self.rtt_s)  # the handshake's round trip
        state: dict = {"waiting": False, "sent": opened}  # the first turn: from the opening
        tasks = [
            asyncio.ensure_future(self._pipe(reader, up_writer, state, upstream=True)),
            asyncio.ensure_future(self._pipe(up_reader, writer, state, upstream=False)),
        ]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            for w in (writer, up_writer):
                with contextlib.suppress(Exception):
                    w.close()
            if state["waiting"]:
                self.waiting -= 1

    def _mark(self, state: dict, waiting: bool) -> None:
        if state["waiting"] != waiting:
            state["waiting"] = waiting
            now = time.monotonic()
            if waiting:
                state["sent"] = state.pop("sent", None) or now
            else:
                self.turns.append((state.pop("sent", now), now))
            self.waiting += 1 if waiting else -1
            self.requests += waiting
            self.max_waiting = max(self.max_waiting, self.waiting)

    async def _pipe(
        self,
        src: asyncio.StreamReader,
        dst: asyncio.StreamWriter,
        state: dict,
        *,
        upstream: bool,
    ) -> None:
        """Copy ``src`` to ``dst``, each piece delivered ``rtt_s / 2`` after it was read."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        half = self.rtt_s / 2

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                if not data:
                    with contextlib.suppress(OSError):
                        dst.write_eof()
                    return
                delay = due - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                if not upstream:
                    self._mark(state, False)  # the answer arrives at the client
                dst.write(data)
                await dst.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await src.read(READ_BYTES)
                if upstream and data:
                    self._mark(state, True)  # a request leaves the client
                await queue.put((time.monotonic() + half, data))
                if not data:
                    break
            await sender
        finally:
            sender.cancel()


@contextlib.contextmanager
def latency_proxy(
    target_host: str, target_port: int, *, rtt_s: float, host: str = "127.0.0.1"
) -> Iterator[tuple[LatencyProxy, int]]:
    """Run a :class:`LatencyProxy` in a background thread; yields it and its port."""
    proxy = LatencyProxy(target_host, target_port, rtt_s)
    started = threading.Event()
    state: dict = {}

    async def main() -> None:
        server = await asyncio.start_server(proxy.handle, host, 0)
        state["port"] = server.sockets[0].getsockname()[1]
        state["loop"] = asyncio.get_running_loop()
        state["stop"] = asyncio.Event()
        started.set()
        async with server:
            await state["stop"].wait()

    def run() -> None:
        try:
            asyncio.run(main())
        finally:
            started.set()

    thread = threading.Thread(target=run, name="shardload-latency-proxy", daemon=True)
    thread.start()
    started.wait(10)
    if "port" not in state:
        raise RuntimeError("the latency proxy did not start")
    try:
        yield proxy, state["port"]
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(timeout=10)
