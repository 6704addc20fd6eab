"""The gather reader: shuffle groups read into group buffers, batches gathered out of them.

For stores whose chunks must be read whole (compressed Zarr, HDF5, URLs): :mod:`.reader`
reads a group's segments into page-aligned group buffers in background threads, with a
bounded read-ahead; each batch is then one ``np.take`` per array out of the group buffers
(two when a batch straddles groups), into the batch memory the caller allocates.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from shardload.errors import PlanError
from shardload.load.checks import check_indices
from shardload.load.reader import BufferPool, Group, read_groups
from shardload.load.recycle import INDEX_KEY, Allocate, new_batch
from shardload.plan.epoch import EpochPlan, group_batches, iter_worker_groups
from shardload.store.core import Store

#: Batch pieces smaller than this are gathered in the calling thread (no thread hop).
INLINE_GATHER_BYTES = 256 * 1024


def _gather(g: Group, sel: np.ndarray, at: int, names: Sequence[str], out: dict) -> None:
    for a in names:
        np.take(g.bufs[a], sel, axis=0, out=out[a][at : at + len(sel)], mode="clip")
    np.take(g.rows, sel, out=out[INDEX_KEY][at : at + len(sel)], mode="clip")


def gather_batches(
    store: Store, names: Sequence[str], plan: EpochPlan, rank: int, worker: int, *,
    prefetch: int, threads: int, allocate: Allocate,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """Cut the worker's groups into batches: one gather per array per batch (two when a batch
    straddles groups), into arrays from ``allocate`` (fresh ones where it gives None).

    The gathers run in a pool of ``threads`` threads (numpy releases the GIL in ``take``), up to
    ``threads + 1`` batches ahead of the one yielded; batches are yielded in plan order, so the
    result does not depend on the thread count. Before the next group is asked for, the gathers
    from the current one are waited for and its buffers go back to the reader's pool (so a
    worker holds two groups' buffers, not three).
    """
    specs: dict[str, Any] = {a: store.manifest.arrays[a] for a in names}
    b = plan.batch_size
    total = plan.workers[rank][worker].num_rows
    row_bytes = sum(s.row_bytes for s in specs.values()) + 8
    buffers = BufferPool(keep=1)
    gathers = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="shardload-take")
    inflight: deque[tuple[list[Future[None]], dict[str, np.ndarray]]] = deque()
    ahead = max(1, threads) + 1

    def finish() -> dict[str, np.ndarray]:
        futs, batch = inflight.popleft()
        for f in futs:
            f.result()
        return batch

    pending: dict[int, tuple[list[Future[None]], dict[str, np.ndarray], int]] = {}
    at = 0  # stream position of the current group's first row
    groups = iter_worker_groups(plan, rank, worker)
    try:
        for g in read_groups(
            store, names, groups, prefetch=prefetch, threads=threads, buffers=buffers
        ):
            n = min(len(g.order), total - at)
            check_indices(g.order, len(g.rows), f"worker {worker} of rank {rank}: a group's order")
            mine: list[Future[None]] = []  # gathers reading this group
            for k, dst, src, take in group_batches(at, n, b).tolist():
                if k not in pending:
                    size = min(b, total - k * b)
                    pending[k] = ([], allocate(size) or new_batch(specs, size), size)
                futs, out, size = pending[k]
                sel = g.order[src : src + take]
                if take * row_bytes < INLINE_GATHER_BYTES:  # a thread hop costs more than this
                    _gather(g, sel, dst, names, out)
                else:
                    f = gathers.submit(_gather, g, sel, dst, names, out)
                    futs.append(f)
                    mine.append(f)
                if dst + take == size:
                    inflight.append(pending.pop(k)[:2])
                    while len(inflight) > ahead:
                        yield finish()
            at += n
            for f in mine:
                f.result()
            g.release(buffers)
        while inflight:
            yield finish()
    finally:
        gathers.shutdown(wait=True, cancel_futures=True)
    if pending:  # cannot happen for a consistent plan; never yield a half-filled batch
        raise PlanError(f"worker {worker} of rank {rank}: the plan ended inside a batch")
