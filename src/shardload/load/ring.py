"""A ring of shared-memory batch slots: DataLoader workers gather batches into it and the main
process uses them in place, with no copy.

The stock hand-off of a DataLoader worker moves every batch through a fresh shared-memory
segment (create, fill, send a file descriptor, map, unmap): for 1.5 MB batches that costs more
than reading them. Here the main process maps one anonymous shared region *before* the workers
fork (``MAP_SHARED | MAP_NORESERVE``: virtual only, a page costs memory once touched); a worker
claims a free slot, gathers a batch straight into it and sends only ``(ring, slot, rows,
mark)``; the main process wraps the slot's rows as arrays (:meth:`BatchRing.lease`) and the
slot becomes free when the last of those arrays, and of every view of them, is garbage.

A slot's state is one int64 in the region's header: 0 free, -1 held by the consumer (the main
process), else the pid and start time of the worker filling it (:func:`shardload.util.procs.pack`),
which it keeps until the consumer leases it. Workers claim slots under a process-shared lock,
and the consumer leases under the same lock: a slot is leased only while it still holds its
sender's mark (the batch's message carries it), else the lease raises. A worker that finds no
free slot gathers into fresh memory instead (the stock path for that batch), so a consumer
that keeps many batches never blocks a worker and breaking out of a loop never deadlocks one.
Slots held by workers that died are reclaimed (never the consumer's: the flags are read once,
and no lease lands between that read and the reclaim's writes). Torch-free.

A slot a worker claimed is freed when the batch is handed out (:meth:`BatchRing.sent`) or
dropped (:meth:`BatchRing.free`); one whose arrays all became garbage without either (worker code
that yielded a *new* dict built from the batch, which the stock hand-off then copied) is freed by
a finalizer, which warns once per process. A batch is known for a slot's by where its memory is.

Memory: a slot's pages cost memory from the first batch gathered into it. The main process
sweeps the ring every ``sweep_every`` frees and gives the pages of slots left unused for two
sweeps back to the kernel (``madvise(MADV_REMOVE)``: a shared mapping's pages are only freed
that way), so resident memory follows the slots in use recently (the steady set of the workers'
batches in flight plus what the training loop holds), not the ring's high-water mark.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import secrets
import sys
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import numpy as np

from shardload.load.recycle import batch_views, plan_batch_layout
from shardload.util import procs

#: Fewest slots in a ring (virtual; only slots used at the same time ever hold memory).
DEFAULT_SLOTS = 64
#: Most address space a ring reserves (virtual, ``MAP_NORESERVE``).
MAX_RING_BYTES = 64 << 30
_PAGE = mmap.PAGESIZE
#: madvise(MADV_POPULATE_WRITE) (Linux 5.14+): map a slot's pages in one call.
_MADV_POPULATE_WRITE = 23 if sys.platform.startswith("linux") else 0
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
#: madvise(MADV_REMOVE): free a shared mapping's pages (MADV_DONTNEED only unmaps them).
_MADV_REMOVE = getattr(mmap, "MADV_REMOVE", 0)
#: Sweeps a slot stays unused before its pages go back to the kernel.
IDLE_SWEEPS = 2
#: Longest the consumer waits for the ring's lock before it calls the run failed (seconds).
LEASE_WAIT_S = 60.0
#: Header words before the per-slot arrays: the count of orphaned slots.
_HEAD = 1

_WARNED = [False]  # the orphaned-slot warning, once per process
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


ORPHAN_WARNING = (
    "a DataLoader worker dropped a shardload batch without sending it: code in the worker built "
    "a new dict from it (e.g. {{**batch, 'extra': ...}} or dict(batch)), so it went through "
    "torch's stock hand-off (a copy) and its ring slot {slot} was freed late. Change the batch in "
    "place instead (batch['extra'] = ...) to keep the zero-copy hand-off. (Warned once per worker.)"
)


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
        # header: orphan count, then per slot: state, claimed-since-sweep, resident, generation
        self.header_bytes = _round_up((_HEAD + 4 * self.slots) * 8, _PAGE)
        size = self.header_bytes + self.slots * self.slot_bytes
        self._mm = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        head = np.frombuffer(self._mm, np.int64, count=_HEAD + 4 * self.slots)
        self._head = head[:_HEAD]
        n = self.slots
        self._flags, self._touched, self._resident, self._gen = (
            head[_HEAD + i * n : _HEAD + (i + 1) * n] for i in range(4)
        )
        self._lock = multiprocessing.get_context("fork").Lock()
        self.owner = os.getpid()
        self.token = secrets.token_hex(8)
        self._start = np.frombuffer(self._mm, np.uint8, count=1).ctypes.data  # same after fork
        self._live: dict[int, list[bool]] = {}  # slot -> its claim's "done" cell, in a worker
        self._mapped: dict[int, int] = {}  # slot -> generation this process populated
        self._mark: tuple[int, int] | None = None  # (pid, slot mark) of this process
        #: main process: frees between sweeps (0: never give pages back)
        self.sweep_every = max(32, self.slots // 2) if _MADV_REMOVE else 0
        self._frees = 0
        self._sweeping = False
        self._leasing = 0  # main process: the thread inside lease() (holding the lock)
        self._idle = np.zeros(n, dtype=np.int64)  # main process: sweeps each slot went unused
        RINGS[self.token] = self

    @staticmethod
    def find(token: str) -> BatchRing | None:
        """This process's ring of ``token`` (None: not mapped here)."""
        return RINGS.get(token)

    @property
    def usable(self) -> bool:
        """True in a process forked from the ring's creator (a DataLoader worker)."""
        return self._mm is not None and procs.my_pid() != self.owner

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
            self._touched[slot] = 1
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
        pid = procs.my_pid()  # asked twice a batch: no system call each time
        if self._mark is None or self._mark[0] != pid:
            self._mark = (pid, procs.pack(pid, procs.my_start_time()))
        return self._mark[1]

    def _reclaim_dead(self) -> None:
        """Free the slots of workers that died (under the lock).

        The flags are read once: a second read could see a slot the consumer leased meanwhile
        (-1, which as a mark is no live process's), and freeing it would hand a batch the
        training loop still holds to a worker to overwrite.
        """
        flags = np.array(self._flags)
        for mark in np.unique(flags[flags > 0]).tolist():
            if not procs.alive_packed(mark):  # a dead worker's slots: only a reclaim changes them
                self._flags[flags == mark] = 0

    def allocate(self, rows: int, part: tuple[int, int] = (0, 1)) -> dict[str, np.ndarray] | None:
        """Arrays for a batch of ``rows`` rows in a claimed slot (of ``part`` first, as in
        :meth:`claim`), or None (no slot free)."""
        if rows > self.batch_rows:
            return None
        slot = self.claim(part)
        if slot is None:
            return None
        gen = int(self._gen[slot])
        if self._mapped.get(slot) != gen:  # map the whole slot in one call, not page by page
            self._mapped[slot] = gen
            self._resident[slot] = 1
            # kernels before 5.14 refuse it (OSError): page faults then do the same
            with contextlib.suppress(OSError, ValueError):
                if _MADV_POPULATE_WRITE:
                    self._mm.madvise(
                        _MADV_POPULATE_WRITE,
                        self.header_bytes + slot * self.slot_bytes,
                        self.slot_bytes,
                    )
        raw = self._slot(slot)
        cell = [False, False]  # this claim's: (sent or freed, handed out by slot_of)
        self._live[slot] = cell
        weakref.finalize(raw, self._orphaned, slot, cell)
        return batch_views(raw, self.specs, self.offsets, rows)

    def _orphaned(self, slot: int, cell: list[bool]) -> None:
        """Every array of a claimed batch is garbage, yet it was neither sent nor freed.

        Not handed out yet (a batch gathered ahead, dropped as the reader closes): just free
        it. Handed out, then dropped unsent: worker code made a new dict of it; warn.
        """
        if cell[0]:
            return
        cell[0] = True
        if self._live.get(slot) is cell:
            del self._live[slot]
        self._flags[slot] = 0
        if not cell[1]:
            return
        self._head[0] += 1
        if not _WARNED[0]:
            _WARNED[0] = True
            try:
                warnings.warn(ORPHAN_WARNING.format(slot=slot), RuntimeWarning, stacklevel=1)
            except Warning as exc:  # an "error" filter: a finalizer cannot raise, so print it
                print(f"shardload: {exc}", file=sys.stderr)

    def sent(self, slot: int) -> int:
        """The batch in ``slot`` was handed to the consumer (which frees the slot); returns
        this worker's mark, which the slot keeps until the consumer leases it (:meth:`lease`)."""
        cell = self._live.pop(slot, None)
        if cell is not None:
            cell[0] = True
        return self._me()

    @property
    def orphaned(self) -> int:
        """Slots freed because a worker dropped their batch unsent (all processes)."""
        return int(self._head[0])

    @property
    def resident_slots(self) -> int:
        """Slots whose pages hold memory now (written to since last given back)."""
        return int(self._resident.sum())

    def slot_of(self, batch: Mapping[str, np.ndarray]) -> int | None:
        """The slot a batch from :meth:`allocate` lives in (now handed out), or None: found by
        where its first array lies, in a slot this process claimed and has not handed out. A
        batch in other memory (gathered privately when the ring was full) never is (a lookup
        by ``id()`` of earlier batches' arrays could match a reused id).
        """
        key = next(iter(self.specs))
        first = batch.get(key)
        if not isinstance(first, np.ndarray):
            return None
        at = first.__array_interface__["data"][0] - self._start - self.header_bytes
        slot, within = divmod(at, self.slot_bytes)
        if at < 0 or slot >= self.slots or within != self.offsets[key]:
            return None
        cell = self._live.get(slot)
        if cell is None or cell[0] or cell[1]:  # not a claim of this process waiting to go
            return None
        cell[1] = True
        return int(slot)

    def release_unsent(self) -> None:
        """Free the slots this worker claimed but never handed out (a closed iterator)."""
        for slot, cell in list(self._live.items()):
            if not cell[1]:
                self.free(slot)

    def free(self, slot: int) -> None:
        """Free a slot whose batch will not be sent (or was sent as a copy)."""
        cell = self._live.pop(slot, None)
        if cell is not None:
            cell[0] = True
        self._flags[slot] = 0

    # -- main side -----------------------------------------------------------------------------
    def _consumed(self, slot: int) -> None:
        """The consumer's arrays of ``slot`` are all garbage: free it; sweep now and then."""
        self._flags[slot] = 0
        if self.sweep_every:
            self._frees += 1
            # not from inside a sweep (a garbage collection there can free leased batches)
            leasing = self._leasing == threading.get_ident()
            if self._frees >= self.sweep_every and not self._sweeping and not leasing:
                self._frees = 0
                self.sweep()

    def sweep(self) -> int:
        """Give back the pages of slots unused for ``IDLE_SWEEPS`` sweeps; how many slots.

        Under the lock, so no worker claims a slot while its pages go (a worker repopulates a
        given-back slot on its next claim: the slot's generation changed).
        """
        self._sweeping = True
        try:
            return self._sweep_locked()
        finally:
            self._sweeping = False

    def _sweep_locked(self) -> int:
        released = 0
        with self._lock:
            used = (self._touched != 0) | (self._flags != 0)
            self._touched[:] = 0
            self._idle[used] = 0
            self._idle[~used] += 1
            idle = np.flatnonzero(
                (self._idle >= IDLE_SWEEPS) & (self._resident != 0) & (self._flags == 0)
            )
            for slot in idle.tolist():
                try:
                    self._mm.madvise(
                        _MADV_REMOVE, self.header_bytes + slot * self.slot_bytes, self.slot_bytes
                    )
                except (OSError, ValueError):  # not supported here: keep the pages
                    self.sweep_every = 0
                    break
                self._resident[slot] = 0
                self._gen[slot] += 1
                released += 1
        return released

    def lease(self, slot: int, rows: int, mark: int | None = None) -> dict[str, np.ndarray]:
        """The consumer's arrays of a slot's batch, in place (no copy).

        ``mark``: the sender's (:meth:`sent`); if the slot no longer holds it (its worker died
        and the slot was reclaimed), the batch is gone: raises RuntimeError rather than serve
        the rows of whatever batch the slot holds now. The slot stays taken until every
        returned array, and every view of them (tensors from ``torch.from_numpy`` included),
        is garbage; then a finalizer frees it.
        """
        me = threading.get_ident()
        self._leasing = me  # no sweep from a finalizer in this thread while it holds the lock
        try:
            # a claim's reclaim of dead workers' slots never runs meanwhile; a worker killed
            # while it held the lock (a claim takes microseconds) fails the run, not hangs it
            if not self._lock.acquire(timeout=LEASE_WAIT_S):
                raise RuntimeError(
                    f"shardload: the shared-memory ring's lock was held for {LEASE_WAIT_S:.0f} s "
                    "(a DataLoader worker killed while it claimed a slot?)"
                )
            try:
                held = int(self._flags[slot])
                if mark is None or held == mark:
                    self._flags[slot] = -1  # the consumer's now: never reclaimed
            finally:
                self._lock.release()
        finally:
            self._leasing = 0
        if mark is not None and held != mark:
            raise RuntimeError(
                f"shardload ring slot {slot} no longer holds the batch a DataLoader worker sent "
                f"in it (state {held}, expected {mark}): the worker died and the slot was "
                "reclaimed before this process took the batch"
            )
        raw = self._slot(slot)
        weakref.finalize(raw, self._consumed, slot)
        return batch_views(raw, self.specs, self.offsets, rows)

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("a BatchRing is shared by fork only")
