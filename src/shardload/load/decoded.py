"""Decode reads: a shuffle group's compressed chunks decoded straight into their batch rows.

For local Zarr shards of Blosc inner chunks (the default layout of values that compress:
``compression: auto`` or ``lz4``) when shardload's compiled kernel is built
(:class:`~shardload.formats.base.DecodesRows`, ``formats/zarr/shard_rows.py``). As the scatter
reader does for raw rows (:mod:`.scatter`), each row of a group has a known place in the
worker's stream of batches, so the group's batches are allocated first and each inner chunk,
decoded into a small buffer that stays in the CPU's cache, has its rows copied to their
places: no group buffer and no gather pass. Reading into a 67 MB group buffer and gathering out
of it wrote every decoded byte to memory twice and read it back once more (docs/design.md,
"Compressed shards decoded into their batches"). The same by URL
(``formats/zarr/url_rows.py``): chunks decoded from each shard's checked bytes into their rows,
one task per array and group.

Planning a group (its batches, their index rows, each row's address) runs in the ``plan``
lane, its decodes in ``threads`` reader threads (``read``), each a contiguous share of the
group's rows sorted by row, so a task meets each inner chunk, and mostly each shard, once.

Memory: the batches of the group being yielded and of the groups read ahead (``prefetch``, in
chunks, rounded up to whole groups), as the scatter reader holds; the group buffers of the
gather reader are not taken.
"""

from __future__ import annotations

import ctypes
import itertools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, cast

import numpy as np

from shardload.errors import ChunkReadError, ShardloadError
from shardload.formats.base import DecodesRows
from shardload.load.checks import check_indices
from shardload.load.loop import Batch, Flight, GroupReader, read_loop
from shardload.load.pool import ReadPool
from shardload.load.recycle import Allocate
from shardload.load.scatter import groups_in_flight
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import group_batches, iter_worker_spans
from shardload.plan.spans import Spans, spans_rows
from shardload.store.core import Store


def decoded_sources(store: Store, names: Sequence[str]) -> bool:
    """True when every array in ``names`` of a store (local, or by URL) is decoded into place
    by its reader (:class:`~shardload.formats.base.DecodesRows`); the store's layout and this
    install only (whether the compiled kernel is built), never the order: every reader yields
    the same batches."""
    reader = store.reader
    if not names or not isinstance(reader, DecodesRows):
        return False
    try:
        return all(reader.decoded_rows(n) for n in names)
    except Exception:  # e.g. an unreadable zarr.json: the gather path reports it, naming it
        return False


def plan_task_cuts(chunks: np.ndarray, tasks: int) -> list[int]:
    """Where a group's rows (sorted by row; ``chunks``: the chunk of each) are cut into up to
    ``tasks`` contiguous shares of about equal rows, each cut moved to the next chunk's first
    row so that no chunk is decoded by two tasks (pure).

    >>> plan_task_cuts(np.array([0, 0, 0, 1, 1, 2, 2, 2]), 2)
    [0, 5, 8]
    >>> plan_task_cuts(np.array([3, 3, 3]), 4)
    [0, 3]
    """
    n = len(chunks)
    firsts = np.flatnonzero(np.r_[True, chunks[1:] != chunks[:-1]])
    want = [n * i // max(1, tasks) for i in range(1, max(1, tasks))]
    at = firsts[np.minimum(np.searchsorted(firsts, want, "left"), len(firsts) - 1)]
    cuts = sorted({0, n, *(int(a) for a in at if a > 0)})
    return cuts


class DecodeReader(GroupReader):
    """Inner chunks decoded straight into their batches, ``index`` filled with the global rows.

    Groups are planned whole, the current one and ``ceil(prefetch / shuffle_chunks)`` ahead,
    as :class:`~shardload.load.scatter.ScatterReader` plans them; batches come from
    ``allocate(n)`` (or ``new_batch(n)`` when it gives None)."""

    cover = True

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
        new_batch: Callable[[int], Batch],
        index_key: str,
        allocate: Allocate | None = None,
    ) -> None:
        super().__init__(plan, rank, worker)
        self.store, self.names, self.index_key = store, names, index_key
        self.new_batch, self.allocate = new_batch, allocate
        self.readers = max(1, threads)
        # by URL one task per array and group, as the gather reader's call: it keeps its own
        # requests in flight (formats/zarr/shard_fetch.py), its threads mostly waiting
        self.tasks = self.readers if store.is_local else 1
        self.lanes = {"plan": 1, "read": self.readers}
        self.ahead = groups_in_flight(prefetch=prefetch, shuffle_chunks=plan.shuffle_chunks) - 1
        arrays = store.manifest.arrays
        self.bounds = store.manifest.bounds  # made once per store (read-only)
        self.batches: dict[int, Batch] = {}  # written by the plan lane, popped by the loop
        self.row_bytes = {
            a: int(np.prod(arrays[a].row_shape, dtype=np.int64))
            * np.dtype(arrays[a].dtype).itemsize
            for a in names
        }

    def units(self) -> Iterator[Any]:
        return iter_worker_spans(self.plan, self.rank, self.worker)

    def start(self, unit: Any, at: int, n: int, pool: ReadPool) -> Flight:
        return Flight(at, n, futures=[pool.submit("plan", self._plan_group, *unit, at, n, pool)])

    def wait(self, flight: Flight) -> None:
        for f in flight.futures[0].result():
            f.result()  # re-raises a plan or read error here, in the consuming thread

    def finish(self, k: int, size: int) -> tuple[Batch, list[Future[Any]]]:
        return self.batches.pop(k), []

    def _batch(self, k: int) -> Batch:  # plan lane only
        if k not in self.batches:
            b, total = self.plan.batch_size, self.plan.workers[self.rank][self.worker].num_rows
            size = min(b, total - k * b)
            self.batches[k] = (self.allocate(size) if self.allocate else None) or self.new_batch(
                size
            )
        return self.batches[k]

    def _plan_group(
        self, spans: Spans, order: np.ndarray, at: int, n: int, pool: ReadPool
    ) -> list[Future[None]]:
        """Plan lane: allocate the group's batches, fill their index, submit its decodes (all
        of it vectorised over the group's rows)."""
        if n <= 0:
            return []
        b = self.plan.batch_size
        want = order[:n]
        where = f"worker {self.worker} of rank {self.rank}: a group's order"
        check_indices(want, int(spans.cum[-1]) if len(spans) else 0, where)
        rows = spans_rows(spans)[want]  # global rows, in stream order
        cut = group_batches(at, n, b)
        k0 = int(cut[0, 0])
        outs = [self._batch(int(k)) for k in cut[:, 0]]
        for (_, dst, src, cnt), out in zip(cut.tolist(), outs, strict=True):
            out[self.index_key][dst : dst + cnt] = rows[src : src + cnt]
        srt = np.argsort(rows, kind="stable")
        rows = rows[srt]
        k_of, in_b = np.divmod(at + srt, b)  # each sorted row's batch and place in it
        k_of -= k0
        cuts = plan_task_cuts(np.searchsorted(self.bounds, rows, "right"), self.tasks)
        futs: list[Future[None]] = []
        for a in self.names:
            # .ctypes.data costs 4 us a call, __array_interface__ 3 (about 45 batches a group)
            bases = np.array([o[a].__array_interface__["data"][0] for o in outs], np.int64)
            to = (bases[k_of] + in_b * self.row_bytes[a]).astype(np.uint64)
            for p0, p1 in itertools.pairwise(cuts):
                task = (self.store, a, rows[p0:p1], to[p0:p1], self.row_bytes[a])
                futs.append(pool.submit("read", _decode, *task))
        return futs


def repeated_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Of sorted ``rows``, the places holding a row already met (``mode="pad"`` repeats rows
    to give every rank equal batches, possibly in one group) and, for each, the place of that
    row's first copy (pure).

    >>> repeated_rows(np.array([3, 5, 5, 5, 8, 8]))
    (array([2, 3, 5]), array([1, 1, 4]))
    """
    again = np.flatnonzero(rows[1:] == rows[:-1]) + 1
    return again, np.searchsorted(rows, rows[again], "left")


def _decode(store: Store, name: str, rows: np.ndarray, to: np.ndarray, row_bytes: int) -> None:
    """One read task: rows of ``name`` to their addresses, errors naming the array. A row
    wanted at several places (padding) is decoded once, then copied to its other places: the
    readers take each row once (a row met twice in a chunk kept one address, leaving the other
    batch row unwritten: recycled batch memory served as values)."""
    again, first = repeated_rows(rows)
    try:
        if len(again):
            once = np.ones(len(rows), bool)
            once[again] = False
            cast(DecodesRows, store.reader).decode_rows_into(name, rows[once], to[once])
            for src, dst in zip(to[first].tolist(), to[again].tolist(), strict=True):
                ctypes.memmove(dst, src, row_bytes)
        else:
            cast(DecodesRows, store.reader).decode_rows_into(name, rows, to)
    except ShardloadError:
        raise
    except Exception as exc:
        raise ChunkReadError(
            f"rows {int(rows[0])}..{int(rows[-1])} of array {name!r} in {store.url} could not "
            f"be read: {type(exc).__name__}: {exc}"
        ) from exc


def decode_batches(
    store: Store,
    names: Sequence[str],
    plan: EpochPlan,
    rank: int,
    worker: int,
    *,
    prefetch: int,
    threads: int,
    new_batch: Callable[[int], Batch],
    index_key: str,
    allocate: Allocate | None = None,
) -> Iterator[Batch]:
    """The worker's batches, in plan order, read by a :class:`DecodeReader` (see there)."""
    reader = DecodeReader(
        store,
        names,
        plan,
        rank,
        worker,
        prefetch=prefetch,
        threads=threads,
        new_batch=new_batch,
        index_key=index_key,
        allocate=allocate,
    )
    return read_loop(reader)
