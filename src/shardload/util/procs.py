"""Is the process that wrote a record still alive? A PID alone cannot say: PIDs are reused, so
a record also keeps the process's start time and both must match.

The start time is field 22 of ``/proc/PID/stat`` (clock ticks since boot), or psutil's
``create_time`` where there is no ``/proc`` (and psutil is installed). Where neither exists
only the PID is checked. :class:`ForkSafeLock`: a thread lock a forked child makes anew.
"""

from __future__ import annotations

import os
import threading

#: bits of a packed ``(start, pid)`` id (:func:`pack`) that hold the pid (pid_max <= 2**22)
_PID_BITS = 23


def start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (an opaque integer), or None when it cannot be read.

    Raises ProcessLookupError when the process does not exist.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            raise ProcessLookupError(pid) from None
        return _psutil_start(pid)
    except OSError:
        return None
    # the command name (field 2) is in parentheses and may hold spaces or ')': split after the last
    fields = data[data.rindex(b")") + 2 :].split()
    return int(fields[19])  # field 22: starttime, counted from field 3 (state) = index 0


def _psutil_start(pid: int) -> int | None:
    try:
        import psutil
    except ImportError:
        return None
    try:
        return int(psutil.Process(pid).create_time() * 100)
    except psutil.NoSuchProcess:
        raise ProcessLookupError(pid) from None
    except psutil.Error:
        return None


def my_pid() -> int:
    """This process's pid without a system call per ask (``os.getpid``): kept, and renewed in
    a child of ``os.fork`` (DataLoader workers ask once per batch)."""
    return _PID[0]


_PID = [os.getpid()]
os.register_at_fork(after_in_child=lambda: _PID.__setitem__(0, os.getpid()))


def my_start_time() -> int | None:
    """:func:`start_time` of this process."""
    return start_time(os.getpid())


def alive(pid: int, start: int | None) -> bool:
    """True when process ``pid`` exists and, if ``start`` is known, started at ``start``."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by someone else
    except OSError:
        return True  # cannot tell: keep the record
    if start is None:
        return True
    try:
        now = start_time(pid)
    except ProcessLookupError:
        return False
    return now is None or now == start


def pack(pid: int, start: int | None) -> int:
    """``pid`` and the low 40 bits of its start time in one positive int64."""
    return ((start or 0) & ((1 << 40) - 1)) << _PID_BITS | pid


def alive_packed(value: int) -> bool:
    """:func:`alive` for a value of :func:`pack`."""
    pid = value & ((1 << _PID_BITS) - 1)
    start = value >> _PID_BITS
    if not start:
        return alive(pid, None)
    try:
        now = start_time(pid)
    except ProcessLookupError:
        return False
    if now is None:
        return alive(pid, None)
    return (now & ((1 << 40) - 1)) == start and alive(pid, None)


class ForkSafeLock:
    """A ``threading.Lock`` that a forked child, or an unpickled copy, gets anew: never one a
    parent's thread held at the fork. ``with lock: ...``."""

    def __init__(self) -> None:
        self._pid, self._lock = os.getpid(), threading.Lock()

    def __enter__(self) -> bool:
        pid = os.getpid()
        if self._pid != pid:
            with _SWAP[0]:
                if self._pid != pid:
                    self._lock, self._pid = threading.Lock(), pid
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (ForkSafeLock, ())


_SWAP = [threading.Lock()]  # guards a ForkSafeLock's first swap in a child (its own, too)
os.register_at_fork(after_in_child=lambda: _SWAP.__setitem__(0, threading.Lock()))
