"""A bounded local cache of whole remote files, safe to share between processes.

Store files are immutable once a store is complete, and the unit of reading is a whole file (an
npy chunk, a Zarr chunk or shard), so whole files are cached: a later range read of a cached
file is a local ``pread``. A file is downloaded into memory, written to a temporary name and
renamed into place, so a file present under its cache name is always complete (a process killed
mid-download leaves only a ``*.tmp-*`` file, removed by the next eviction). One download per
file at a time, across threads and processes (DataLoader workers, ranks), thanks to an ``flock``
on ``NAME.lock``.

The size bound: after each download the least recently used files (by mtime, refreshed on
every hit) are deleted until the folder holds at most ``cache_bytes``. Only regular files
directly inside the cache folder are ever deleted, never the source. Cache names are a hash of
the file's URL: a store re-prepared under the same URL needs a fresh cache folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from shardload.util.locks import locked

log = logging.getLogger("shardload.remote")

LOCK_SUFFIX = ".lock"
TMP_MARK = ".tmp-"


def cache_name(cache_dir: str | os.PathLike, url: str) -> str:
    """The cache file of ``url`` (a hash of it, inside ``cache_dir``)."""
    return os.path.join(cache_dir, hashlib.sha256(url.encode()).hexdigest()[:40])


def _touch(local: str) -> None:
    now_ns = time.time_ns()  # explicit: the kernel's own file clock here is coarse
    with contextlib.suppress(FileNotFoundError):
        os.utime(local, ns=(now_ns, now_ns))  # mtime marks recent use for the LRU


def open_cached(
    cache_dir: str | os.PathLike,
    url: str,
    download: Callable[[], bytes],
    *,
    cache_bytes: int | None = None,
) -> int:
    """A read-only file descriptor on the cached copy of ``url``, downloading it if needed.

    Parameters
    ----------
    cache_dir : path
        The cache folder (created if missing).
    url : str
        The file's full URL (its cache key).
    download : callable
        Returns the whole file's bytes (retries are the caller's).
    cache_bytes : int, optional
        Bound on the folder's size, enforced after a download.

    Returns
    -------
    int
        An open descriptor (the caller closes it); valid even if the file is evicted later.
    """
    local = cache_name(cache_dir, url)
    with contextlib.suppress(FileNotFoundError):
        fd = os.open(local, os.O_RDONLY)  # a present file is complete (atomic rename)
        _touch(local)
        return fd
    Path(cache_dir).mkdir(parents=True, exist_ok=True)
    with locked(local + LOCK_SUFFIX):
        try:
            fd = os.open(local, os.O_RDONLY)  # another process downloaded it meanwhile
        except FileNotFoundError:
            data = download()
            tmp = f"{local}{TMP_MARK}{os.getpid()}"
            with open(tmp, "wb") as f:
                f.write(data)
            os.replace(tmp, local)
            fd = os.open(local, os.O_RDONLY)
            log.debug("cached %s (%d bytes)", url, len(data))
            if cache_bytes is not None:
                evict_lru(cache_dir, cache_bytes)
        else:
            _touch(local)
    return fd


def read_range(fd: int, start: int | None, end: int | None) -> bytes:
    """Bytes ``[start:end]`` of an open file, Python slice rules (negative = from the end)."""
    size = os.fstat(fd).st_size
    a, b, _ = slice(start, end).indices(size)
    if b <= a:
        return b""
    parts, pos = [], a
    while pos < b:
        got = os.pread(fd, b - pos, pos)
        if not got:
            break
        parts.append(got)
        pos += len(got)
    return b"".join(parts)


def evict_lru(cache_dir: str | os.PathLike, cache_bytes: int) -> int:
    """Delete the least recently used files of ``cache_dir`` until it holds <= ``cache_bytes``.

    Only regular files directly inside ``cache_dir`` are considered (never a symlink, never a
    lock file); temporary files of dead downloads older than a minute are removed first.
    Returns the number of bytes freed.
    """
    entries = []
    freed = 0
    now = time.time()
    with os.scandir(str(cache_dir)) as it:
        for e in it:
            if e.name.endswith(LOCK_SUFFIX) or not e.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = e.stat(follow_symlinks=False)
                if TMP_MARK in e.name:
                    if now - st.st_mtime > 60:
                        os.remove(e.path)
                        freed += st.st_size
                    continue
                entries.append((st.st_mtime_ns, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    for _, size, file in sorted(entries):
        if total <= cache_bytes:
            break
        with contextlib.suppress(FileNotFoundError):
            os.remove(file)  # its .lock stays: removing it could let two downloads overlap
            freed += size
        total -= size
    if freed:
        log.debug("cache %s: evicted %d bytes", cache_dir, freed)
    return freed
