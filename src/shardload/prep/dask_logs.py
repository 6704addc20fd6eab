"""Records of dask.distributed's own logging that are not news to a shardload user."""

from __future__ import annotations

import logging
from concurrent.futures import InvalidStateError


class CancelledResultRace(logging.Filter):
    """Drops the traceback tornado logs when distributed's ``ClientExecutor`` hands a finished
    task's result to a concurrent future that was cancelled meanwhile (``InvalidStateError``
    raised in ``distributed.cfexecutor._cascade_future``). A Ctrl-C or a failed task makes
    :func:`run_windowed` cancel the tasks in flight; one that finishes in that instant is a
    result nobody waits for, not an error (it printed a 15-line traceback after ``prepare``'s
    one "interrupted" line)."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, InvalidStateError):
            return True
        tb = exc.__traceback__
        while tb is not None:
            if tb.tb_frame.f_code.co_name == "_cascade_future":
                return False
            tb = tb.tb_next
        return True
