"""The executor a jobqueue run hands to prepare: the cluster's, failing every future at once when
the run fails (a job died, the workers never came), and the log filter that keeps dask's own
submission errors quiet (the run reports them once, with the batch system's words)."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from shardload.prep.dask_logs import CancelledResultRace

log = logging.getLogger("shardload.jobqueue")


class QuietSubmissionErrors(CancelledResultRace):
    """Drops the traceback tornado logs for a failed submission (dask-jobqueue raises it in a
    callback nobody awaits): the run reports the same error once, as a ClusterError; and, as
    on every distributed run, a result set on a task's cancelled future."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, RuntimeError) and "Command exited with non-zero" in str(exc):
            return False
        return super().filter(record)


#: distributed's INFO chatter (scheduler start, client connections, worker retirement) drowns
#: the progress line; kept at WARNING during a run unless shardload logs at DEBUG (-vv)
CHATTY_LOGGERS = ("distributed.scheduler", "distributed.core", "distributed.http.proxy")


class FailingExecutor(Executor):
    """The client's executor, with futures a watchdog can fail (so the driver never waits on a
    task no worker will ever run)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.outstanding: set[Future[Any]] = set()
        self.lock = threading.Lock()
        self.failure: BaseException | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        outer: Future[Any] = Future()
        with self.lock:
            if self.failure is not None:
                outer.set_exception(self.failure)
                return outer
            self.outstanding.add(outer)
        inner = self.inner.submit(fn, *args, **kwargs)

        def done(f: Future[Any]) -> None:
            with self.lock:
                self.outstanding.discard(outer)
            if outer.done():
                return
            if f.cancelled():
                outer.cancel()
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        inner.add_done_callback(done)
        return outer

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            self.failure = exc
            pending = list(self.outstanding)
            self.outstanding.clear()
        for f in pending:
            if not f.done():
                with contextlib.suppress(Exception):
                    f.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)
