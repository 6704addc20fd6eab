"""A ring of shared-memory batch slots: DataLoader workers gather batches into it and the main
process uses them in place, with no copy.

The stock hand-off of a DataLoader worker moves every batch through a fresh shared-memory
segment (create, fill, send a file descriptor, map, unmap): for 1.5 MB batches that costs more
than reading them. Here the main process maps one anonymous shared region *before* the workers
fork (``MAP_SHARED | MAP_NORESERVE``: virtual only, a page costs memory once touched); a worker
claims a free slot, gathers a batch straight into it and sends only ``(ring, slot, rows)``; the
main process wraps the slot's rows as arrays (:meth:`BatchRing.lease`) and the slot becomes free
when the last of those arrays, and of every view of them, is garbage.

A slot's state is one int64 in the region's header: 0 free, -1 held by the consumer (the main
process), else the pid and start time of the worker filling it (:func:`shardload.procs.pack`). Workers claim slots under a process-shared
lock; only the main process frees them. A worker that finds no free slot gathers into fresh
memory instead (the stock path for that batch), so a consumer that keeps many batches never
blocks a worker and breaking out of a loop never deadlocks one. Slots held by workers that
died are reclaimed (never slots the consumer holds). Torch-free: :mod:`shardload.torch` wraps
the arrays.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import secrets
import sys
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import procs
from .recycle import batch_views, plan_batch_layout

#: Fewest slots in a ring (virtual; only slots used at the same time ever hold memory).
DEFAULT_SLOTS = 64
#: Most address space a ring reserves (virtual, ``MAP_NORESERVE``).
MAX_RING_BYTES = 64 << 30
_PAGE = mmap.PAGESIZE
#: madvise(MADV_POPULATE_WRITE) (Linux 5.14+): map a slot's pages in one call.
_MADV_POPULATE_WRITE = 23 if sys.platform.startswith("linux") else 0
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)

#: Rings of this process by token (the main process looks a slot's ring up when a batch arrives).
RINGS: weakref.WeakValueDictionary[str, BatchRing] = weakref.WeakValueDictionary()


def plan_ring_slots(
    *, group_batches: int, groups_in_flight: int, workers: int, slot_bytes: int, extra: int = 8
) -> int:
    """Slots for ``workers`` workers that each fill ``groups_in_flight`` shuffle groups of
    ``group_batches`` batches at a time (scatter reads fill a whole group's batches at once),
    plus ``extra`` each for the DataLoader's queue and the training loop; at least
    ``DEFAULT_SLOTS``, at most ``MAX_RING_BYTES`` of address space (pure).

    >>> plan_ring_slots(group_batches=65, groups_in_flight=2, workers=2, slot_bytes=1 << 20)
    276
    """
    want = workers * (groups_in_flight * group_batches + extra)
    return max(DEFAULT_SLOTS, min(want, MAX_RING_BYTES // max(1, slot_bytes)))


def _free_flag(flags: np.ndarray, slot: int) -> None:
    flags[slot] = 0


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class BatchRing:
    """Shared slots of ``batch_rows`` rows each, for arrays described by ``specs``.

    ``specs`` maps each key to ``(row_shape, dtype)``. Create it in the main process before the
    DataLoader starts its workers (fork); it does not survive pickling (spawned workers see
    :attr:`usable` false and use the stock hand-off).
    """

    def __init__(
        self,
        specs: Mapping[str, tuple[tuple[int, ...], np.dtype]],
        batch_rows: int,
        *,
        slots: int = DEFAULT_SLOTS,
    ) -> None:
        self.specs = {k: (tuple(s), np.dtype(d)) for k, (s, d) in specs.items()}
        self.batch_rows, self.slots = int(batch_rows), int(slots)
        self.offsets, nbytes = plan_batch_layout(self.specs, self.batch_rows)
        self.slot_bytes = _round_up(nbytes, _PAGE)
        self.header_bytes = _round_up(self.slots * 8, _PAGE)
        size = self.header_bytes + self.slots * self.slot_bytes
        self._mm = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        self._flags = np.frombuffer(self._mm, np.int64, count=self.slots)
        self._lock = multiprocessing.get_context("fork").Lock()
        self.owner = os.getpid()
        self.token = secrets.token_hex(8)
        self._claimed: dict[int, int] = {}  # id(batch index array) -> slot, in a worker
        self._mapped: set[int] = set()  # slots this process has written to
        self._mark: tuple[int, int] | None = None  # (pid, slot mark) of this process
        RINGS[self.token] = self

    @property
    def usable(self) -> bool:
        """True in a process forked from the ring's creator (a DataLoader worker)."""
        return self._mm is not None and os.getpid() != self.owner

    def views(self, slot: int, rows: int) -> dict[str, np.ndarray]:
        """The arrays of ``rows`` rows in ``slot`` (views of the shared region)."""
        return batch_views(self._slot(slot), self.specs, self.offsets, rows)

    def _slot(self, slot: int) -> np.ndarray:
        base = self.header_bytes + slot * self.slot_bytes
        return np.frombuffer(self._mm, np.uint8, count=self.slot_bytes, offset=base)

    # -- worker side ---------------------------------------------------------------------------
    def claim(self, part: tuple[int, int] = (0, 1)) -> int | None:
        """A free slot, now held by this process; None when every slot is taken.

        ``part=(k, n)``: the first free slot from the start of the ``k``-th of ``n`` equal parts
        of the ring on, wrapping round to the ring's start: a worker's own part first (it maps,
        page-faults in, its own slots only), then the parts after it, then those before it.
        Lowest first within that order: slots never used never cost memory.
        """
        pid = self._me()
        lo = part[0] * self.slots // max(1, part[1])
        with self._lock:
            slot = self._first_free(lo)
            if slot is None:
                self._reclaim_dead()
                slot = self._first_free(lo)
                if slot is None:
                    return None
            self._flags[slot] = pid
        return slot

    def _first_free(self, lo: int) -> int | None:
        free = np.flatnonzero(self._flags == 0)
        if not len(free):
            return None
        after = free[free >= lo]
        return int(after[0] if len(after) else free[0])

    def _me(self) -> int:
        """This worker's slot mark: its pid with its start time (:func:`procs.pack`), so a
        slot of a dead worker whose pid was reused is still reclaimed."""
        pid = os.getpid()
        if self._mark is None or self._mark[0] != pid:
            self._mark = (pid, procs.pack(pid, procs.my_start_time()))
        return self._mark[1]

    def _reclaim_dead(self) -> None:
        for mark in np.unique(self._flags[self._flags > 0]):
            if not procs.alive_packed(int(mark)):
                self._flags[self._flags == mark] = 0

    def allocate(self, rows: int, part: tuple[int, int] = (0, 1)) -> dict[str, np.ndarray] | None:
        """Arrays for a batch of ``rows`` rows in a claimed slot (of ``part`` first, as in
        :meth:`claim`), or None (no slot free)."""
        if rows > self.batch_rows:
            return None
        slot = self.claim(part)
        if slot is None:
            return None
        if slot not in self._mapped:  # map the whole slot in one call, not page by page
            self._mapped.add(slot)
            # kernels before 5.14 refuse it (OSError): page faults then do the same
            with contextlib.suppress(OSError, ValueError):
                if _MADV_POPULATE_WRITE:
                    self._mm.madvise(
                        _MADV_POPULATE_WRITE, self.header_bytes + slot * self.slot_bytes,
                        self.slot_bytes,
                    )  # fmt: skip
        out = self.views(slot, rows)
        self._claimed[id(out[next(iter(out))])] = slot
        return out

    def slot_of(self, batch: Mapping[str, np.ndarray]) -> int | None:
        """The slot a batch from :meth:`allocate` lives in (forgets it), or None."""
        return self._claimed.pop(id(batch[next(iter(self.specs))]), None)

    def release_unsent(self) -> None:
        """Free the slots this worker claimed but never handed out (a closed iterator)."""
        for slot in self._claimed.values():
            self.free(slot)
        self._claimed.clear()

    # -- main side -----------------------------------------------------------------------------
    def free(self, slot: int) -> None:
        self._flags[slot] = 0

    def lease(self, slot: int, rows: int) -> dict[str, np.ndarray]:
        """The consumer's arrays of a slot's batch, in place (no copy).

        The slot stays taken until every returned array, and every view of them (tensors from
        ``torch.from_numpy`` included), is garbage; then a finalizer frees it.
        """
        self._flags[slot] = -1  # the consumer's now: never reclaimed as a dead worker's
        raw = self._slot(slot)
        weakref.finalize(raw, _free_flag, self._flags, slot)
        return batch_views(raw, self.specs, self.offsets, rows)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a BatchRing is shared by fork only")
