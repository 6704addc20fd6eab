"""One ``flock`` helper for every lock file a writer or a mover takes.

A lock file may be removed by its holder while it still holds the lock (the last user of a
staged copy, the writer of a store); a process that opened the old file before that finds,
once it holds the lock, that the path names another file (or none) and opens it again, so two
processes never both believe they hold the lock.

``move/squashfs_watch.py`` keeps its own copy of :func:`try_lock`: it runs as a script by path,
with the standard library only.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator


def open_lock_file(path: str | os.PathLike[str], *, mode: int = 0o600) -> int:
    """An fd on the lock file ``path``, created if missing (not locked yet)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, mode)


def try_flock(fd: int, *, shared: bool = False) -> bool:
    """Take ``flock`` on ``fd`` without waiting; False when another process holds it."""
    try:
        fcntl.flock(fd, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def still_at(fd: int, path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` still names the file open as ``fd`` (its holder may have removed it)."""
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def try_lock(
    path: str | os.PathLike[str], *, shared: bool = False, mode: int = 0o600
) -> int | None:
    """An fd holding ``flock`` on ``path``, or None when someone else holds it (or the file
    was removed meanwhile). Close the fd to release the lock."""
    try:
        fd = open_lock_file(path, mode=mode)
    except FileNotFoundError:
        return None
    try:
        if try_flock(fd, shared=shared) and still_at(fd, path):
            return fd
    except BaseException:
        os.close(fd)
        raise
    os.close(fd)
    return None


@contextlib.contextmanager
def locked(
    path: str | os.PathLike[str], *, poll_s: float | None = None, mode: int = 0o600
) -> Iterator[int]:
    """Hold an exclusive ``flock`` on ``path`` for the ``with`` block.

    ``poll_s``: wait in polls of this many seconds, so that signal handlers run between them;
    None waits in the kernel.
    """
    while True:
        fd = open_lock_file(path, mode=mode)
        try:
            if poll_s is None:
                fcntl.flock(fd, fcntl.LOCK_EX)
            else:
                while not try_flock(fd):
                    time.sleep(poll_s)
            same = still_at(fd, path)
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)  # the previous holder removed this lock file: take the new one
    try:
        yield fd
    finally:
        os.close(fd)
