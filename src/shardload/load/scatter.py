"""Scatter reads: a shuffle group's rows go from the page cache straight to their batch rows.

For uncompressed local chunk files (:class:`~shardload.formats.base.RawChunk`: shardload's
Zarr arrays without compression, npy stacks, and the raw inner chunks of Zarr shards, each at
its offset in its shard file, :class:`~shardload.formats.base.RawShard`), a shuffle needs no
gather. Each row of a group
has a known place in the worker's stream of batches (its position in the group's ``order``),
so the batches of a group are allocated first and the file's rows are copied into their
places: one copy from the page cache, where reading into a group buffer and gathering out of
it costs two, and no group buffer at all.

A group is planned with numpy as a whole (it may hold thousands of small pieces, or single
rows with ``shuffle="uniform"``): its rows sorted by (chunk, file row), cut into runs of
consecutive file rows, one ``preadv`` per run (at most 1,024 iovecs a call), destinations
that follow each other merged into one iovec. ``preadv`` runs through ctypes, which releases
the GIL, in the reader threads; each chunk or shard file is opened once an epoch
(:class:`.files.OpenChunks`: a shard's inner chunks share its descriptor).

A store larger than the memory that could cache it (:func:`read_past_cache`) has its small
reads (the single rows of ``shuffle="uniform"``) read with ``O_DIRECT`` through io_uring
(:meth:`.uring.Ring.read_direct`): aligned blocks into bounce slots, the row copied out,
past the page cache.

Memory: the batches of the group being yielded and of the groups read ahead (``prefetch``, in
chunks, rounded up to whole groups), which is what the batches would cost anyway; with
``O_DIRECT`` reads, at most ``DIRECT_BOUNCE_BYTES`` of bounce slots per reader thread.
"""

from __future__ import annotations

import itertools
import math
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from shardload.formats.base import RawChunk, RawChunks, RawShards
from shardload.load.checks import check_indices
from shardload.load.files import OpenChunks, read_past_cache
from shardload.load.loop import Batch, Flight, GroupReader, read_loop
from shardload.load.pool import ReadPool
from shardload.load.recycle import Allocate
from shardload.load.runs import _preadv, plan_iovecs, read_runs
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import group_batches, iter_worker_spans
from shardload.plan.spans import Spans, spans_chunks, spans_rows
from shardload.store.core import Store

#: With direct reads, one reader task per group (not one per reader thread).
DIRECT_ONE_TASK = True


def raw_rows(store: Store, names: Sequence[str]) -> bool:
    """True when every array in ``names`` is stored as raw rows in local files (uncompressed
    shardload Zarr, local npy stacks): reading part of a chunk costs no more per row than the
    whole chunk. Depends on the store only (never on the platform), so every rank agrees."""
    reader = store.reader
    if not isinstance(reader, RawChunks) or not names:
        return False
    try:
        return all(reader.raw_chunk(n, 0) is not None for n in names)
    except Exception:  # e.g. a missing first chunk: the gather path reports it, naming it
        return False


def raw_sources(store: Store, names: Sequence[str]) -> Callable[[str, int], RawChunk] | None:
    """``raw(name, chunk)`` when every array in ``names`` is raw rows in local files (or in a
    node cache's copies of an npy stack: ``formats/npy/cached.py``) and this platform has
    ``preadv``; else None (the loader reads into group buffers and gathers)."""
    reader = store.reader
    if _preadv() is None:
        return None
    cached = getattr(reader, "cached_raw_chunk", None)  # a node cache's copies (no I/O here)
    if callable(cached) and names and all(cached(n, 0) is not None for n in names):
        return lambda name, chunk: cached(name, chunk)
    shards = raw_shards(store, names)
    if shards is not None:  # Zarr shards of raw inner chunks: an inner chunk at its offset
        assert isinstance(reader, RawShards)

        def inner(name: str, chunk: int) -> RawChunk:
            k, j = divmod(chunk, shards[name])
            shard = reader.raw_shard(name, k)
            return RawChunk(shard.path, int(shard.offsets[j]), shard.row_bytes, shard=shard)

        return inner
    if not raw_rows(store, names):
        return None
    assert isinstance(reader, RawChunks)

    def raw(name: str, chunk: int) -> RawChunk:
        got = reader.raw_chunk(name, chunk)
        assert got is not None
        return got

    return raw


def raw_shards(store: Store, names: Sequence[str]) -> dict[str, int] | None:
    """Inner chunks per shard of each of ``names`` when every one is a Zarr array of raw inner
    chunks in local shard files (``compression: auto`` or ``none`` in the default layout),
    else None. The store's layout only (no I/O)."""
    reader = store.reader
    if not isinstance(reader, RawShards) or not names:
        return None
    try:
        per = {n: reader.raw_shard_chunks(n) for n in names}
    except Exception:  # e.g. an unreadable zarr.json: the gather path reports it, naming it
        return None
    return None if None in per.values() else {n: int(v or 0) for n, v in per.items()}


def _cpus() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def plan_group_reads(
    chunks: np.ndarray, file_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort a group's wanted rows by (chunk, file row) and cut them into *runs* of consecutive
    file rows of one chunk, each read by one ``preadv`` (pure).

    Returns ``(order, run_starts, run_chunk)``: ``order`` sorts the rows; run ``r`` is the
    sorted rows ``run_starts[r]:run_starts[r + 1]`` (``run_starts`` ends with the row count).

    >>> o, s, c = plan_group_reads(np.array([1, 0, 1, 0, 1]), np.array([5, 9, 4, 8, 7]))
    >>> o.tolist(), s.tolist(), c.tolist()
    ([3, 1, 2, 0, 4], [0, 2, 4, 5], [0, 1, 1])
    """
    if len(file_rows) and int(file_rows.max()) < 1 << 32:  # one int64 key: 1/4 of lexsort
        order = np.argsort((chunks.astype(np.int64) << 32) | file_rows.astype(np.int64))
    else:
        order = np.lexsort((file_rows, chunks))
    c, r = chunks[order], file_rows[order]
    brk = np.ones(len(order), bool)
    brk[1:] = (c[1:] != c[:-1]) | (r[1:] != r[:-1] + 1)
    starts = np.flatnonzero(brk)
    return order, np.append(starts, len(order)), c[starts]


def plan_span_reads(
    spans: Spans, want: np.ndarray, bounds: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """:func:`plan_group_reads` of a group's rows ``want`` (indices into the rows of ``spans``,
    in stream order; each at most once) by sorting its *segments* (a few hundred) instead of
    its rows (thousands): a segment of a range is consecutive file rows of one chunk, and the
    segments of a chunk never overlap, so the rows sorted by (chunk, file row) are the segments
    sorted by (chunk, first file row), each expanded (pure; ``bounds``: the chunks' first global
    rows). Explicit-row segments (a resumed group) are sorted by row.

    Returns ``(order, run_starts, run_chunk, file_rows)``, ``file_rows`` in sorted order.

    >>> from shardload.plan.spans import Spans
    >>> sp = Spans(*(np.array(v) for v in ([1, 0, 1], [14, 0, 10], [0, 8, 0], [2, 10, 1], [-1] * 3)))
    >>> o, s, c, r = plan_span_reads(sp, np.array([4, 0, 2, 3, 1]), np.array([0, 10, 20]))
    >>> o.tolist(), s.tolist(), c.tolist(), r.tolist()
    ([2, 3, 0, 1, 4], [0, 2, 3, 5], [0, 1, 1], [8, 9, 0, 4, 5])
    """
    if len(spans) == 0 or (spans.ex >= 0).any():
        rows = spans_rows(spans)[want]
        chunks = spans_chunks(spans)[want]
        order, run_starts, run_chunk = plan_group_reads(chunks, rows - bounds[chunks])
        return order, run_starts, run_chunk, (rows - bounds[chunks])[order]
    fr0 = spans.base + spans.lo - bounds[spans.chunk]  # each segment's first file row
    if int(fr0.max()) < 1 << 32:
        seg = np.argsort((spans.chunk.astype(np.int64) << 32) | fr0)
    else:
        seg = np.lexsort((fr0, spans.chunk))
    lens = (spans.hi - spans.lo)[seg]
    total = int(spans.cum[-1])
    step = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)
    inv = np.full(total, -1, np.int64)
    inv[want] = np.arange(len(want), dtype=np.int64)
    order = inv[np.repeat(spans.cum[:-1][seg], lens) + step]  # the stream index of each row
    r = np.repeat(fr0[seg], lens) + step
    c = np.repeat(spans.chunk[seg], lens)
    if len(want) < total:  # rows left out (a resume, or the epoch's end)
        keep = order >= 0
        order, r, c = order[keep], r[keep], c[keep]
    brk = np.ones(len(order), bool)
    brk[1:] = (c[1:] != c[:-1]) | (r[1:] != r[:-1] + 1)
    starts = np.flatnonzero(brk)
    return order, np.append(starts, len(order)), c[starts], r


def groups_in_flight(*, prefetch: int, shuffle_chunks: int) -> int:
    """Shuffle groups a scatter reader fills at once: the current one and
    ``ceil(prefetch / shuffle_chunks)`` ahead (pure).

    >>> groups_in_flight(prefetch=4, shuffle_chunks=4), groups_in_flight(prefetch=0, shuffle_chunks=4)
    (2, 1)
    """
    return 1 + math.ceil(prefetch / max(1, shuffle_chunks))


def batches_per_group(*, chunk_rows: int, shuffle_chunks: int, batch_size: int) -> int:
    """Most batches one shuffle group's rows touch (one more when a batch straddles groups)."""
    return -(-max(1, shuffle_chunks) * chunk_rows // max(1, batch_size)) + 1


class ScatterReader(GroupReader):
    """Rows read straight into their batches, ``index`` filled with the global rows.

    Groups are planned whole: the current one and ``ceil(prefetch / shuffle_chunks)`` ahead
    (more while a batch still straddles unread groups). Planning a group (allocating its
    batches, writing their index rows, cutting the iovecs) takes a few ms, so it runs in the
    ``plan`` lane (one thread), off the path of the batch being yielded; it hands the group's
    reads to ``threads`` reader threads (the ``read`` lane). A batch is yielded once every
    group holding some of its rows is read. Batches come from ``allocate(n)`` (or
    ``new_batch(n)`` when it gives None).
    """

    cover = True

    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        plan: EpochPlan,
        rank: int,
        worker: int,
        *,
        raw: Callable[[str, int], RawChunk],
        prefetch: int,
        threads: int,
        new_batch: Callable[[int], Batch],
        index_key: str,
        allocate: Allocate | None = None,
    ) -> None:
        super().__init__(plan, rank, worker)
        self.store, self.names, self.raw, self.index_key = store, names, raw, index_key
        self.new_batch, self.allocate = new_batch, allocate
        self.readers = max(1, threads)
        self.lanes = {"plan": 1, "read": self.readers}
        # a group's read tasks per array: one per reader thread, but for a node cache's copies
        # of a store by URL (its threads, URL_IN_FLIGHT, are for fills) one per CPU
        self.tasks = self.readers if store.is_local else min(self.readers, _cpus())
        self.ahead = groups_in_flight(prefetch=prefetch, shuffle_chunks=plan.shuffle_chunks) - 1
        arrays = store.manifest.arrays
        store_bytes = sum(arrays[a].row_bytes * int(store.manifest.chunk_bounds[-1]) for a in names)
        # a shard's inner chunks share its descriptor; read through the page cache (their
        # O_DIRECT reads would open each inner chunk's file as its own)
        shards = raw_shards(store, names) or {}
        direct = not shards and read_past_cache(store_bytes)
        self.files = OpenChunks(direct=direct, per_file=shards)  # closed in close()
        self.bounds = store.manifest.bounds
        self.batches: dict[int, Batch] = {}  # written by the plan lane, popped by the loop
        self.raws: dict[str, dict[int, RawChunk]] = {a: {} for a in names}  # plan lane only
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

    def close(self) -> None:
        self.files.close()

    def _batch(self, k: int) -> Batch:  # plan lane only
        if k not in self.batches:
            b, total = self.plan.batch_size, self.plan.workers[self.rank][self.worker].num_rows
            size = min(b, total - k * b)
            self.batches[k] = (self.allocate(size) if self.allocate else None) or self.new_batch(
                size
            )
        return self.batches[k]

    def _raw_of(self, a: str) -> Callable[[int], RawChunk]:
        cache, raw = self.raws[a], self.raw

        def get(chunk: int) -> RawChunk:
            rc = cache.get(chunk)
            if rc is None:
                rc = cache[chunk] = raw(a, chunk)
            return rc

        return get

    def _plan_group(
        self, spans: Spans, order: np.ndarray, at: int, n: int, pool: ReadPool
    ) -> list[Future[None]]:
        """Plan lane: allocate the group's batches, fill their index, submit its reads (all of
        it vectorised over the group's rows: a group may hold thousands of pieces)."""
        if n <= 0:
            return []
        b, bounds = self.plan.batch_size, self.bounds
        want = order[:n]
        where = f"worker {self.worker} of rank {self.rank}: a group's order"
        check_indices(want, int(spans.cum[-1]) if len(spans) else 0, where)
        rows = spans_rows(spans)[want]  # global rows, in stream order
        cut = group_batches(at, n, b)
        k0 = int(cut[0, 0])
        outs = [self._batch(int(k)) for k in cut[:, 0]]
        for (_, dst, src, cnt), out in zip(cut.tolist(), outs, strict=True):
            out[self.index_key][dst : dst + cnt] = rows[src : src + cnt]
        srt, run_starts, run_chunk, file_rows = plan_span_reads(spans, want, bounds)
        run_row = file_rows[run_starts[:-1]]
        # the file rows each run's chunk must hold: runs are sorted by (chunk, row), so the
        # end of a chunk's last run, spread over its runs
        last = np.flatnonzero(np.append(run_chunk[1:] != run_chunk[:-1], True))
        chunk_end = np.repeat(file_rows[run_starts[last + 1] - 1] + 1, np.diff(last, prepend=-1))
        k_of, in_b = np.divmod(at + srt, b)  # each sorted row's batch and place in it
        k_of -= k0
        futs: list[Future[None]] = []
        nruns = len(run_chunk)
        # direct reads wait on the device, not the CPU: one reader thread takes the whole
        # group, so its ring stays full for longer between the drains at a task's end (the
        # next group goes to another reader meanwhile): 1.12x the rows/s of one task per
        # reader thread, peak RSS 177 against 145 MiB (docs/benchmarks.md, session 10)
        one_task = self.files.direct and DIRECT_ONE_TASK
        tasks = 1 if one_task else self.tasks
        parts = [nruns * i // tasks for i in range(tasks + 1)]
        for a in self.names:
            # .ctypes.data costs 4 us a call, __array_interface__ 3 (14 batches a group)
            bases = np.array([o[a].__array_interface__["data"][0] for o in outs], np.int64)
            rb = self.row_bytes[a]
            ptrs = (bases[k_of] + in_b * rb).astype(np.uint64)
            iov, run_iov = plan_iovecs(ptrs, run_starts, rb)
            for p0, p1 in itertools.pairwise(parts):
                if p1 > p0:
                    futs.append(
                        pool.submit(
                            "read",
                            read_runs,
                            self._raw_of(a),
                            a,
                            range(p0, p1),
                            run_chunk,
                            run_row,
                            run_iov,
                            iov,
                            chunk_end,
                            self.files,
                        )
                    )
        return futs


def scatter_batches(
    store: Store,
    names: Sequence[str],
    plan: EpochPlan,
    rank: int,
    worker: int,
    *,
    raw: Callable[[str, int], RawChunk],
    prefetch: int,
    threads: int,
    new_batch: Callable[[int], Batch],
    index_key: str,
    allocate: Allocate | None = None,
) -> Iterator[Batch]:
    """The worker's batches, in plan order, read by a :class:`ScatterReader` (see there)."""
    reader = ScatterReader(
        store,
        names,
        plan,
        rank,
        worker,
        raw=raw,
        prefetch=prefetch,
        threads=threads,
        new_batch=new_batch,
        index_key=index_key,
        allocate=allocate,
    )
    return read_loop(reader)
