"""Signals during a jobqueue run: SIGTERM and Ctrl-C unwind (so the jobs are cancelled)."""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

from shardload.prep.jobqueue.jobs import (
    sigint_is_dask_jobqueues,
)


@contextlib.contextmanager
def signals_unwind() -> Iterator[None]:
    """While inside, SIGTERM raises ``SystemExit(143)`` in the main thread so that ``finally``
    blocks run (and cancel the jobs), and Ctrl-C raises ``KeyboardInterrupt`` (not the
    ``sys.exit()`` of status 0 that importing dask_jobqueue installs); the previous handlers
    are put back on exit. Outside the main thread (no handlers there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_int = signal.getsignal(signal.SIGINT)
    if sigint_is_dask_jobqueues():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise SystemExit(128 + signum)

    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)
