"""By URL, the inner chunks a reader fetched before this worker's plan needs them, kept until
then (issue 25): bounded in bytes, planned by the loader.

A shuffle group of the default load needs about one inner chunk in six of every shard, so the
requests that cover a group's chunks (:mod:`.shard_fetch`: neighbours within 1 MiB share one)
also bring most of the chunks between them, and the shard fetched whole for its checksum brings
all of them. Without the plan those bytes were dropped and fetched again by later groups (an
epoch of the default store fetched 5 times its size). The loader tells the reader, once per
worker and epoch (:func:`shardload.load.url_plan.plan_url_reads`), when this worker reads
each inner chunk this epoch (the step of its plan); a fetched chunk that this worker still needs
is kept (its compressed bytes, copied out of the answer) until the call that needs it takes it,
within ``max_bytes`` (``SHARDLOAD_URL_KEEP_BYTES``, default 64 MiB). When full, the plan
decides as Belady's rule does: a chunk read sooner than the farthest-read kept one replaces it,
a chunk read after every kept one is not kept (the first group's checked shards bring every
chunk of the store: the bound keeps those the next groups read). The bound was 256 MiB with
the first fitting chunks kept; the median peak memory of an epoch by URL is back within what it
was before chunks were kept, for more bytes fetched (docs/benchmarks.md).

Kept bytes are the server's bytes for that chunk's offsets, from a shard checked against its
checksum when the loader checks (a chunk is kept only from a checked shard, or where checks are
off); decoding them runs the same checks as a fetched chunk's. A new plan (the next epoch) drops
what is left. Without a plan (a read outside the loader), nothing is kept.
"""

from __future__ import annotations

import heapq
import os
import threading
from typing import Any

import numpy as np

from shardload.formats.zarr.empty import EMPTY
from shardload.util.owners import PerOwner

#: Kept chunk bytes at most per reader (per process), unless ``SHARDLOAD_URL_KEEP_BYTES`` says.
KEEP_BYTES = 64 << 20
KEEP_ENV = "SHARDLOAD_URL_KEEP_BYTES"


def keep_bytes() -> int:
    """The bound on kept bytes: ``SHARDLOAD_URL_KEEP_BYTES`` (0: keep nothing) or 64 MiB."""
    raw = os.environ.get(KEEP_ENV, "").strip()
    if not raw:
        return KEEP_BYTES
    from shardload.errors import ConfigError

    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise ConfigError(f"{KEEP_ENV}={raw!r} must be a whole number of bytes >= 0")
    return value


class KeptChunks:
    """One reader's plan (when this worker reads each inner chunk, by array) and its kept
    chunks: at most ``max_bytes``, the soonest read first (Belady: when full, a chunk read
    sooner than the farthest kept one takes its place; a chunk read later than all is not kept).
    """

    def __init__(self) -> None:
        self.max_bytes = 0
        self.nbytes = 0
        self.dropped = 0  # chunks dropped for sooner ones this epoch
        self._when: dict[str, np.ndarray] = {}  # each array's read times, chunk by chunk
        self._next: dict[str, np.ndarray] = {}  # per chunk: index into _when of its next read
        self._end: dict[str, np.ndarray] = {}  # per chunk: end of its reads in _when
        self._data: dict[tuple[str, int], bytes] = {}
        self._far: list[tuple[int, str, int]] = []  # kept chunks, farthest next read first
        self._lock = threading.Lock()

    def plan(self, reads: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        """A new epoch's reads, by array: each read's inner chunk and its time (a step of this
        worker's plan, in the order it reads); what was kept is dropped."""
        max_bytes = keep_bytes()
        when, nxt, end = {}, {}, {}
        for name, (ids, times) in reads.items():
            ids = np.asarray(ids, np.int64)
            order = np.lexsort((np.asarray(times, np.int64), ids))
            count = np.bincount(ids, minlength=int(ids.max()) + 1 if len(ids) else 0)
            when[name] = np.asarray(times, np.int64)[order]
            end[name] = np.cumsum(count)
            nxt[name] = end[name] - count
        with self._lock:
            self._when, self._next, self._end = when, nxt, end
            self._data, self._far, self.nbytes, self.max_bytes = {}, [], 0, max_bytes
            self.dropped = 0

    def _soonest(self, name: str, i: int) -> int | None:
        """When this worker next reads chunk ``i`` of ``name``; None if not this epoch."""
        nxt = self._next.get(name)
        if nxt is None or not 0 <= i < len(nxt) or nxt[i] >= self._end[name][i]:
            return None
        return int(self._when[name][nxt[i]])

    def take(self, name: str, chunks: list[int]) -> dict[int, bytes]:
        """A call reads ``chunks`` of ``name`` (inner chunk numbers of the array): each read
        counted, and those kept handed over (no longer kept)."""
        got: dict[int, bytes] = {}
        with self._lock:
            nxt = self._next.get(name)
            if nxt is None:
                return got
            for i in chunks:
                if 0 <= i < len(nxt) and nxt[i] < self._end[name][i]:
                    nxt[i] += 1
                data = self._data.pop((name, i), None)
                if data is not None:
                    self.nbytes -= len(data)
                    got[i] = data
        return got

    def wanted(self, name: str, chunks: np.ndarray) -> np.ndarray:
        """Which of ``chunks`` this worker reads later this epoch and are not kept yet, the
        soonest read first."""
        with self._lock:
            nxt = self._next.get(name)
            if nxt is None or not self.max_bytes:
                return chunks[:0]
            ok = chunks[(chunks >= 0) & (chunks < len(nxt))]
            ok = ok[nxt[ok] < self._end[name][ok]]
            ok = np.array([i for i in ok.tolist() if (name, i) not in self._data], np.int64)
            when = self._when[name][np.minimum(nxt[ok], len(self._when[name]) - 1)]
            return ok[np.argsort(when, kind="stable")]

    def room(self) -> int:
        """Bytes that may still be kept without dropping any."""
        with self._lock:
            return max(0, self.max_bytes - self.nbytes)

    def keep(self, name: str, i: int, view: Any) -> bool:
        """Keep a copy of chunk ``i``'s bytes if this worker reads it later and it fits, once
        the kept chunks read after it are dropped if need be (the farthest first)."""
        size = len(view)
        with self._lock:
            when = self._soonest(name, i)
            if when is None or (name, i) in self._data or size > self.max_bytes:
                return False
            while self.nbytes + size > self.max_bytes and self._far:
                far, far_name, j = self._far[0]  # the kept chunk read last (heap of -time)
                data = self._data.get((far_name, j))
                if data is None or self._soonest(far_name, j) != -far:
                    heapq.heappop(self._far)  # taken since (or kept again): a stale entry
                    continue
                if -far <= when:
                    return False  # every kept chunk is read before this one
                heapq.heappop(self._far)
                del self._data[(far_name, j)]
                self.nbytes -= len(data)
                self.dropped += 1
            if self.nbytes + size > self.max_bytes:
                return False
            data = bytes(view)
            self._data[(name, i)] = data
            self.nbytes += size
            heapq.heappush(self._far, (-when, name, i))
            return True

    def __len__(self) -> int:
        return len(self._data)


#: per reader; a forked child's are its own (never a parent's bytes, futures or locks)
_KEPT: PerOwner[KeptChunks] = PerOwner(KeptChunks)


def kept_for(owner: Any) -> KeptChunks:
    """The kept chunks of the reader that owns ``owner`` (its shard index cache)."""
    return _KEPT.get(owner)


def plan_kept(kept: KeptChunks, layouts: dict[str, Any], first: Any, last: Any) -> None:
    """Plan ``kept`` from a worker's row spans ``[first, last)`` of this epoch, in the order it
    reads them: the inner chunks each span of each sharded array of ``layouts`` (a
    ``ChunkLayout`` or None) reads, each at the span's step."""
    first = np.asarray(first, np.int64)
    last = np.asarray(last, np.int64)
    reads: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for name, layout in layouts.items():
        if layout is None or layout.shard is None or not len(first):
            continue
        rows = int(layout.chunk_rows)
        a = first // rows
        n = np.maximum(-(-last // rows) - a, 0)  # inner chunks each span touches
        total = int(n.sum())
        starts = np.repeat(np.cumsum(n) - n, n)
        ids = np.repeat(a, n) + (np.arange(total, dtype=np.int64) - starts)
        reads[name] = (ids, np.repeat(np.arange(len(first), dtype=np.int64), n))
    kept.plan(reads)


def later_chunks(kept: KeptChunks | None, name: str, first: int, index: np.ndarray) -> np.ndarray:
    """The inner chunks of the shard (numbers within it) that this worker reads later and that
    fit the room left to keep them (the soonest read first), in offset order."""
    if kept is None:
        return np.zeros(0, np.int64)
    js = kept.wanted(name, np.arange(first, first + len(index), dtype=np.int64)) - first
    js = js[index[js, 0] != np.uint64(EMPTY)]
    js = js[np.cumsum(index[js, 1].astype(np.int64)) <= kept.room()]
    return js[np.argsort(index[js, 0], kind="stable")]


def keep_inside(
    kept: KeptChunks, name: str, k: int, index: np.ndarray, buf: memoryview, at: int, got: int
) -> None:
    """Keep the chunks of shard ``k`` wholly inside ``buf`` (its bytes [at, at + got)) that this
    worker reads later this epoch."""
    assert index.ndim == 2
    n = len(index)
    offs, sizes = index[:, 0], index[:, 1]
    inside = (offs != np.uint64(EMPTY)) & (offs >= np.uint64(at))
    inside &= offs + sizes <= np.uint64(at + got)
    js = np.flatnonzero(inside)
    first = k * n
    for i in kept.wanted(name, js + first).tolist():
        o, size = int(offs[i - first]) - at, int(sizes[i - first])
        if not kept.keep(name, i, buf[o : o + size]):
            break  # full
