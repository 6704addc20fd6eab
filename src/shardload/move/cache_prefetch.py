"""What the node cache knows of the loader's plan: when each file is read, and what comes next.

The loader hands the cache (:meth:`RemoteFileSystem.plan_cache`) the times at which the ranks of
this node read each file, this epoch and the next (``plan/cache_plan.py``), the order in which
*this* process reads its files, and the store's digests. :class:`CachePlan` keeps the process's
clock (the step of the file it last asked for, so no call from the reading loop is needed), answers
"when is this file read next" for eviction, and fetches the process's next files ahead, at most
``ahead`` files beyond the one being read, in one background thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from shardload.move.cache import NotKept
from shardload.plan.cache_plan import next_use_after, sorted_steps

log = logging.getLogger("shardload.remote")

#: Files a process fetches ahead of the one it reads (a bound on the cache's read-ahead).
AHEAD_FILES = 16


class CachePlan:
    """The plan as the cache sees it (cache keys, not chunks).

    Parameters
    ----------
    times : mapping
        Cache key -> sorted steps at which the node's processes read that file.
    mine : sequence of (step, key, path)
        This process's reads, in order.
    fetch : callable
        Fetches ``path`` into the cache (the remote filesystem's cached open), for read-ahead.
    ahead : int
        Files fetched ahead of the one being read (0: none).
    lag_steps : int
        How far behind the clock a read still counts as that read (the loop reads groups ahead).
    """

    def __init__(
        self,
        times: Mapping[str, np.ndarray],
        mine: Sequence[tuple[int, str, str]],
        fetch: Callable[[str], object] | None = None,
        *,
        ahead: int = AHEAD_FILES,
        lag_steps: int = 0,
    ) -> None:
        self.times = dict(times)
        self.mine = list(mine)
        steps: dict[str, list[int]] = {}
        for t, key, _ in self.mine:
            steps.setdefault(key, []).append(t)
        self._mine_at = {k: sorted_steps(v) for k, v in steps.items()}
        self._mine_t = np.asarray([t for t, _, _ in self.mine], dtype=np.int64)
        self.lag = max(0, int(lag_steps))
        self.now = 0  # step of the read last asked for
        self.pos = 0  # index into ``mine``: the first read at or after ``now``
        self.fetch, self.ahead = fetch, max(0, int(ahead))
        self._queued = 0  # entries of ``mine`` handed to the read-ahead
        self._todo: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self.fetched = 0
        self._lock = threading.Lock()
        #: whether anything reads the clock (evictions under a bound, the read-ahead)
        self.clocked = True

    def files(self) -> list[str]:
        """The keys of this process's reads."""
        return list(self._mine_at)

    def knows(self, key: str) -> bool:
        return key in self.times

    def next_use(self, key: str, *, strict: bool = False) -> int:
        """The first step at (after, with ``strict``) the clock at which ``key`` is read."""
        return next_use_after(self.times.get(key), self.now, strict=strict)

    def seen(self, key: str) -> None:
        """This process asks for ``key``: move the clock to its read, start what comes next."""
        at = self._mine_at.get(key)
        if at is None or not self.clocked:
            return
        with self._lock:  # reader threads of the loop open files at once
            self._advance(at)

    def _advance(self, at: np.ndarray) -> None:
        # the loop reads whole groups, a few ahead, and opens their files in its own order: a
        # read of a step up to ``lag`` behind the clock is that read, not the file's next one
        i = int(np.searchsorted(at, self.now - self.lag))
        if i == len(at) or at[i] <= self.now:
            return
        self.now = int(at[i])
        self.pos = int(np.searchsorted(self._mine_t, self.now))
        self._read_ahead()

    def _read_ahead(self) -> None:
        if self.fetch is None or not self.ahead:
            return
        stop = min(len(self.mine), self.pos + self.ahead)
        start = max(self._queued, self.pos)
        if start >= stop:
            return
        for _, _, path in self.mine[start:stop]:
            self._todo.put(path)
        self._queued = stop
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="shardload-cache-ahead", daemon=True
            )
            self._thread.start()

    def _run(self) -> None:
        fetch = self.fetch
        assert fetch is not None
        while (path := self._todo.get()) is not None:
            try:
                if fetch(path) is not False:
                    self.fetched += 1
            except NotKept:
                continue
            except Exception as exc:  # the reading loop's own read reports it, naming the chunk
                log.debug("cache read-ahead of %s failed: %s", path, exc)

    def close(self) -> None:
        """Stop the read-ahead (what is being fetched completes)."""
        self._todo.put(None)
        if self._thread is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.join(timeout=60)
