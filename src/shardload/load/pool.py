"""``ReadPool``: the threads of one loader iterator, in named lanes, with one shutdown path.

A lane is a FIFO queue of tasks served by at most its limit of threads (started as tasks come):
``read`` for chunk reads, ``take`` for the gathers out of group buffers, ``plan`` for planning
a group's scatter reads. Lanes keep one kind of work from queueing behind another (a gather of
the batch being yielded never waits behind the reads of groups ahead), as separate pools did,
while one object owns every thread: :meth:`shutdown` cancels what has not started and waits
for what has, so no thread writes into a batch after the caller reclaims its memory.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from shardload.move.retries import stop_on


class ReadPool:
    """Threads in lanes: ``ReadPool({"read": 4, "take": 4})``; ``submit(lane, fn, *args)``.

    ``detach``: lanes whose running tasks :meth:`shutdown` does not wait for (they write only
    memory nobody else holds, e.g. group buffers: a slow remote read need not delay a close).
    """

    def __init__(self, lanes: dict[str, int], *, detach: tuple[str, ...] = ()) -> None:
        self._detach = frozenset(detach)
        self._limit = {k: max(1, int(v)) for k, v in lanes.items()}
        self._lock = threading.Lock()
        self._wake = {k: threading.Condition(self._lock) for k in lanes}
        self._queue: dict[str, deque[tuple[Future[Any], Callable[..., Any], tuple]]] = {
            k: deque() for k in lanes
        }
        self._idle = dict.fromkeys(lanes, 0)
        self._started = dict.fromkeys(lanes, 0)
        self._threads: list[threading.Thread] = []
        self._closed = False
        self._stop = threading.Event()  # set at shutdown: retries of running reads give up

    def submit(self, lane: str, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        """Run ``fn(*args)`` in a thread of ``lane``; its result or error in the future."""
        fut: Future[Any] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot submit to a ReadPool after shutdown")
            self._queue[lane].append((fut, fn, args))
            if self._idle[lane] == 0 and self._started[lane] < self._limit[lane]:
                t = threading.Thread(
                    target=self._work,
                    args=(lane,),
                    daemon=True,
                    name=f"shardload-{lane}_{self._started[lane]}",
                )
                self._started[lane] += 1
                if lane not in self._detach:
                    self._threads.append(t)
                t.start()
            else:
                self._wake[lane].notify()
        return fut

    def _work(self, lane: str) -> None:
        queue, wake = self._queue[lane], self._wake[lane]
        while True:
            with self._lock:
                while not queue and not self._closed:
                    self._idle[lane] += 1
                    wake.wait()
                    self._idle[lane] -= 1
                if not queue:  # shut down
                    return
                fut, fn, args = queue.popleft()
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                with stop_on(self._stop):
                    result = fn(*args)
            except BaseException as exc:  # handed to the consumer, as an executor does
                fut.set_exception(exc)
            else:
                fut.set_result(result)
            del fut, fn, args  # no reference to a batch past its task

    def shutdown(self) -> None:
        """Cancel the tasks not started, wait for the running ones (but those of detached
        lanes), stop every thread."""
        if sys.is_finalizing():  # an iterator left open at exit, closed by the interpreter's
            return  # teardown: its daemon threads are frozen (one may hold the lock) and never end
        self._stop.set()
        with self._lock:
            self._closed = True
            for queue in self._queue.values():
                while queue:
                    queue.popleft()[0].cancel()
            for wake in self._wake.values():
                wake.notify_all()
            threads, self._threads = self._threads, []
        me = threading.current_thread()
        for t in threads:
            if t is not me:
                t.join()
