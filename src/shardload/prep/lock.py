"""The lock of one output: a second writer of the same ``OUT`` is refused, naming the holder."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path

from shardload.errors import StoreError, StoreLockedError
from shardload.layout import LOCK_SUFFIX
from shardload.prep.disk import os_error
from shardload.util.locks import open_lock_file, still_at, try_flock


class OutputLock:
    """An exclusive ``flock`` on ``OUT.partial.lock``, with the holder written inside.

    The file is removed on release, while still locked; a process that opened the old file
    before that finds, once it holds the lock, that the path names another file (or none) and
    tries again, so two processes never both believe they hold the lock.
    """

    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.path = out.with_name(out.name + LOCK_SUFFIX)
        self._fd: int | None = None

    def acquire(self) -> None:
        for _ in range(100):
            try:
                fd = open_lock_file(self.path, mode=0o644)
            except OSError as exc:
                raise os_error(exc, f"cannot create the lock file {self.path}") from exc
            try:
                free = try_flock(fd)
            except OSError as exc:
                os.close(fd)
                raise StoreError(
                    f"cannot lock {self.path}: {exc} (the filesystem must support flock)"
                ) from exc
            if not free:
                holder = _read_holder(fd)
                os.close(fd)
                raise StoreLockedError(
                    f"another prepare is writing {self.out} ({holder}; lock file {self.path}); "
                    "wait for it to finish, or stop it and re-run"
                ) from None
            if not still_at(fd, self.path):  # released and removed by its holder: retry
                os.close(fd)
                continue
            info = {
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            }
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(info).encode(), 0)
            self._fd = fd
            return
        raise StoreError(f"cannot lock {self.path}: it keeps being replaced")  # pragma: no cover

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        os.close(self._fd)  # closing drops the flock
        self._fd = None


def _read_holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return f"pid {info['pid']} on host {info['host']}, started {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder not yet recorded"
