"""Batch memory that is reused once the caller drops a batch.

Fresh memory is expensive to touch for the first time (a page fault per 4 KiB page; far more in
a virtual machine whose host backs guest memory lazily), and a loader that allocates a fresh
batch for every batch touches the whole epoch's worth of it. :class:`BatchRecycler` hands out
batches over a small set of buffers and takes a buffer back when the last array viewing it, of
the batch or of any view the caller made (``torch.from_numpy`` tensors included), is garbage:
the arrays of a batch all view one non-owning wrapper array, and a weak reference to that
wrapper returns the buffer (its callback). A caller that keeps batches just makes the recycler allocate more.

Buffers are cut from *slabs* of about :data:`SLAB_BYTES` (:func:`huge_empty`): private
anonymous memory aligned on 2 MiB and advised for transparent huge pages on Linux, so the
kernel's copy into a fresh batch faults once per 2 MiB instead of once per 4 KiB page (numpy
advises only arrays of 4 MiB or more, and a batch is often less): 12,000 faults an epoch of
the 406 MB raw store of ``benchmarks/raw_goal.py`` became about 30 (docs/design.md, "Batch
memory in huge pages").
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import sys
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import numpy as np

from shardload.store.core import Store

T = TypeVar("T")

Specs = Mapping[str, tuple[tuple[int, ...], np.dtype]]
#: Where a batch of ``n`` rows goes (key -> array, keys as in a batch), or None for fresh arrays.
Allocate = Callable[[int], "dict[str, np.ndarray] | None"]
#: The batch key of the samples' global row numbers (int64).
INDEX_KEY = "index"


#: Batch buffers are cut from slabs of at least this many bytes (one buffer when larger).
SLAB_BYTES = 16 << 20
#: Transparent huge pages: a slab starts on this boundary (x86-64 and arm64 with 4 KiB pages).
HUGE_PAGE = 2 << 20
#: Each buffer of a slab starts on a page: the kernel copies files into aligned memory faster
#: (``shardload.formats.base.aligned_empty``).
PAGE = 4096
_MADV_HUGEPAGE = 14  # Linux; Python 3.11's mmap module does not name it


def huge_empty(nbytes: int) -> np.ndarray:
    """``nbytes`` of uninitialised memory (uint8) starting on a :data:`HUGE_PAGE` boundary,
    its whole huge pages advised ``MADV_HUGEPAGE`` (Linux, private anonymous ``mmap``; freed
    when the last view goes): their first touch faults a 2 MiB page at a time where
    transparent huge pages are ``always`` or ``madvise``. The tail past the last whole huge
    page is not advised: under ``madvise`` a touch there faults its own 4 KiB page, not the 2
    MiB page around it (a slab of batches ends anywhere in its last huge page: up to 2 MiB
    resident for nothing per slab, 7 MiB of the 87 batches of a default raw store's epoch).
    Elsewhere, a page-aligned ``np.empty``."""
    if not sys.platform.startswith("linux"):
        raw = np.empty(nbytes + PAGE, np.uint8)
        off = (-raw.ctypes.data) % PAGE
        return raw[off : off + nbytes]
    size = -(-max(1, nbytes) // HUGE_PAGE) * HUGE_PAGE
    m = mmap.mmap(-1, size + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = np.frombuffer(m, np.uint8)
    off = (-raw.ctypes.data) % HUGE_PAGE
    whole = nbytes // HUGE_PAGE * HUGE_PAGE
    with contextlib.suppress(OSError):  # a kernel without transparent huge pages: 4 KiB pages
        if whole:
            m.madvise(_MADV_HUGEPAGE, off, whole)
    return raw[off : off + nbytes]


def batch_specs(store: Store, names: Sequence[str]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``(row_shape, dtype)`` of each array of a batch, ``"index"`` included."""
    infos = store.manifest.arrays
    specs = {a: (tuple(infos[a].row_shape), np.dtype(infos[a].dtype)) for a in names}
    specs[INDEX_KEY] = ((), np.dtype(np.int64))
    return specs


def new_batch(specs: Mapping[str, Any], n: int) -> dict[str, np.ndarray]:
    """Freshly allocated, contiguous, writable arrays for a batch of ``n`` rows (``specs``:
    each array's manifest entry)."""
    out = {a: np.empty((n, *s.row_shape), np.dtype(s.dtype)) for a, s in specs.items()}
    out[INDEX_KEY] = np.empty(n, np.int64)
    return out


def plan_batch_layout(specs: Specs, batch_rows: int) -> tuple[dict[str, int], int]:
    """Byte offsets of each array of a ``batch_rows``-row batch in one buffer (64-byte aligned),
    and the buffer's size (pure).

    >>> plan_batch_layout({"x": ((3,), np.dtype("f4")), "index": ((), np.dtype("i8"))}, 4)
    ({'x': 0, 'index': 64}, 128)
    """
    offsets, at = {}, 0
    for k, (shape, dtype) in specs.items():
        offsets[k] = at
        at += -(-batch_rows * math.prod(shape) * dtype.itemsize // 64) * 64
    return offsets, max(at, 1)


def batch_views(
    raw: np.ndarray, specs: Specs, offsets: Mapping[str, int], rows: int
) -> dict[str, np.ndarray]:
    """The arrays of a ``rows``-row batch laid out in the uint8 buffer ``raw`` (views of it,
    each with ``raw`` as its base)."""
    # one ndarray(buffer=) a key: a slice, view and reshape cost twice as much (a batch is
    # allocated 256 times an epoch of the raw store, docs/benchmarks.md)
    return {
        k: np.ndarray((rows, *shape), dtype, raw, offsets[k]) for k, (shape, dtype) in specs.items()
    }


class BatchRecycler:
    """Batches of at most ``batch_rows`` rows for arrays ``specs`` (key -> (row_shape, dtype)).

    Keeps at most ``keep`` idle buffers; more are released to the allocator.
    """

    def __init__(
        self,
        specs: Specs,
        batch_rows: int,
        *,
        keep: int = 64,
    ) -> None:
        self.specs = {k: (tuple(s), np.dtype(d)) for k, (s, d) in specs.items()}
        self.batch_rows, self.keep = int(batch_rows), int(keep)
        self.offsets, self.buffer_bytes = plan_batch_layout(self.specs, self.batch_rows)
        self._idle: list[np.ndarray] = []
        self._lock = threading.Lock()
        self.allocated = 0  # buffers ever made (for tests and logs)
        self._stride = -(-self.buffer_bytes // PAGE) * PAGE
        self._per_slab = max(1, min(self.keep, SLAB_BYTES // self._stride))
        self._slab: np.ndarray | None = None  # the rest of the current slab
        #: the buffers of batches handed out, by id of the weak reference to their wrapper
        self._out: dict[int, tuple[weakref.ref[np.ndarray], np.ndarray]] = {}

    def _returned(self, ref: weakref.ref[np.ndarray]) -> None:
        """The wrapper of a batch died (the last view of it went): its buffer is idle."""
        got = self._out.pop(id(ref), None)
        if got is not None:
            self._give_back(got[1])

    def _give_back(self, buf: np.ndarray) -> None:
        with self._lock:
            if len(self._idle) < self.keep:
                self._idle.append(buf)

    def _cut(self) -> np.ndarray:  # under the lock
        """A new buffer: the next one of the current slab (a new slab when it is used up)."""
        if self._slab is None or len(self._slab) < self.buffer_bytes:
            self._slab = huge_empty(self._per_slab * self._stride)
        buf, self._slab = self._slab[: self.buffer_bytes], self._slab[self._stride :]
        return buf

    def allocate(self, rows: int) -> dict[str, np.ndarray] | None:
        """Arrays for a batch of ``rows`` rows over a reused buffer, or None if too many rows."""
        if rows > self.batch_rows:
            return None
        with self._lock:
            buf = self._idle.pop() if self._idle else None
            if buf is None:
                buf = self._cut()
                self.allocated += 1
        raw = np.frombuffer(buf.data, np.uint8)  # views of it keep it (not buf) as base
        # a plain weak reference with a callback (~1 us), kept with its buffer until the
        # wrapper dies: weakref.finalize cost ~11 us a batch (its Python-level registry)
        ref = weakref.ref(raw, self._returned)
        self._out[id(ref)] = (ref, buf)
        return batch_views(raw, self.specs, self.offsets, rows)


#: Each open store's batch recyclers, by batch layout (arrays, batch size), and its group
#: buffer pools (:func:`store_kept`): the next epoch's iterator takes up the memory the last
#: one's batches and groups left, already faulted in, instead of fresh pages (zeroed by the
#: kernel at first touch: ~8 ms of CPU an epoch of the 406 MB raw store; the default store's
#: two 67 MB group buffers an epoch were 6% of its CPU, 2026-11-28). Freed with the store object.
_RECYCLERS: weakref.WeakKeyDictionary[Store, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)
_RECYCLERS_LOCK = threading.Lock()


#: What the last store that ``iter_batches`` opened from a path or URL kept, by that URL: one
#: slot, taken up by the next ``iter_batches`` of the same URL (the next epoch of a loop that
#: passes a path opens a new store: its group buffers and batches were fresh pages each
#: epoch, 0.04-0.06 CPU s of the default store's 0.5, 2026-11-28). Held until then, until
#: ``iter_batches`` opens another URL, or the process ends.
_HANDED: dict[str, dict[tuple[Any, ...], Any]] = {}


def hand_on_kept(store: Store) -> None:
    """At the close of a store ``iter_batches`` opened: what it kept goes to the slot (what
    the slot held before is dropped)."""
    with _RECYCLERS_LOCK:
        kept = _RECYCLERS.pop(store, None)
        _HANDED.clear()
        if kept:
            _HANDED[store.url] = kept


def take_up_kept(store: Store) -> None:
    """A store ``iter_batches`` just opened takes up what the last one of its URL kept; the
    slot is emptied either way."""
    with _RECYCLERS_LOCK:
        kept = _HANDED.pop(store.url, None)
        _HANDED.clear()
        if kept:
            _RECYCLERS.setdefault(store, {}).update(kept)


def _forget_recyclers_in_child() -> None:
    """A forked worker starts with recyclers of its own: the parent's locks may have been held
    by one of its threads at the fork, and their idle buffers are the parent's."""
    global _RECYCLERS_LOCK
    _RECYCLERS_LOCK = threading.Lock()
    _RECYCLERS.clear()
    _HANDED.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_recyclers_in_child)


def store_recycler(store: Store, specs: Specs, batch_rows: int, *, keep: int) -> BatchRecycler:
    """``store``'s recycler of batches of ``specs`` and ``batch_rows`` rows (made on first use,
    shared by its iterators, thread-safe), keeping at least ``keep`` buffers idle."""
    key = (tuple((k, s, np.dtype(d).str) for k, (s, d) in specs.items()), batch_rows)
    rec: BatchRecycler = store_kept(store, key, lambda: BatchRecycler(specs, batch_rows, keep=keep))
    rec.keep = max(rec.keep, keep)
    return rec


def store_kept(store: Store, key: tuple[Any, ...], make: Callable[[], T]) -> T:
    """What ``store`` keeps under ``key`` for its iterators (``make()`` on first use): memory
    that outlives one epoch's iterator, freed with the store object, fresh in a forked child."""
    with _RECYCLERS_LOCK:
        mine = _RECYCLERS.setdefault(store, {})
        got = mine.get(key)
        if got is None:
            got = mine[key] = make()
    return cast(T, got)
