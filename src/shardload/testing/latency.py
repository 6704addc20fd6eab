"""A latency-injecting TCP proxy on loopback, to test and measure reading from far away.

``with latency_proxy("127.0.0.1", 8000, rtt_s=0.02) as (host, port): ...`` forwards every
connection made to ``host:port`` to the target and delays each direction by ``rtt_s / 2``: a
request reaches the server half a round trip after it was sent, its answer the client half a
round trip after the server sent it. The delay is a delay line, not a throttle: bytes keep
flowing at the link's speed, each arriving ``rtt_s / 2`` late (as on a long fat network). A new
connection also waits one round trip before its first byte is forwarded, as a TCP handshake
would. TLS passes through untouched (the proxy only moves bytes).

Each direction of a connection is a :class:`DelayLine`: one thread reads the socket into large
reused buffers (``recv_into``, as much as the kernel holds, up to :data:`PIECE_BYTES`), another
sends each piece ``rtt_s / 2`` after it was read, the pieces due at once in one ``sendall``. Both
wait in the kernel without the GIL, so the proxy's own CPU is two copies a byte and a few
Python steps a piece, not a bound on what it moves (:attr:`LatencyProxy.pieces`,
:attr:`LatencyProxy.sends` and :attr:`LatencyProxy.bytes_moved` count them).

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

import collections
import contextlib
import fcntl
import os
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator

#: the most bytes one read of a delay line takes (one ``recv_into`` or ``os.splice``)
PIECE_BYTES = 1 << 20
#: a delay line's user-space buffer holds several pieces (where ``os.splice`` is missing)
BUFFER_BYTES = 4 * PIECE_BYTES
#: the name of every thread of the proxy (benchmarks count their CPU apart)
THREAD_NAME = "shardload-latency-proxy"
F_SETPIPE_SZ = 1031  # fcntl (Linux)
#: empty pipes (or buffers) a proxy keeps for use again; the rest are closed (pipe pages are
#: counted per user)
FREE_HOLDERS = 16


def _thread(target: Callable[..., object], *args: object) -> threading.Thread:
    t = threading.Thread(target=target, args=args, name=THREAD_NAME, daemon=True)
    t.start()
    return t


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it


class _Pipe:
    """Pieces held in the kernel: a pipe that ``os.splice`` fills from one socket and drains
    into the other, the bytes never copied into the process (Linux)."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()

    def grow(self) -> None:
        """Hold up to PIECE_BYTES (the default holds 16 pages), for a line that filled one."""
        with contextlib.suppress(OSError):  # beyond the user's pipe pages: as it is
            fcntl.fcntl(self.w, F_SETPIPE_SZ, PIECE_BYTES)

    def fill(self, src: socket.socket) -> int | None:
        """Bytes moved from ``src`` (waits for some; 0 at its end), None if this is full."""
        poll = select.poll()  # wait here: a splice waiting for the socket locks the pipe
        poll.register(src, select.POLLIN)
        poll.poll()
        try:
            return os.splice(src.fileno(), self.w, PIECE_BYTES, flags=os.SPLICE_F_NONBLOCK)
        except BlockingIOError:
            return None

    def drain(self, dst: socket.socket, n: int) -> None:
        while n:
            n -= os.splice(self.r, dst.fileno(), n)

    def reuse(self) -> None:
        return None

    def close(self) -> None:
        os.close(self.r)
        os.close(self.w)


class _Buffer:
    """Pieces held in a large buffer of the process, filled by ``recv_into`` (where
    ``os.splice`` is missing)."""

    def __init__(self) -> None:
        self.view = memoryview(bytearray(BUFFER_BYTES))
        self.filled = self.sent = 0

    def fill(self, src: socket.socket) -> int | None:
        if len(self.view) - self.filled < PIECE_BYTES:
            return None
        n = src.recv_into(self.view[self.filled : self.filled + PIECE_BYTES])
        self.filled += n
        return n

    def drain(self, dst: socket.socket, n: int) -> None:
        dst.sendall(self.view[self.sent : self.sent + n])
        self.sent += n

    def grow(self) -> None:
        return None

    def reuse(self) -> None:
        self.filled = self.sent = 0

    def close(self) -> None:
        self.view.release()


class DelayLine:
    """One direction of a connection: bytes read from ``src`` are sent to ``dst``
    ``delay_s`` after they were read, held meanwhile in pipes (or buffers) of the proxy's
    pool. ``on_read`` / ``on_send`` are called (under the proxy's lock) before a piece is
    queued / sent; ``done`` is set once ``src``'s end (or an error) has been passed on."""

    def __init__(
        self,
        proxy: LatencyProxy,
        src: socket.socket,
        dst: socket.socket,
        delay_s: float,
        done: threading.Event,
        *,
        on_read: Callable[[], None] | None = None,
        on_send: Callable[[], None] | None = None,
    ) -> None:
        self.proxy, self.src, self.dst, self.delay_s, self.done = proxy, src, dst, delay_s, done
        self.on_read, self.on_send = on_read, on_send
        #: (due, holder, bytes) in the order read; 0 bytes: the end
        self.pieces: collections.deque[tuple[float, _Pipe | _Buffer | None, int]]
        self.pieces = collections.deque()
        self.held: list[_Pipe | _Buffer] = []  # holders taken from the pool, not given back
        self.ready = threading.Condition()
        self.threads = [_thread(self._read), _thread(self._send)]

    def _read(self) -> None:
        holder = self.proxy._take(self.held)
        while True:
            try:
                n = holder.fill(self.src)
            except OSError:
                n = 0
            if n is None:  # full: the next holder, a large one (a stream)
                holder = self.proxy._take(self.held)
                holder.grow()
                continue
            due = time.monotonic() + self.delay_s
            if n:
                self.proxy._count(self.on_read, pieces=1)
            with self.ready:
                self.pieces.append((due, holder, n))
                self.ready.notify()
            if not n:
                return

    def end(self) -> None:
        """Wake the sender to end (``src`` and ``dst`` shut); after both threads return,
        close the holders not given back."""
        with self.ready:
            self.pieces.append((0.0, None, 0))
            self.ready.notify()
        for t in self.threads:
            t.join()
        for holder in self.held:
            holder.close()

    def _send(self) -> None:
        last: _Pipe | _Buffer | None = None
        try:
            while True:
                with self.ready:
                    while not self.pieces:
                        self.ready.wait()
                    due = self.pieces[0][0]
                wait = due - time.monotonic()
                if wait > 0:
                    time.sleep(wait)
                with self.ready:  # every piece due by now, a holder's run in one
                    now = time.monotonic()
                    runs: list[tuple[_Pipe | _Buffer | None, int]] = []
                    while self.pieces and self.pieces[0][0] <= now:
                        _, holder, n = self.pieces.popleft()
                        if runs and runs[-1][0] is holder and n and runs[-1][1]:
                            runs[-1] = (holder, runs[-1][1] + n)
                        else:
                            runs.append((holder, n))
                for holder, n in runs:
                    if holder is None or not n:
                        with contextlib.suppress(OSError):
                            self.dst.shutdown(socket.SHUT_WR)
                        return
                    if last is not None and last is not holder:
                        self.proxy._give(self.held, last)  # all its pieces sent
                    last = holder
                    self.proxy._count(self.on_send, sends=1, moved=n)
                    holder.drain(self.dst, n)
        except OSError:
            return
        finally:
            self.done.set()


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
        #: pieces read (``recv_into`` calls that got bytes), ``sendall`` calls, bytes sent
        self.pieces = self.sends = self.bytes_moved = 0
        #: pieces held in pipes filled and drained by ``os.splice`` (Linux), else in buffers
        self.splice = hasattr(os, "splice")
        self._free: list[_Pipe | _Buffer] = []  # empty holders to use again
        self._lock = threading.Lock()
        self._socks: set[socket.socket] = set()
        self._stopping = False

    def reset_counts(self) -> None:
        with self._lock:
            self.max_waiting = self.waiting
            self.requests = self.connections = 0
            self.turns = []
            self.pieces = self.sends = self.bytes_moved = 0

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

    def _count(
        self, mark: Callable[[], None] | None, *, pieces: int = 0, sends: int = 0, moved: int = 0
    ) -> None:
        with self._lock:
            self.pieces += pieces
            self.sends += sends
            self.bytes_moved += moved
            if mark is not None:
                mark()

    def _take(self, held: list[_Pipe | _Buffer]) -> _Pipe | _Buffer:
        with self._lock:
            holder = self._free.pop() if self._free else None
        if holder is None:
            holder = _Pipe() if self.splice else _Buffer()
        held.append(holder)
        return holder

    def _give(self, held: list[_Pipe | _Buffer], holder: _Pipe | _Buffer) -> None:
        held.remove(holder)
        holder.reuse()
        with self._lock:
            kept = len(self._free) < FREE_HOLDERS
            if kept:
                self._free.append(holder)
        if not kept:
            holder.close()

    def _watch(self, *socks: socket.socket) -> bool:
        with self._lock:
            self._socks.update(socks)
            return not self._stopping

    def serve(self, client: socket.socket) -> None:
        """Forward one accepted connection until either side's end has been passed on."""
        with self._lock:
            self.connections += 1
        opened = time.monotonic()
        try:
            upstream = socket.create_connection(self.target)
            upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            client.close()
            return
        state: dict = {"waiting": False, "sent": opened}  # the first turn: from the opening
        try:
            if not self._watch(client, upstream):
                return
            time.sleep(self.rtt_s)  # the handshake's round trip
            done = threading.Event()
            half = self.rtt_s / 2
            lines = [
                DelayLine(
                    self, client, upstream, half, done, on_read=lambda: self._mark(state, True)
                ),
                DelayLine(
                    self, upstream, client, half, done, on_send=lambda: self._mark(state, False)
                ),
            ]
            done.wait()
            for s in (client, upstream):
                _shut(s)
            for line in lines:
                line.end()
        finally:
            with self._lock:
                self._socks.difference_update((client, upstream))
                if state["waiting"]:
                    self.waiting -= 1
            client.close()
            upstream.close()

    def _mark(self, state: dict, waiting: bool) -> None:
        """A request leaves the client (``waiting``) or its answer arrives; under the lock."""
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

    def stop(self) -> None:
        """End every connection (their threads return)."""
        with self._lock:
            self._stopping = True
            socks = list(self._socks)
        for s in socks:
            _shut(s)

    def close(self) -> None:
        """Close the empty pipes (or buffers) kept for use again."""
        with self._lock:
            free, self._free = self._free, []
        for holder in free:
            holder.close()


@contextlib.contextmanager
def latency_proxy(
    target_host: str, target_port: int, *, rtt_s: float, host: str = "127.0.0.1"
) -> Iterator[tuple[LatencyProxy, int]]:
    """Run a :class:`LatencyProxy` in background threads; yields it and its port."""
    proxy = LatencyProxy(target_host, target_port, rtt_s)
    listener = socket.create_server((host, 0), backlog=512)
    served: list[threading.Thread] = []

    def accept() -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed: the proxy stops
                return
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            served.append(_thread(proxy.serve, client))

    acceptor = _thread(accept)
    try:
        yield proxy, listener.getsockname()[1]
    finally:
        _shut(listener)
        listener.close()
        acceptor.join(timeout=10)
        proxy.stop()
        for t in served:
            t.join(timeout=10)
        proxy.close()
