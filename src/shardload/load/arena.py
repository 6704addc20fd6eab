"""Group buffers in shared memory that outlive DataLoader workers: a :class:`GroupArena`.

A gather reader decodes each shuffle group into a group buffer (:mod:`.reader`) and holds two
of them (the current group and the one read ahead). In a worker process those are fresh pages,
which the kernel zeroes on first touch: two 67 MB buffers per worker of the default store, 0.3
CPU s of system time in an epoch of 2 workers on the 2-core VM (2026-11-28). Workers that do
not persist (torch's ``DataLoader`` default, a new loader over the same dataset) paid that
again every epoch. Here the main process maps one anonymous shared region *before* the workers
fork (``MAP_SHARED | MAP_NORESERVE``: virtual only, a page costs memory once touched), cut into
``regions`` regions of ``slots`` buffers each. A worker claims a free region (or one whose
owner died) for its lifetime and takes its group buffers there, so the next workers find pages
already in. A buffer goes back to its region when the last view of it is garbage (a read still
writing into a dropped group keeps it out), and a group larger than a slot, or a worker that
finds no region free, takes private memory as before (:class:`~.reader.BufferPool`).

Memory: pages a worker touched stay resident with the dataset (at most ``regions * slots``
slots, as persistent workers hold their buffers) instead of being freed with each worker.
Spawned workers (the dataset is pickled) use private buffers.
"""

from __future__ import annotations

import contextlib
import mmap
import multiprocessing
import os
import sys
import threading
import weakref
from collections.abc import Sequence

import numpy as np

from shardload.load.decoded import decoded_sources
from shardload.load.reader import BufferPool
from shardload.load.recycle import store_kept
from shardload.load.spec import LoadSpec
from shardload.store.core import Store
from shardload.util import procs

_PAGE = mmap.PAGESIZE
_MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000 if sys.platform.startswith("linux") else 0)
#: madvise(MADV_POPULATE_WRITE) (Linux 5.14+): map a buffer's pages in one call.
_MADV_POPULATE_WRITE = 23 if sys.platform.startswith("linux") else 0
#: Group buffers per array a gather reader holds (the current group and the one read ahead).
KEEP = 2
#: Most address space an arena reserves (virtual, ``MAP_NORESERVE``).
MAX_ARENA_BYTES = 64 << 30


def _round_up(n: int, to: int) -> int:
    return -(-n // to) * to


class GroupArena:
    """``regions`` regions of ``slots`` shared buffers of ``slot_bytes`` each (see the module).

    Create it in the main process before the DataLoader starts its workers (fork); it does not
    survive pickling (:attr:`usable` is then false).
    """

    def __init__(self, slot_bytes: int, *, regions: int, slots: int) -> None:
        self.slot_bytes = _round_up(max(1, int(slot_bytes)), _PAGE)
        self.regions, self.slots = int(regions), int(slots)
        self.header_bytes = _round_up(8 * self.regions, _PAGE)
        size = self.header_bytes + self.regions * self.slots * self.slot_bytes
        self._mm: mmap.mmap | None = mmap.mmap(-1, size, flags=mmap.MAP_SHARED | _MAP_NORESERVE)
        #: per region: 0 free, else the packed pid and start time of the worker holding it
        self._owners = np.frombuffer(self._mm, np.int64, count=self.regions)
        self._lock = multiprocessing.get_context("fork").Lock()
        self.owner = os.getpid()
        self._pid = 0  # the process whose region and free slots the fields below are
        self._region: int | None = None
        self._free: list[int] = []
        self._mapped: dict[int, int] = {}  # slot -> bytes this process has mapped
        self._local = threading.Lock()

    @property
    def usable(self) -> bool:
        """True in a process forked from the arena's creator (a DataLoader worker)."""
        return self._mm is not None and os.getpid() != self.owner

    def __getstate__(self) -> dict[str, object]:
        return {**self.__dict__, "_mm": None, "_owners": None, "_lock": None, "_local": None}

    def _claim(self) -> int | None:
        """This process's region (claimed on first use: a free one, or a dead worker's)."""
        pid = os.getpid()
        if self._pid == pid:
            return self._region
        self._pid, self._region, self._free, self._mapped = pid, None, [], {}
        self._local = threading.Lock()
        me = procs.pack(pid, procs.my_start_time())
        with self._lock:
            for r in range(self.regions):
                held = int(self._owners[r])
                if held == 0 or not procs.alive_packed(held):
                    self._owners[r] = me
                    self._region, self._free = r, list(range(self.slots))
                    break
        return self._region

    def take(self, nbytes: int) -> np.ndarray | None:
        """A page-aligned buffer of ``nbytes`` bytes in this worker's region, or None (not a
        worker, no region free, every slot in use, or larger than a slot)."""
        if not self.usable or nbytes > self.slot_bytes or self._claim() is None:
            return None
        with self._local:
            if not self._free:
                return None
            slot = self._free.pop(0)
        assert self._mm is not None and self._region is not None
        at = self.header_bytes + (self._region * self.slots + slot) * self.slot_bytes
        buf = np.frombuffer(self._mm, np.uint8, count=self.slot_bytes, offset=at)
        if self._mapped.get(slot, 0) < nbytes:  # map its pages in one call, once per process
            self._mapped[slot] = nbytes  # (an earlier worker's pages: mapped, not zeroed)
            with contextlib.suppress(OSError, ValueError):
                if _MADV_POPULATE_WRITE:
                    self._mm.madvise(_MADV_POPULATE_WRITE, at, _round_up(nbytes, _PAGE))
        weakref.finalize(buf, self._give_back, os.getpid(), slot)
        return buf[:nbytes]

    def _give_back(self, pid: int, slot: int) -> None:
        if pid == self._pid:
            with self._local:
                self._free.append(slot)


class ArenaPool(BufferPool):
    """A :class:`~.reader.BufferPool` whose buffers come from a :class:`GroupArena` when it can
    (private memory otherwise); an arena buffer goes back when it is garbage."""

    def __init__(self, arena: GroupArena) -> None:
        super().__init__(keep=KEEP)
        self.arena = arena

    def take(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        buf = self.arena.take(nbytes)
        if buf is None:
            return super().take(name, shape, dtype)
        return buf.view(dtype).reshape(shape)

    def give(self, name: str, arr: np.ndarray) -> None:
        base = arr
        while isinstance(base.base, np.ndarray):
            base = base.base
        owner = base.base
        if not (isinstance(owner, memoryview) and owner.obj is self.arena._mm):
            super().give(name, arr)  # private memory: kept as before


def plan_group_arena(
    *, group_bytes: Sequence[int], workers: int, keep: int = KEEP
) -> tuple[int, int, int]:
    """``(slot_bytes, regions, slots)`` of an arena for ``workers`` workers that each hold
    ``keep`` group buffers of every array (``group_bytes``: an array's bytes in the largest
    group), pure.

    >>> plan_group_arena(group_bytes=[67_108_864, 2_097_152], workers=2)
    (67108864, 2, 4)
    """
    return max(group_bytes, default=1), max(1, int(workers)), keep * max(1, len(group_bytes))


def group_arena(spec: LoadSpec, *, workers: int) -> GroupArena | None:
    """An arena for the group buffers of ``spec``'s gather reads by up to ``workers`` forked
    workers at once, or None (other read kinds, and compressed shards decoded into their
    batches, :mod:`.decoded`; more than ``MAX_ARENA_BYTES``; no address space for it)."""
    sizes = spec.selection.sizes
    if spec.kind != "gather" or not len(sizes):
        return None
    if decoded_sources(spec.store, spec.selection.arrays):  # no group buffers to keep
        return None
    rows = int(sizes.max()) * int(spec.options["shuffle_chunks"])  # the largest group
    arrays = spec.store.manifest.arrays
    group_bytes = [rows * arrays[a].row_bytes for a in spec.selection.arrays]
    slot, regions, slots = plan_group_arena(group_bytes=group_bytes, workers=workers)
    if slot * regions * slots > MAX_ARENA_BYTES:
        return None
    try:
        return GroupArena(slot, regions=regions, slots=slots)
    except OSError:  # no address space for it (strict overcommit): private buffers
        return None


def serve_group_buffers(arena: GroupArena | None, store: Store, names: Sequence[str]) -> None:
    """Make ``arena`` the group buffers of ``store``'s gather reads of ``names`` in this
    process (a DataLoader worker), unless it has group buffers of its own already (or
    ``arena`` is None or not usable: private buffers)."""
    if arena is None or not arena.usable:
        return
    store_kept(store, ("group buffers", *names), lambda: ArenaPool(arena))
