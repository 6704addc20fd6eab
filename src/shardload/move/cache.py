"""The node cache: one checked copy per node of a store's files, shared by every process.

The unit is a *stored file* (an npy chunk file, a Zarr chunk or shard, a metadata file): it is
what a store's checksums cover (``formats/checksums.py``), so a copy can be checked whole against
them before it is trusted, and store files never change once a store is complete. A later range
read of a cached file is a local ``pread``.

- **One copy per node.** Every process using the folder (ranks, DataLoader workers) takes an
  ``flock`` on ``NAME.lock`` to fill ``NAME``; others wait and then find it. The kernel drops
  the lock of a process that dies, so a killed filler blocks no one.
- **Kill-safe.** A download is written to ``NAME.tmp-PID-START``, checked, and renamed into
  place; its record ``NAME.sum`` (size, XXH3-64, inode, mtime, ctime and boot id of the copy)
  is written the same way just after. A name present without a matching record is never served.
  The temporary files of dead processes (PID and start time, ``util/procs.py``) are removed.
  Nothing is fsynced (a killed process loses nothing the page cache holds; fsyncing each copy
  cost the first epoch 0.6x of direct reads on a shared disk): a copy written before the
  machine's last boot is hashed again before it is trusted.
- **Checked before trusted.** A download is compared with the store's digest when the plan
  gave one (``NodeCache.digests``), and refused (``ChunkReadError`` naming the URL) when they
  differ. A copy whose size, inode, mtime or ctime differ from its record is hashed again: if it no
  longer matches, it is dropped and fetched again, never served. A reader may take the record's
  digest as the copy's (:meth:`NodeCache.vouched_digest`: no hashing in each process). What a
  process trusted it remembers by the copy's stat (``cache_trust.MEMO``): a new handle in the
  same process reads no record of a copy unchanged since.
- **Bounded.** Above ``cache_bytes`` the entry whose next use is farthest in the loader's plan
  (Belady, :mod:`shardload.plan.cache_plan`) is evicted; without a plan, the least recently
  used (the record's mtime, refreshed on every hit). With a plan, a file read again later than
  everything held is served without being kept. Only files inside the folder are deleted.

Cache names are a hash of the file's URL: give a store re-prepared under the same URL a fresh
folder (records catch the change only where the store has checksums)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import xxhash

from shardload.errors import ChunkReadError
from shardload.move.cache_files import (
    LOCK_SUFFIX,
    SUM_SUFFIX,
    TMP_MARK,
    holds_all,
    remove_entry,
    scan,
    write_record,
)
from shardload.move.cache_files import read_range as read_range  # the remote fs reads copies
from shardload.move.cache_trust import MEMO
from shardload.move.cache_trust import digest_fd as _digest_fd
from shardload.move.cache_trust import read_record as _read_record
from shardload.move.cache_trust import stamp as _stamp
from shardload.util.locks import locked
from shardload.util.procs import my_start_time

log = logging.getLogger("shardload.remote")

EVICT_LOCK = ".evict.lock"
#: Copies served without being kept that a process holds open for its next reads of them.
HELD_FILES = 8


def cache_name(cache_dir: str | os.PathLike, url: str) -> str:
    """The cache file of ``url`` (a hash of it, inside ``cache_dir``)."""
    return os.path.join(cache_dir, key_of(url))


@functools.lru_cache(maxsize=1 << 16)  # asked up to 3 times per file open
def key_of(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()[:40]


class NodeCache:
    """The cache folder ``cache_dir`` as seen by this process (see the module docstring).

    ``plan`` (:class:`~shardload.move.cache_prefetch.CachePlan`, or None) says when each file
    is read next, ``digests`` what the store recorded for it; ``stats`` counts this process's
    hits, fills (``prefetched``: those of the read-ahead), refetches of damaged copies, files
    served without being kept (``bypassed``) and evictions.
    """

    def __init__(self, cache_dir: str | os.PathLike, cache_bytes: int | None = None) -> None:
        self.dir = os.fspath(cache_dir)
        self.cache_bytes = cache_bytes
        self.plan: Any = None
        self.digests: dict[str, int] = {}  # cache key -> the store's XXH3-64 of the file
        self.stats = dict(
            hits=0, fills=0, refetched=0, bypassed=0, evicted=0, prefetched=0, skipped=0
        )
        self._lock = threading.Lock()
        self._swept = False
        # copies served without being kept, held open: a reader opens a file more than once
        self._held: OrderedDict[str, int] = OrderedDict()

    # -- opening -------------------------------------------------------------------------------
    def open(
        self, url: str, download: Callable[[], bytes], *, what: str = "", ahead: bool = False
    ) -> int:
        """A read-only descriptor on a checked copy of ``url`` (fetched with ``download`` when
        missing or damaged); valid even if the copy is evicted later. The caller closes it.
        ``ahead``: a read-ahead of the plan (it does not move the plan's clock); it raises
        :class:`NotKept`, fetching nothing, when the cache would drop the file before its read."""
        key = key_of(url)
        local = os.path.join(self.dir, key)
        if self.plan is not None and not ahead:
            self.plan.seen(key)
        fd = self._open_trusted(local, key, drop=False)
        if fd is None:
            fd = self._reopen_held(key)
        if fd is not None:
            self._count("hits")
            return fd
        if not self._swept:  # once per process: the temporary files of dead fills go
            Path(self.dir).mkdir(parents=True, exist_ok=True)
            scan(self.dir)
            self._swept = True
        with locked(local + LOCK_SUFFIX):
            fd = self._open_trusted(local, key, drop=True)  # filled by another meanwhile?
            if fd is not None:
                self._count("hits")
                return fd
            if ahead and not self._would_keep(key):
                self._count("skipped")  # fetched now, it would be dropped before its read
                raise NotKept(url)
            fd = self._fill(url, key, local, download(), what)
            if ahead:
                self._count("prefetched")
            return fd

    def replan(self, plan: Any, digests: dict[str, int]) -> bool:
        """Use ``plan`` (a ``CachePlan``) from now on, the last one's read-ahead stopped; note
        the store's ``digests`` (by key). Whether every file of this process's reads is here
        already (a warm epoch: then, unbounded, nothing evicts them, nothing is read ahead)."""
        if self.plan is not None:
            self.plan.close()
        self.digests.update(digests)
        warm = holds_all(self.dir, set(plan.files()))
        if warm and self.cache_bytes is None:  # nothing to fetch, nor to evict: no clock
            plan.fetch, plan.clocked = None, False
        self.plan = plan
        return warm

    def vouched_digest(self, fd: int, url: str) -> int | None:
        """The XXH3-64 recorded for the very bytes open at ``fd`` (same stamp), else None: a
        reader compares it with the store's checksum instead of hashing (docs/design.md)."""
        st, local = os.fstat(fd), cache_name(self.dir, url)
        got = MEMO.get(local, st)  # trusted or filled in this process
        if got is None:
            rec = _read_record(local)
            got = rec.get("xxh3") if rec is not None and rec.get("stamp") == _stamp(st) else None
        return got if isinstance(got, int) else None

    def _open_trusted(self, local: str, key: str, *, drop: bool) -> int | None:
        """A descriptor on the copy if it is trusted; else None, and with ``drop`` (the caller
        holds the file's lock: no fill or eviction of it runs) the copy is deleted."""
        try:
            fd = os.open(local, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            if self._trusts(fd, local, key):
                if self.plan is None:  # recency, for LRU without a plan
                    now_ns = time.time_ns()  # explicit: the kernel's file clock is coarse
                    with contextlib.suppress(OSError):
                        os.utime(local + SUM_SUFFIX, ns=(now_ns, now_ns))
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)
        if not drop:  # maybe being evicted or replaced right now: decided under the lock
            return None
        log.warning(
            "cache %s: %s does not match its record; dropped, fetched again", self.dir, local
        )
        self._count("refetched")
        with contextlib.suppress(FileNotFoundError):
            os.remove(local)
        return None

    def _trusts(self, fd: int, local: str, key: str) -> bool:
        """Whether the copy open at ``fd`` holds the bytes its record gives the digest of, and
        that digest is the store's (when known): trusted in this process under the same stamp
        (``cache_trust.MEMO``: no record read), else vouched for by its record, else hashed."""
        st = os.fstat(fd)
        known = self.digests.get(key)
        got = MEMO.get(local, st)
        if got is not None and (known is None or got == known):
            return True
        rec = _read_record(local)
        if rec is None:
            return False
        want = rec.get("xxh3") if known is None else known
        if rec.get("stamp") == _stamp(st) and rec.get("xxh3") == want:
            ok = True  # unchanged since it was checked
        else:
            ok = st.st_size == rec.get("size") and _digest_fd(fd) == want
        if ok and isinstance(want, int):
            MEMO.put(local, st, want)
        return ok

    def _fill(self, url: str, key: str, local: str, data: bytes, what: str) -> int:
        got = int(xxhash.xxh3_64_intdigest(data))
        want = self.digests.get(key)
        if want is not None and got != want:
            raise ChunkReadError(
                f"{what or 'file'} fetched from {url} is corrupt: checksum {got:016x}, the store "
                f"recorded {want:016x} (xxh3_64); the cache keeps nothing of it"
            )
        tmp = f"{local}{TMP_MARK}{os.getpid()}-{my_start_time() or 0}"
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            view, pos = memoryview(data), 0
            while pos < len(data):
                pos += os.write(fd, view[pos:])
            os.lseek(fd, 0, os.SEEK_SET)  # callers read it as a file from its start
            rec = dict(url=url, size=len(data), xxh3=got, stamp=_stamp(os.fstat(fd)))
            rec["checked"] = "store checksum" if want is not None else "fetched bytes"

            def publish() -> None:  # under the eviction lock: a concurrent fill sees it
                os.replace(tmp, local)  # then the stamp: a rename changes the copy's ctime
                rec["stamp"] = self._remember(local, fd, got)
                write_record(local, json.dumps(rec).encode())

            size = len(data) + len(json.dumps(rec))  # records count
            if not self._make_room(key, size, publish):
                os.remove(tmp)  # served from the open copy, not kept (Belady: needed last)
                self._remember(local, fd, got)
                self._count("bypassed")
                self._hold(key, fd)
                return fd
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)
            raise
        self._count("fills")
        log.debug("cached %s (%d bytes)", url, len(data))
        return fd

    def close(self) -> None:
        """End the read-ahead and close the copies held open (``Store.close``); stays usable."""
        if self.plan is not None:
            self.plan.close()
        with self._lock:
            held, self._held = list(self._held.values()), OrderedDict()
        for fd in held:
            os.close(fd)

    def _remember(self, local: str, fd: int, digest: int) -> list[Any]:
        """Note the digest of the copy of ``local`` open at ``fd`` (this process trusts it:
        :meth:`vouched_digest`, later handles); its stamp."""
        st = os.fstat(fd)
        MEMO.put(local, st, digest)
        return _stamp(st)

    def _hold(self, key: str, fd: int) -> None:
        with self._lock:
            old = self._held.pop(key, None)
            self._held[key] = os.dup(fd)
            while len(self._held) > HELD_FILES:
                os.close(self._held.popitem(last=False)[1])
        if old is not None:
            os.close(old)

    def _reopen_held(self, key: str) -> int | None:
        """A fresh descriptor (its own offset) on a held copy, or None."""
        with self._lock:
            fd = self._held.get(key)
            if fd is None:
                return None
            try:
                return os.open(f"/proc/self/fd/{fd}", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None

    def _count(self, name: str, n: int = 1) -> None:
        with self._lock:
            self.stats[name] += n

    # -- the bound -----------------------------------------------------------------------------
    def _make_room(self, key: str, size: int, publish: Callable[[], None]) -> bool:
        """Evict until ``size`` more bytes fit and ``publish`` the new file, under the eviction
        lock (two fills checking the bound at once would both fit and overshoot it together);
        False (nothing published) when the new file should not be kept."""
        if self.cache_bytes is None:
            publish()
            return True
        if size > self.cache_bytes:
            return False
        with locked(os.path.join(self.dir, EVICT_LOCK)):
            fits = self._evict_for(key, size)
            if fits:
                publish()
            return fits

    def _would_keep(self, key: str) -> bool:
        """Whether a file fetched now for a later read would be kept until then: room is left,
        or the plan reads it before the farthest-needed file held (Belady's rule, as in
        :meth:`_evict_for`). A read-ahead of a file that would not be kept is a wasted fetch:
        it is dropped, and its read fetches it again."""
        if self.cache_bytes is None or self.plan is None or not self.plan.knows(key):
            return True
        entries = scan(self.dir)
        if not entries:
            return True
        total = sum(e[1] for e in entries.values())
        if total + total / len(entries) <= self.cache_bytes:  # room for a file of average size
            return True
        return not self._read_after_all_held(key, self._rank(entries), strict=False)

    def _read_after_all_held(
        self, key: str, ranked: list[tuple[tuple[int, int, float], str]], *, strict: bool
    ) -> bool:
        """Whether the plan reads ``key`` next (after the clock, with ``strict``) no sooner
        than every file held (or never): Belady keeps such a file last, so not at all."""
        plan = self.plan
        if plan is None or not ranked or not plan.knows(key):
            return False
        return bool(plan.next_use(key, strict=strict) >= ranked[0][0][0])

    def _evict_for(self, key: str, size: int) -> bool:
        """Evict until ``size`` more bytes fit (the eviction lock held); False when the new
        file should not be kept."""
        assert self.cache_bytes is not None
        entries = scan(self.dir)
        total = sum(e[1] for e in entries.values())
        if total + size <= self.cache_bytes:
            return True
        ranked = self._rank(entries)
        if self._read_after_all_held(key, ranked, strict=True):  # its next read, not this one
            return False
        for _, name in ranked:
            if total + size <= self.cache_bytes:
                break
            if remove_entry(self.dir, name):  # 0: being filled, or gone already
                total -= entries[name][1]
                self._count("evicted")
        return total + size <= self.cache_bytes

    def _rank(
        self, entries: dict[str, tuple[float, int]]
    ) -> list[tuple[tuple[int, int, float], str]]:
        """Entries in eviction order: farthest next use first (unplanned files after planned
        ones never read again, oldest first); without a plan, least recently used first."""
        keyed = []
        for name, (used, _) in entries.items():
            if self.plan is None:
                keyed.append(((0, 0, -used), name))
                continue
            nxt = self.plan.next_use(name)
            planned = 1 if self.plan.knows(name) else 0
            keyed.append(((nxt, planned, -used), name))
        keyed.sort(reverse=True)
        return keyed


class NotKept(Exception):
    """A read-ahead the cache declined: the file would be evicted before it is read."""
