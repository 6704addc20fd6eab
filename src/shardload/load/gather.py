"""The gather reader: shuffle groups read into group buffers, batches gathered out of them.

For stores whose chunks must be read whole (compressed Zarr, HDF5, URLs): a group's segments
are read into page-aligned group buffers (:mod:`.reader`) in the ``read`` lane, the current
group whole and up to ``prefetch`` segments of the groups after it (so a worker holds about
``shuffle_chunks + prefetch`` chunks); each batch is then one ``np.take`` per array out of the
group buffers (two when a batch straddles groups), in the ``take`` lane or, for small pieces,
in the consuming thread, into the batch memory the caller allocates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from shardload.load.checks import check_indices
from shardload.load.loop import Batch, Flight, GroupReader, read_loop
from shardload.load.options import gather_threads
from shardload.load.pool import ReadPool
from shardload.load.reader import BufferPool, Group, new_group, submit_segments
from shardload.load.recycle import INDEX_KEY, Allocate, new_batch, store_kept
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import iter_worker_spans
from shardload.store.core import Store

#: Batch pieces smaller than this are gathered in the calling thread (no thread hop).
INLINE_GATHER_BYTES = 256 * 1024


def _gather(g: Group, sel: np.ndarray, at: int, names: Sequence[str], out: dict) -> None:
    for a in names:
        np.take(g.bufs[a], sel, axis=0, out=out[a][at : at + len(sel)], mode="clip")
    np.take(g.rows, sel, out=out[INDEX_KEY][at : at + len(sel)], mode="clip")


class GatherReader(GroupReader):
    """Groups into buffers, batches gathered out of them.

    The gathers run in ``threads`` threads, at most this process's CPUs
    (:func:`~shardload.load.options.gather_threads`; numpy releases the GIL in ``take``), up
    to as many batches + 1 ahead of the one yielded; batches come in plan order, so the result
    does not depend on the thread count. A group's gathers are waited for and its buffers go
    back to the buffer pool before the next group is placed (a worker holds two groups'
    buffers, not three)."""

    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        plan: EpochPlan,
        rank: int,
        worker: int,
        *,
        prefetch: int,
        threads: int,
        allocate: Allocate,
    ) -> None:
        super().__init__(plan, rank, worker)
        self.store, self.names, self.prefetch, self.allocate = store, names, prefetch, allocate
        gathers = gather_threads(threads)  # (a store by URL: 32 read threads, not gathers)
        self.lanes = {"read": threads, "take": gathers}
        self.detach = ("read",)  # reads write group buffers only: a close need not wait
        self.lag = gathers + 1
        self.specs: dict[str, Any] = {a: store.manifest.arrays[a] for a in names}
        self.row_bytes = sum(s.row_bytes for s in self.specs.values()) + 8
        self.read_bytes = max(1, self.row_bytes - 8)
        # group buffers outlive the iterator: the next epoch's groups reuse pages already in
        # (two 67 MB buffers of the 406 MB default store, zeroed by the kernel each epoch before)
        self.buffers = store_kept(store, ("group buffers", *names), lambda: BufferPool(keep=2))
        self.pending: dict[int, tuple[list[Future[None]], Batch]] = {}
        self.mine: list[Future[None]] = []  # gathers reading the group being placed

    def units(self) -> Iterator[Any]:
        return iter_worker_spans(self.plan, self.rank, self.worker)

    def start(self, unit: Any, at: int, n: int, pool: ReadPool) -> Flight:
        spans, order = unit
        g = new_group(self.store, self.names, spans, order, self.buffers)
        where = f"worker {self.worker} of rank {self.rank}: a group's order"
        check_indices(g.order, len(g.rows), where)
        self.pool = pool
        return Flight(at, n, futures=g.futures, data=g, segments=g.segments)

    def _submit(self, fl: Flight, most: int, pool: ReadPool) -> int:
        got = submit_segments(
            lambda *a: pool.submit("read", *a),
            self.store,
            self.names,
            fl.data,
            most,
            self.read_bytes,
            threads=self.lanes["read"],
        )
        fl.submitted = fl.data.submitted
        return got

    def schedule(
        self,
        current: Flight,
        others: deque[Flight],
        start_next: Callable[[], Flight | None],
        pool: ReadPool,
    ) -> None:
        """The current group whole, and up to ``prefetch`` segments of the groups after it."""
        while current.submitted < current.segments:
            self._submit(current, current.segments, pool)
        budget = self.prefetch - sum(g.submitted for g in others)
        j = 0
        while budget > 0:
            if j == len(others):
                fl = start_next()
                if fl is None:
                    break
                others.append(fl)
            g = others[j]
            if g.submitted == g.segments:
                j += 1
                continue
            budget -= self._submit(g, budget, pool)

    def place(self, flight: Flight, k: int, dst: int, src: int, take: int) -> None:
        g: Group = flight.data
        if k not in self.pending:
            size = min(self.plan.batch_size, self._total() - k * self.plan.batch_size)
            self.pending[k] = ([], self.allocate(size) or new_batch(self.specs, size))
        futs, out = self.pending[k]
        sel = g.order[src : src + take]
        if take * self.row_bytes < INLINE_GATHER_BYTES:  # a thread hop costs more than this
            _gather(g, sel, dst, self.names, out)
        else:
            f = self.pool.submit("take", _gather, g, sel, dst, self.names, out)
            futs.append(f)
            self.mine.append(f)

    def _total(self) -> int:
        return self.plan.workers[self.rank][self.worker].num_rows

    def finish(self, k: int, size: int) -> tuple[Batch, list[Future[Any]]]:
        futs, out = self.pending.pop(k)
        return out, list(futs)

    def release(self, flight: Flight) -> None:
        mine, self.mine = self.mine, []
        for f in mine:
            f.result()
        flight.data.release(self.buffers)


def gather_batches(
    store: Store,
    names: Sequence[str],
    plan: EpochPlan,
    rank: int,
    worker: int,
    *,
    prefetch: int,
    threads: int,
    allocate: Allocate,
) -> Iterator[Batch]:
    """The worker's batches, read by a :class:`GatherReader` (see there)."""
    reader = GatherReader(
        store, names, plan, rank, worker, prefetch=prefetch, threads=threads, allocate=allocate
    )
    return read_loop(reader)
