"""Scatter reads: a shuffle group's rows go from the page cache straight to their batch rows.

For uncompressed local chunk files (:class:`~shardload.formats.base.RawChunk`: shardload's
Zarr arrays without compression, npy stacks), a shuffle needs no gather. Each row of a group
has a known place in the worker's stream of batches (its position in the group's ``order``),
so the batches of a group are allocated first and one ``preadv`` per 1,024 rows copies the
file's rows into their places: one copy from the page cache, where reading into a group buffer
and gathering out of it costs two, and no group buffer at all. The iovecs are built with numpy;
``preadv`` runs through ctypes, which releases the GIL, in the reader threads.

Memory: the batches of the group being yielded and of the groups read ahead (``prefetch``, in
chunks, rounded up to whole groups), which is what the batches would cost anyway.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import ChunkReadError, PlanError
from ..formats.base import RawChunk, RawChunks
from ..plan.epoch import EpochPlan, iter_worker_groups
from ..plan.spans import Segment
from ..store import Store
from .checks import check_indices
from .recycle import Allocate

#: Linux's IOV_MAX: iovecs per ``preadv`` call.
IOV_MAX = 1024

_PREADV: Any = None


def _preadv() -> Any:
    """libc's ``preadv`` through ctypes (releases the GIL), or None where there is none."""
    global _PREADV
    if _PREADV is None:
        fn: Any = False
        if sys.platform.startswith("linux"):
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
                fn = libc.preadv
                fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
                fn.restype = ctypes.c_ssize_t
            except (OSError, AttributeError):
                fn = False
        _PREADV = fn
    return _PREADV or None


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
    """``raw(name, chunk)`` when every array in ``names`` is raw rows in local files and this
    platform has ``preadv``; else None (the loader reads into group buffers and gathers)."""
    reader = store.reader
    if _preadv() is None or not raw_rows(store, names):
        return None
    assert isinstance(reader, RawChunks)

    def raw(name: str, chunk: int) -> RawChunk:
        got = reader.raw_chunk(name, chunk)
        assert got is not None
        return got

    return raw


def plan_iovecs(ptrs: np.ndarray, keep: np.ndarray, row_bytes: int) -> np.ndarray:
    """``(k, 2)`` uint64 iovecs (base, length) for consecutive file rows landing at ``ptrs``;
    runs of rows whose destinations follow each other become one iovec (pure).

    Rows with ``keep`` false are not wanted: their ``ptrs`` point at a scratch row and never
    merge.

    >>> plan_iovecs(np.array([100, 110, 200, 5]), np.array([True, True, True, False]), 10).tolist()
    [[100, 20], [200, 10], [5, 10]]
    """
    n = len(ptrs)
    if n == 0:
        return np.zeros((0, 2), np.uint64)
    cont = (ptrs[1:] == ptrs[:-1] + row_bytes) & keep[1:] & keep[:-1]
    starts = np.flatnonzero(np.concatenate(([True], ~cont)))
    iov = np.empty((len(starts), 2), np.uint64)
    iov[:, 0] = ptrs[starts]
    iov[:, 1] = np.diff(np.append(starts, n)) * row_bytes
    return iov


def read_scatter(
    raw: RawChunk, name: str, chunk: int, first: int, positions: np.ndarray, bases: np.ndarray,
    k0: int, batch_size: int,
) -> None:  # fmt: skip
    """File rows ``first, first + 1, ...`` of one chunk into stream ``positions`` (-1: unwanted).

    Stream position ``p`` is row ``p % batch_size`` of batch ``p // batch_size``, whose array
    starts at address ``bases[p // batch_size - k0]``.
    """
    rb = raw.row_bytes
    keep = positions >= 0
    # unwanted rows take the group's first batch as a stand-in (their pointer is the scratch
    # row below): position 0 would index ``bases[-k0]``, out of range after an elastic resume
    pos = np.where(keep, positions, k0 * batch_size)
    scratch = np.empty(max(rb, 1), np.uint8)
    ptrs = bases[pos // batch_size - k0] + (pos % batch_size).astype(np.uint64) * np.uint64(rb)
    ptrs = np.where(keep, ptrs, np.uint64(scratch.ctypes.data))
    iov = plan_iovecs(ptrs, keep, rb)
    preadv = _preadv()
    start = raw.offset + first * rb
    want_end = start + len(positions) * rb
    try:
        fd = os.open(raw.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise ChunkReadError(f"chunk {chunk} of array {name!r} is missing: {raw.path}") from exc
    except OSError as exc:
        raise ChunkReadError(
            f"chunk {chunk} of array {name!r} could not be read: {raw.path}: {exc}"
        ) from exc
    try:
        size = os.fstat(fd).st_size
        if size < want_end:
            raise ChunkReadError(
                f"chunk {chunk} of array {name!r} is truncated or corrupt: {raw.path} has "
                f"{size} bytes, rows up to {first + len(positions)} need {want_end}"
            )
        off = start
        for i in range(0, len(iov), IOV_MAX):
            part = iov[i : i + IOV_MAX]
            want = int(part[:, 1].sum())
            got = preadv(fd, part.ctypes.data, len(part), off)
            if got < 0:
                err = ctypes.get_errno()
                raise ChunkReadError(
                    f"chunk {chunk} of array {name!r} could not be read: {raw.path}: "
                    f"{os.strerror(err)}"
                )
            if got != want:
                raise ChunkReadError(
                    f"chunk {chunk} of array {name!r} is truncated or corrupt: {raw.path} "
                    f"(expected {want} bytes at offset {off}, got {got})"
                )
            off += want
    finally:
        os.close(fd)
        del scratch  # alive until the kernel wrote the unwanted rows into it


def _segment_rows(seg: Segment) -> tuple[int, int, np.ndarray | None]:
    """(first file row, file rows, explicit offsets relative to the first or None)."""
    if seg.rows is None:
        return seg.start, seg.stop - seg.start, None
    return seg.start, seg.stop - seg.start, seg.rows - seg.start


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


def scatter_batches(
    store: Store, names: Sequence[str], plan: EpochPlan, rank: int, worker: int, *,
    raw: Callable[[str, int], RawChunk], prefetch: int, threads: int,
    new_batch: Callable[[int], dict[str, np.ndarray]], index_key: str,
    allocate: Allocate | None = None,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """The worker's batches, in plan order, read by scatter; ``index_key`` holds the global
    rows. Batches come from ``allocate(n)`` (or ``new_batch(n)`` when it gives None).

    Groups are planned whole: the current one and ``ceil(prefetch / shuffle_chunks)`` ahead
    (more while a batch still straddles unread groups). Planning a group (allocating its
    batches, writing their index rows, cutting the iovecs) takes a few ms, so it runs in a
    planner thread of its own, off the path of the batch being yielded; the planner hands the
    group's reads to ``threads`` reader threads. A batch is yielded once every group holding
    some of its rows is read. Closing the iterator waits for the plans and reads in flight, so
    no thread writes into a batch's memory after the caller reclaims it.
    """
    b = plan.batch_size
    total = plan.workers[rank][worker].num_rows
    num_batches = -(-total // b)
    ahead = groups_in_flight(prefetch=prefetch, shuffle_chunks=plan.shuffle_chunks)
    batches: dict[int, dict[str, np.ndarray]] = {}  # written by the planner, popped here
    inflight: deque[tuple[int, int, Future[list[Future[None]]]]] = deque()
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="shardload-read")
    planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardload-plan")
    groups = iter_worker_groups(plan, rank, worker)
    bounds = np.asarray(store.manifest.chunk_bounds, dtype=np.int64)
    at = 0  # stream position of the next group's first row (main thread only)

    def batch(k: int) -> dict[str, np.ndarray]:  # planner thread only
        if k not in batches:
            size = min(b, total - k * b)
            batches[k] = (allocate(size) if allocate else None) or new_batch(size)
        return batches[k]

    def plan_group(
        segments: tuple[Segment, ...], order: np.ndarray, at: int, n: int
    ) -> list[Future[None]]:
        """Planner thread: allocate the group's batches, fill their index, submit its reads."""
        lens = np.array([len(s) for s in segments], dtype=np.int64)
        pos = np.full(int(lens.sum()), -1, np.int64)  # stream position of each group row
        check_indices(order[:n], len(pos), f"worker {worker} of rank {rank}: a group's order")
        pos[order[:n]] = at + np.arange(n, dtype=np.int64)
        rows = np.concatenate([s.global_rows() for s in segments]) if segments else pos
        k0, k1 = at // b, -(-(at + n) // b)
        outs = [batch(k) for k in range(k0, k1)]
        stream_rows = rows[order[:n]]
        for k, out in zip(range(k0, k1), outs, strict=True):
            lo, hi = max(at, k * b), min(at + n, (k + 1) * b)
            out[index_key][lo - k * b : hi - k * b] = stream_rows[lo - at : hi - at]
        bases = {a: np.array([o[a].ctypes.data for o in outs], np.uint64) for a in names}
        futs: list[Future[None]] = []
        cat = 0
        for seg, m in zip(segments, lens.tolist(), strict=True):
            mine = pos[cat : cat + m]
            cat += m
            if not (mine >= 0).any():
                continue
            first, span, rel = _segment_rows(seg)
            # a segment's offsets count from its piece's first row (a row range cuts chunks)
            first += seg.chunk_start - int(bounds[seg.chunk])
            if rel is not None:  # explicit rows: the bounding span, unwanted rows to scratch
                full = np.full(span, -1, np.int64)
                full[rel] = mine
                mine = full
            for a in names:
                futs.append(pool.submit(
                    read_scatter, raw(a, seg.chunk), a, seg.chunk, first, mine, bases[a], k0, b
                ))  # fmt: skip
        return futs

    try:
        exhausted = False
        for k in range(num_batches):
            end = min((k + 1) * b, total)
            while not exhausted and (len(inflight) < ahead or at < end):
                g = next(groups, None)
                if g is None:
                    exhausted = True
                else:
                    n = min(len(g[1]), total - at)
                    inflight.append((at, at + n, planner.submit(plan_group, *g, at, n)))
                    at += n
            if at < end:
                raise PlanError(f"worker {worker} of rank {rank}: the plan ended inside a batch")
            for start, _, planned in inflight:
                if start >= end:
                    break
                for f in planned.result():
                    f.result()  # re-raises a plan or read error here, in the consuming thread
            out = batches.pop(k)
            while inflight and inflight[0][1] <= end:
                inflight.popleft()
            yield out
    finally:
        planner.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
