"""The files of a node cache folder: listing them, removing entries, the dead fills' leftovers.

Used by :mod:`shardload.move.cache`; :func:`evict_lru` is the bound without a plan,
:func:`read_range` a range of a copy.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

from shardload.util.locks import try_lock
from shardload.util.procs import alive, my_start_time

log = logging.getLogger("shardload.remote")

LOCK_SUFFIX = ".lock"
SUM_SUFFIX = ".sum"
TMP_MARK = ".tmp-"


def remove_entry(cache_dir: str, name: str) -> int:
    """Remove a cached file and its record, unless a process is filling it (its ``.lock`` is
    held: removing its new record before its copy is renamed in would make the copy untrusted);
    the bytes freed. The .lock stays: removing it could let two fills overlap."""
    path = os.path.join(cache_dir, name)
    if not os.path.exists(path + LOCK_SUFFIX):  # never filled here (every fill locks first)
        return _remove(path)
    fd = try_lock(path + LOCK_SUFFIX)
    if fd is None:
        return 0
    try:
        return _remove(path)
    finally:
        os.close(fd)


def write_record(local: str, record: bytes) -> None:
    """Write the record ``NAME.sum`` of the copy ``local`` (atomically: renamed into place)."""
    tmp = f"{local}{SUM_SUFFIX}{TMP_MARK}{os.getpid()}-{my_start_time() or 0}"
    with open(tmp, "wb") as f:
        f.write(record)
    os.replace(tmp, local + SUM_SUFFIX)


def _remove(path: str) -> int:
    size = 0
    for p in (path, path + SUM_SUFFIX):
        with contextlib.suppress(FileNotFoundError):
            size += os.stat(p).st_size
            os.remove(p)
    return size


def _dead_tmp(name: str, mtime: float, now: float) -> bool:
    """A temporary file whose writer is gone (``NAME.tmp-PID-START``; older names by age)."""
    tail = name.rsplit(TMP_MARK, 1)[1].split("-")
    try:
        pid, start = int(tail[0]), int(tail[1]) if len(tail) > 1 else None
    except ValueError:
        return now - mtime > 60
    if start is None:
        return now - mtime > 60
    return not alive(pid, start or None)


def scan(cache_dir: str | os.PathLike, removed: list[int] | None = None) -> dict[str, Any]:
    """The cached files of ``cache_dir``: name -> (last use, bytes with its record); removes the temporary files
    of dead fills on the way (their sizes appended to ``removed``). Only regular files directly
    inside are considered."""
    out: dict[str, tuple[float, int]] = {}
    now = time.time()
    with os.scandir(str(cache_dir)) as it:
        for e in it:
            if e.name.endswith(LOCK_SUFFIX) or not e.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                st = e.stat(follow_symlinks=False)
                if TMP_MARK in e.name:
                    if _dead_tmp(e.name, st.st_mtime, now):
                        os.remove(e.path)
                        if removed is not None:
                            removed.append(st.st_size)
                    continue
                if e.name.endswith(SUM_SUFFIX):
                    continue
                used, size = st.st_mtime, st.st_size
                with contextlib.suppress(FileNotFoundError):
                    rec = os.stat(e.path + SUM_SUFFIX)
                    used, size = max(used, rec.st_mtime), size + rec.st_size
                out[e.name] = (used, size)  # the copy and its record: the bound counts both
    return out


def evict_lru(cache_dir: str | os.PathLike, cache_bytes: int) -> int:
    """Delete the least recently used files of ``cache_dir`` until it holds <= ``cache_bytes``
    (temporary files of dead fills first). Returns the number of bytes freed."""
    removed: list[int] = []
    entries = scan(cache_dir, removed)
    freed = sum(removed)
    total = sum(size for _, size in entries.values())
    for name, (_, size) in sorted(entries.items(), key=lambda kv: kv[1][0]):
        if total <= cache_bytes:
            break
        got = remove_entry(os.fspath(cache_dir), name)
        freed += got
        total -= size if got else 0
    if freed:
        log.debug("cache %s: evicted %d bytes", cache_dir, freed)
    return freed


def holds_all(cache_dir: str, keys: set[str]) -> bool:
    """Whether every one of ``keys`` has a copy and a record in ``cache_dir`` now (one listing;
    whether each is trusted is decided when it is opened)."""
    try:
        names = set(os.listdir(cache_dir))
    except FileNotFoundError:
        return not keys
    return all(k in names and k + SUM_SUFFIX in names for k in keys)


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
