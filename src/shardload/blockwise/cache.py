"""A bounded cache of decoded source chunks, shared by the threads of one process.

The reuse plan (:mod:`shardload.blockwise.reuse`) knows how many blocks read each chunk and
where each is read next, so the cache keeps a chunk exactly while blocks still need it: a chunk
is dropped when its last block has read it, and when a new chunk does not fit in
``capacity_bytes`` the chunk read farthest in the future goes first (Belady's rule); a chunk
needed later than every held one is handed out without being kept. Two threads asking for the
same chunk decode it once (the second waits). Chunks read by a single block are not cached:
:func:`read_box` reads their part directly.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from itertools import product
from typing import Any

import numpy as np

from shardload.blockwise.reuse import Chunk, ReusePlan

Box = Sequence[tuple[int, int]]


class ChunkCache:
    """Decoded chunks of one source for one run (see the module docstring)."""

    def __init__(
        self, plan: ReusePlan, capacity_bytes: int, decode: Callable[[Box], np.ndarray]
    ) -> None:
        self.plan, self.capacity_bytes, self._decode = plan, int(capacity_bytes), decode
        self._lock = threading.Lock()
        self._held: dict[Chunk, np.ndarray] = {}
        self._loading: dict[Chunk, threading.Event] = {}
        self._left: dict[Chunk, int] = {}  # reads still to come, of chunks read so far
        self._finished: set[int] = set()
        self.bytes_held = 0
        self.max_bytes_held = 0
        self.decodes: Counter[Chunk] = Counter()

    def get(self, chunk: Chunk) -> np.ndarray:
        """The decoded chunk (read-only), decoded here unless held or being decoded."""
        while True:
            with self._lock:
                arr = self._held.get(chunk)
                if arr is not None:
                    return arr
                event = self._loading.get(chunk)
                mine = event is None
                if mine:
                    event = self._loading[chunk] = threading.Event()
            assert event is not None
            if not mine:
                event.wait()  # another thread decodes it: take it from the cache, or decode
                continue
            try:
                arr = np.asarray(self._decode(self.plan.chunk_box(chunk)))
                arr.flags.writeable = False
                with self._lock:
                    self.decodes[chunk] += 1
                    self._keep(chunk, arr)
            finally:
                with self._lock:
                    del self._loading[chunk]
                event.set()
            return arr

    def _keep(self, chunk: Chunk, arr: np.ndarray) -> None:
        """Hold ``arr`` if it fits after evicting chunks needed later than it (lock held)."""
        if self._left.get(chunk, 1) <= 0:
            return
        mine = self._next(chunk)
        while self.bytes_held + arr.nbytes > self.capacity_bytes and self._held:
            far = max(self._held, key=self._next)
            if self._next(far) <= mine:
                return  # every held chunk is needed before this one: hand it out uncached
            self._drop(far)
        if self.bytes_held + arr.nbytes <= self.capacity_bytes:
            self._held[chunk] = arr
            self.bytes_held += arr.nbytes
            self.max_bytes_held = max(self.max_bytes_held, self.bytes_held)

    def _next(self, chunk: Chunk) -> tuple[float, ...]:
        nxt = self.plan.next_use(chunk, finished=self._finished)
        return (float("inf"),) if nxt is None else tuple(float(i) for i in nxt)

    def _drop(self, chunk: Chunk) -> None:
        arr = self._held.pop(chunk, None)
        if arr is not None:
            self.bytes_held -= arr.nbytes

    def release(self, chunks: Iterable[Chunk]) -> None:
        """One block has read ``chunks``: drop those no block reads any more."""
        with self._lock:
            for c in chunks:
                left = self._left[c] = self._left.get(c, self.plan.uses(c)) - 1
                if left <= 0:  # kept at 0: a late decode of it is not held
                    self._drop(c)

    def finish_slab(self, slab: int) -> None:
        with self._lock:
            self._finished.add(slab)


def read_box(
    cache: ChunkCache,
    box: Box,
    dtype: Any,
    read: Callable[[Box], np.ndarray],
) -> np.ndarray:
    """The source's values in ``box``: a part of each chunk it overlaps, from the cache for
    chunks read by several blocks, straight from the source (``read``) for the others."""
    plan = cache.plan
    per_axis = []
    for (a, b), edges in zip(box, plan.edges, strict=True):
        first = int(np.searchsorted(edges, a, side="right")) - 1
        last = int(np.searchsorted(edges, b - 1, side="right")) - 1
        per_axis.append(range(first, last + 1))
    chunks = [tuple(c) for c in product(*per_axis)]
    if all(plan.uses(c) <= 1 for c in chunks):
        return read(box)  # nothing here is read twice: one windowed read
    out = np.empty([b - a for a, b in box], dtype=dtype)
    for c in chunks:
        cbox = plan.chunk_box(c)
        part = [(max(a, ca), min(b, cb)) for (a, b), (ca, cb) in zip(box, cbox, strict=True)]
        dst = tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(part, box, strict=True))
        if plan.uses(c) > 1:
            src = tuple(
                slice(lo - ca, hi - ca) for (lo, hi), (ca, _) in zip(part, cbox, strict=True)
            )
            out[dst] = cache.get(c)[src]
        else:
            out[dst] = read(part)
    return out
