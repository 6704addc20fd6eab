"""By URL, the inner chunks a reader fetched before this worker's plan needs them, kept until
then (issue 25): bounded in bytes, planned by the loader.

A shuffle group of the default load needs about one inner chunk in six of every shard, so the
requests that cover a group's chunks (:mod:`.shard_fetch`: neighbours within 1 MiB share one)
also bring most of the chunks between them, and the shard fetched whole for its checksum brings
all of them. Without the plan those bytes were dropped and fetched again by later groups (an
epoch of the default store fetched 5 times its size). The loader tells the reader, once per
worker and epoch (:func:`shardload.load.url_plan.plan_url_reads`), how many times this worker
will read each inner chunk this epoch; a fetched chunk that this worker still needs is kept
(its compressed bytes, copied out of the answer) until the call that needs it takes it, as long
as the kept bytes stay within ``max_bytes`` (``SHARDLOAD_URL_KEEP_BYTES``, default 256 MiB).

Kept bytes are the server's bytes for that chunk's offsets, from a shard checked against its
checksum when the loader checks (a chunk is kept only from a checked shard, or where checks are
off); decoding them runs the same checks as a fetched chunk's. A new plan (the next epoch) drops
what is left. Without a plan (a read outside the loader), nothing is kept.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

import numpy as np

#: Kept chunk bytes at most per reader (per process), unless ``SHARDLOAD_URL_KEEP_BYTES`` says.
KEEP_BYTES = 256 << 20
KEEP_ENV = "SHARDLOAD_URL_KEEP_BYTES"


def keep_bytes() -> int:
    """The bound on kept bytes: ``SHARDLOAD_URL_KEEP_BYTES`` (0: keep nothing) or 256 MiB."""
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
    """One reader's plan (reads left of each inner chunk, by array) and its kept chunks."""

    def __init__(self) -> None:
        self.max_bytes = 0
        self.nbytes = 0
        self._left: dict[str, np.ndarray] = {}
        self._data: dict[tuple[str, int], bytes] = {}
        self._lock = threading.Lock()

    def plan(self, left: dict[str, np.ndarray]) -> None:
        """A new epoch's reads left of each inner chunk, by array; what was kept is dropped."""
        max_bytes = keep_bytes()
        with self._lock:
            self._left = {k: np.array(v, np.int64) for k, v in left.items()}
            self._data, self.nbytes, self.max_bytes = {}, 0, max_bytes

    def take(self, name: str, chunks: list[int]) -> dict[int, bytes]:
        """A call reads ``chunks`` of ``name`` (inner chunk numbers of the array): each read
        counted, and those kept handed over (no longer kept)."""
        got: dict[int, bytes] = {}
        with self._lock:
            left = self._left.get(name)
            if left is None:
                return got
            for i in chunks:
                if 0 <= i < len(left):
                    left[i] -= 1
                data = self._data.pop((name, i), None)
                if data is not None:
                    self.nbytes -= len(data)
                    got[i] = data
        return got

    def wanted(self, name: str, chunks: np.ndarray) -> np.ndarray:
        """Which of ``chunks`` this worker reads later this epoch and are not kept yet."""
        with self._lock:
            left = self._left.get(name)
            if left is None or self.nbytes >= self.max_bytes:
                return chunks[:0]
            ok = chunks[(chunks >= 0) & (chunks < len(left))]
            ok = ok[left[ok] > 0]
            return np.array([i for i in ok.tolist() if (name, i) not in self._data], np.int64)

    def room(self) -> int:
        """Bytes that may still be kept."""
        with self._lock:
            return max(0, self.max_bytes - self.nbytes)

    def keep(self, name: str, i: int, view: Any) -> bool:
        """Keep a copy of chunk ``i``'s bytes if this worker reads it later and they fit."""
        with self._lock:
            left = self._left.get(name)
            if left is None or not 0 <= i < len(left) or left[i] <= 0:
                return False
            if (name, i) in self._data or self.nbytes + len(view) > self.max_bytes:
                return False
            data = bytes(view)
            self._data[(name, i)] = data
            self.nbytes += len(data)
            return True

    def __len__(self) -> int:
        return len(self._data)


_KEPT: weakref.WeakKeyDictionary[Any, KeptChunks] = weakref.WeakKeyDictionary()
_KEPT_LOCK = threading.Lock()


def kept_for(owner: Any) -> KeptChunks:
    """The kept chunks of the reader that owns ``owner`` (its shard index cache)."""
    with _KEPT_LOCK:
        kept = _KEPT.get(owner)
        if kept is None:
            kept = _KEPT[owner] = KeptChunks()
        return kept


def _after_fork() -> None:  # a child plans its own reads: never a parent's bytes or locks
    global _KEPT_LOCK
    _KEPT_LOCK = threading.Lock()
    for owner in list(_KEPT.keys()):
        _KEPT[owner] = KeptChunks()


os.register_at_fork(after_in_child=_after_fork)


def plan_kept(kept: KeptChunks, layouts: dict[str, Any], first: Any, last: Any) -> None:
    """Plan ``kept`` from a worker's row spans ``[first, last)`` of this epoch: the reads of
    each inner chunk of each sharded array of ``layouts`` (a ``ChunkLayout`` or None)."""
    first = np.asarray(first, np.int64)
    last = np.asarray(last, np.int64)
    left: dict[str, np.ndarray] = {}
    for name, layout in layouts.items():
        if layout is None or layout.shard is None or not len(first):
            continue
        rows = int(layout.chunk_rows)
        a = first // rows
        n = np.maximum(-(-last // rows) - a, 0)  # inner chunks each span touches
        total = int(n.sum())
        starts = np.repeat(np.cumsum(n) - n, n)
        ids = np.repeat(a, n) + (np.arange(total, dtype=np.int64) - starts)
        left[name] = np.bincount(ids, minlength=int(ids.max()) + 1 if total else 0)
    kept.plan(left)
