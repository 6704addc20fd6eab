"""What a node cache copy is trusted by: its stamp, its record, and this process's memo.

A copy's *stamp* is what must not change for bytes once checked to be trusted unhashed: its
size, inode, mtime, ctime (any write, truncation, rename or ``utime`` sets it, and nothing in
user space sets it back) and the boot that wrote it (copies are not fsynced: after a crash each
is hashed once again). The filler writes the stamp, taken after the copy's rename, into the
copy's record ``NAME.sum`` with the digest of the bytes it wrote; a process that finds a copy
whose open descriptor has that stamp takes the record's digest as the copy's.

The *memo* (:data:`MEMO`) keeps, for this process, the digest of every copy it filled, found
vouched by its record, or hashed, under the copy's path and stamp (plus its device): a new
handle on the same cache in the same process (each epoch of ``iter_batches(url, ...)``, a store
opened again) compares one ``fstat`` of each copy it opens with the memo instead of reading the
copy's record again. A copy changed since has another stamp, so the memo no longer answers for
it: its record (which no longer matches either) and then its bytes decide, as in a new process.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from typing import Any

import xxhash

from shardload.move.cache_files import SUM_SUFFIX

#: Memo entries kept before the memo starts afresh (a bounded cache's copies come and go).
MEMO_ENTRIES = 1 << 16


def stamp(st: os.stat_result) -> list[Any]:
    """The stamp of a copy as its record stores it (JSON: a list)."""
    return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, boot_id()]


@functools.cache
def boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:  # no such file: every process hashes each copy once
        return f"pid-{os.getpid()}"


def read_record(local: str) -> dict[str, Any] | None:
    """The record of the copy ``local`` (None when missing or unreadable)."""
    try:
        with open(local + SUM_SUFFIX, "rb") as f:
            rec = json.loads(f.read())
        return rec if isinstance(rec, dict) else None
    except (OSError, ValueError):
        return None


def digest_fd(fd: int) -> int:
    """XXH3-64 of the whole open file ``fd``, read in 4 MiB pieces."""
    h = xxhash.xxh3_64()
    pos = 0
    while True:
        got = os.pread(fd, 1 << 22, pos)
        if not got:
            return int(h.intdigest())
        h.update(got)
        pos += len(got)


class TrustMemo:
    """Digests of copies this process trusts, by path and stamp (the module docstring)."""

    def __init__(self) -> None:
        self._seen: dict[tuple[Any, ...], int] = {}
        self._lock = threading.Lock()

    @staticmethod
    def _key(local: str, st: os.stat_result) -> tuple[Any, ...]:
        # the boot cannot change within a process; the device tells two folders' inodes apart
        return (local, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def get(self, local: str, st: os.stat_result) -> int | None:
        """The digest of the bytes of ``local`` if it was trusted with the stat ``st``."""
        return self._seen.get(self._key(local, st))

    def put(self, local: str, st: os.stat_result, digest: int) -> None:
        with self._lock:
            if len(self._seen) >= MEMO_ENTRIES:
                self._seen.clear()
            self._seen[self._key(local, st)] = digest

    def clear(self) -> None:
        with self._lock:
            self._seen.clear()


#: This process's memo, shared by every handle on every cache folder.
MEMO = TrustMemo()
