"""The receive buffers of a process's GETs by URL (:mod:`.http_get`), used again once free
(issues 25 and 28).

Each shard by URL was read into a new buffer (``np.empty`` of its size): for a shard of tens of
MiB, fresh anonymous pages, each zeroed by the kernel at its first write, inside ``recvfrom``.
That zeroing was 22% of the client's CPU in a first epoch of the default store by URL
(docs/benchmarks.md). Here an answer of at least ``MIN_POOL_BYTES`` is read into a buffer this
process used before, when one of its size class is free: its pages are already there. The pool is
the process's, not a reader's: an epoch of the default store fetches each shard once, and
``iter_batches(url)`` opens the store anew each epoch, so only the next reader finds them.

A buffer is free when nothing can read it any more: the view handed out is a numpy view of the
pooled array, and a ``weakref.finalize`` on that view gives the array back when the view dies,
which is when the last memoryview, slice or ``np.frombuffer`` taken from it is gone, in any
thread (each holds the view alive through the buffer protocol). Whoever still holds a chunk's
bytes (a call decoding, the checked shard left for the calls that wait for it, a GET fetched
ahead) holds the buffer; chunks kept for later groups are copies (:mod:`..formats.zarr.kept`).

Memory: at most ``FREE_BUFFERS`` free buffers are kept (``SHARDLOAD_URL_FREE_BUFFERS``; 0 keeps
none, as before), each dropped once it has been free for ``FREE_IDLE_S`` (a timer thread, armed
while any is free: the memory goes back between reads far apart, as before); a take that finds
none of its size class drops a free one before allocating, so the buffers alive are never more
than the most in use at once. Sizes are rounded up to a quarter of their power of two (pages never written are never
resident). A forked child never uses its parent's.
"""

from __future__ import annotations

import os
import threading
import time
import weakref

import numpy as np

__all__ = [
    "FREE_BUFFERS",
    "MIN_POOL_BYTES",
    "BufferPool",
    "max_free_buffers",
    "shared_pool",
    "size_class",
]

#: Answers smaller than this are read into a buffer of their own (the heap reuses small ones).
MIN_POOL_BYTES = 1 << 20
#: Free buffers kept at most per process (about the shards a reader holds at once: two checked,
#: two fetched ahead), unless ``SHARDLOAD_URL_FREE_BUFFERS`` says.
FREE_BUFFERS = 4
FREE_ENV = "SHARDLOAD_URL_FREE_BUFFERS"
#: A free buffer not taken again within this many seconds is dropped.
FREE_IDLE_S = 5.0


def size_class(n: int) -> int:
    """The capacity of a pooled buffer for ``n`` bytes: ``n`` rounded up to a quarter of its
    power of two (at most 25% more, never resident unless written).

    >>> [size_class(n) for n in (1 << 20, (1 << 20) + 1, 5 << 20, 48_000_000)]
    [1048576, 1310720, 5242880, 50331648]
    """
    step = max(1, (1 << (max(n, 1).bit_length() - 1)) // 4)
    return -(-n // step) * step


def max_free_buffers() -> int:
    """The bound on free buffers: ``SHARDLOAD_URL_FREE_BUFFERS`` (0: none kept) or 4."""
    raw = os.environ.get(FREE_ENV, "").strip()
    if not raw:
        return FREE_BUFFERS
    from shardload.errors import ConfigError

    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{FREE_ENV}={raw!r} must be a whole number of buffers >= 0")
    return value


class BufferPool:
    """A process's receive buffers for GETs by URL (see the module docstring)."""

    def __init__(self, *, free_buffers: int | None = None, min_bytes: int | None = None):
        self.free_buffers = max_free_buffers() if free_buffers is None else free_buffers
        self.min_bytes = MIN_POOL_BYTES if min_bytes is None else min_bytes
        self.idle_s = FREE_IDLE_S
        self._free: list[np.ndarray] = []
        self._since: list[float] = []  # when each free buffer was given back
        self._timer: threading.Timer | None = None
        # re-entrant: a view may die (its finalizer gives a buffer back) in a thread inside take
        self._lock = threading.RLock()
        self._pid, self._closed = os.getpid(), False
        self.allocated = 0  # pooled buffers allocated (tests and benchmarks count them)
        self.reused = 0  # takes served by a free buffer

    def take(self, n: int) -> memoryview:
        """A writable memoryview of ``n`` bytes (contents undefined), pooled when ``n`` is at
        least ``min_bytes``: given back once no view taken from it remains."""
        if n < self.min_bytes:
            return np.empty(n, np.uint8).data
        cap = size_class(n)
        base = None
        with self._lock:
            if self._pid != os.getpid():  # a forked child: none of its parent's (nor timer)
                self._free, self._since, self._timer = [], [], None
                self._pid = os.getpid()
            for i, b in enumerate(self._free):
                if len(b) == cap:
                    base = self._free.pop(i)
                    self._since.pop(i)
                    break
            else:
                if self._free:  # none of this class: one fewer free, one more in use
                    self._free.pop(0)
                    self._since.pop(0)
            if base is None:
                self.allocated += 1
            else:
                self.reused += 1
        if base is None:
            base = np.empty(cap, np.uint8)
        view = base[:n]
        weakref.finalize(view, self._give, base, os.getpid())
        return view.data

    def _give(self, base: np.ndarray, pid: int) -> None:
        with self._lock:
            mine = pid == self._pid == os.getpid() and not self._closed
            if mine and len(self._free) < self.free_buffers:
                self._free.append(base)
                self._since.append(time.monotonic())
                self._arm(self.idle_s)

    def _arm(self, delay_s: float) -> None:
        """Start the timer that drops buffers free for ``idle_s`` (none pending; lock held)."""
        if self._timer is not None:
            return
        timer = threading.Timer(delay_s, self._drop_idle)
        timer.daemon, timer.name = True, "shardload-free-buffers"
        try:
            timer.start()
        except RuntimeError:  # interpreter shutting down: nothing to give back to
            return
        self._timer = timer

    def _drop_idle(self) -> None:
        with self._lock:
            self._timer = None
            if self._pid != os.getpid():
                return
            now = time.monotonic()
            keep = [i for i, t in enumerate(self._since) if now - t < self.idle_s]
            self._free = [self._free[i] for i in keep]
            self._since = [self._since[i] for i in keep]
            if self._since:
                self._arm(self._since[0] + self.idle_s - now)

    @property
    def free(self) -> int:
        """Free buffers kept now."""
        return len(self._free)

    def close(self) -> None:
        """Drop the free buffers; those in use are dropped when given back."""
        with self._lock:
            self._free, self._since, self._closed = [], [], True


_SHARED: list[BufferPool] = []
_MAKING = threading.Lock()


def shared_pool() -> BufferPool:
    """This process's pool (a forked child makes its own on first use)."""
    with _MAKING:
        if not _SHARED or _SHARED[0]._pid != os.getpid():
            _SHARED[:] = [BufferPool()]
        return _SHARED[0]
