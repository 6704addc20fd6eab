"""Reading a worker's plan: its shuffle groups, and how their rows are cut into batches.

:func:`iter_worker_spans` yields a worker's shuffle groups (their segments and the order of
their rows, from the shuffle's ``group_order``: :mod:`.shuffles`), from where a resume left
off; :func:`group_batches` is the one rule that cuts a group's rows into batches, used by the
planner (:func:`iter_worker_batches`) and by every reader of ``shardload.load`` (pure numpy).

>>> from shardload.plan.epoch import plan_epoch
>>> plan = plan_epoch([4, 4, 2], world_size=2, num_workers=2, batch_size=2, shuffle=False)
>>> [worker_rows(plan, 0, w).tolist() for w in range(2)]
[[0, 1, 2], [3, 4]]
>>> [b.tolist() for b in iter_rank_batches(plan, 1)]
[[5, 6], [8, 9], [7]]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from shardload.errors import PlanError
from shardload.plan.shuffles import get_shuffle
from shardload.plan.spans import Segment, Spans, spans_rows

if TYPE_CHECKING:  # the plan's types live with the planner, which imports this module
    from shardload.plan.epoch import EpochPlan, WorkerPlan

__all__ = [
    "group_batches",
    "iter_rank_batches",
    "iter_worker_batches",
    "iter_worker_groups",
    "iter_worker_spans",
    "worker_rows",
    "worker_spans",
]


# -- reading a worker's plan -------------------------------------------------------------------


def _group_bounds(spans: Spans, k: int) -> np.ndarray:
    """Row position where each shuffle group starts, and the total at the end."""
    bounds = spans.cum[::k]
    return np.append(bounds, spans.cum[-1]) if len(spans) % k else bounds


def _group_order(
    wp: WorkerPlan, g: int, spans: Spans, at: int, n: int, shuffle: bool | str, batch_size: int
) -> np.ndarray:
    """Group ``g``'s order: the shuffle's ``group_order`` (``shuffle=True``: its rows dealt to
    its batches, ``shuffles.deal_order``); as they come where it has none (``"uniform"``: the
    sequence is a uniform permutation already). ``at``: the group's first stream position."""
    order = get_shuffle(shuffle).group_order
    if order is None:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng((*wp.seed_key, g))
    return order(spans.hi - spans.lo, at, n, batch_size, rng)


def _iter_groups(
    wp: WorkerPlan, k: int, shuffle: bool | str, batch_size: int, plan: EpochPlan | None = None
) -> Iterator[tuple[int, Spans, np.ndarray, int]]:
    """Per group from the one holding row ``skip_rows``: (index, spans, order, rows skipped)."""
    bounds = _group_bounds(wp.spans, k)
    first = int(np.searchsorted(bounds, wp.skip_rows, "right")) - 1
    for g in range(first, len(bounds) - 1):
        spans = wp.spans.seg(g * k, (g + 1) * k)
        n = int(bounds[g + 1] - bounds[g])
        order = _group_order(wp, g, spans, int(bounds[g]), n, shuffle, batch_size)
        if plan is not None and plan.buckets is not None:
            order = _bucketed(plan, wp, g, spans, order, int(bounds[g]))
        yield g, spans, order, max(0, wp.skip_rows - int(bounds[g]))


def _bucketed(
    plan: EpochPlan, wp: WorkerPlan, g: int, spans: Spans, order: np.ndarray, at: int
) -> np.ndarray:
    """Group ``g``'s order with length-bucketed batches (``plan/buckets.py``)."""
    key = (*wp.seed_key, g)
    return plan.buckets.reorder(order, spans_rows(spans), at, plan.batch_size, key)  # type: ignore[no-any-return]


def iter_worker_spans(
    plan: EpochPlan, rank: int, worker: int
) -> Iterator[tuple[Spans, np.ndarray]]:
    """The shuffle groups of one worker as ``(spans, order)`` (the vectorised form of
    :func:`iter_worker_groups`, for readers that plan a group's reads with numpy)."""
    wp = plan.workers[rank][worker]
    for _, spans, order, skip in _iter_groups(
        wp, plan.shuffle_chunks, plan.shuffle, plan.batch_size, plan
    ):
        yield spans, order[skip:]


def worker_spans(plan: EpochPlan, rank: int, worker: int) -> Spans:
    """The segments one worker reads, from the shuffle group holding its first row not yet
    consumed (a resume's ``skip_rows``) to its end: the spans of :func:`iter_worker_spans`,
    without dealing each group's rows (for planners that need the rows read, not their order).

    >>> from shardload.plan.epoch import plan_epoch
    >>> plan = plan_epoch([2, 2, 2], batch_size=2, num_workers=0, shuffle=False, shuffle_chunks=2)
    >>> worker_spans(plan, 0, 0).chunk.tolist()
    [0, 1, 2]
    """
    wp = plan.workers[rank][worker]
    k = max(1, int(plan.shuffle_chunks))
    bounds = _group_bounds(wp.spans, k)
    first = max(0, int(np.searchsorted(bounds, wp.skip_rows, "right")) - 1)
    return wp.spans.seg(first * k, len(wp.spans))


def iter_worker_groups(
    plan: EpochPlan, rank: int, worker: int
) -> Iterator[tuple[tuple[Segment, ...], np.ndarray]]:
    """The shuffle groups of one worker, in reading order.

    Yields ``(segments, order)``: ``order`` indexes the concatenated rows of ``segments`` (the
    worker reads those chunks' rows, then yields them in this order). Rows consumed before a
    resume are left out of ``order``.

    >>> from shardload.plan.epoch import plan_epoch

    >>> plan = plan_epoch([2, 2, 2], batch_size=2, num_workers=0, shuffle=False, shuffle_chunks=2)
    >>> [(len(s), o.tolist()) for s, o in iter_worker_groups(plan, 0, 0)]
    [(2, [0, 1, 2, 3]), (1, [0, 1])]
    """
    for spans, order in iter_worker_spans(plan, rank, worker):
        yield spans.segments(), order


def group_batches(at: int, n: int, batch_size: int) -> np.ndarray:
    """Where ``n`` rows of a worker's stream, from stream position ``at``, go: one row
    ``(batch k, first row in batch k, first of the n rows, count)`` per batch they touch
    (pure). Stream position ``p`` is row ``p % batch_size`` of batch ``p // batch_size``.

    The one group-to-batch rule: the planner (:func:`iter_worker_batches`), the gather reader
    and the scatter reader all cut a group's rows into batches with it.

    >>> group_batches(250, 300, 256).tolist()
    [[0, 250, 0, 6], [1, 0, 6, 256], [2, 0, 262, 38]]
    """
    b = int(batch_size)
    if n <= 0:
        return np.zeros((0, 4), np.int64)
    ks = np.arange(at // b, -(-(at + n) // b), dtype=np.int64)
    lo, hi = np.maximum(at, ks * b), np.minimum(at + n, (ks + 1) * b)
    return np.stack([ks, lo - ks * b, lo - at, hi - lo], axis=1)


def worker_rows(plan: EpochPlan, rank: int, worker: int) -> np.ndarray:
    """The global rows one worker yields, in order (for tests and small data).

    >>> from shardload.plan.epoch import plan_epoch

    >>> plan = plan_epoch([3, 2], world_size=2, batch_size=1, num_workers=0, shuffle=False)
    >>> worker_rows(plan, 1, 0).tolist(), plan.num_dropped
    ([2, 3], 1)
    """
    parts = [spans_rows(spans)[order] for spans, order in iter_worker_spans(plan, rank, worker)]
    return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def iter_worker_batches(plan: EpochPlan, rank: int, worker: int) -> Iterator[np.ndarray]:
    """The worker's batches as arrays of global rows (a batch may span shuffle groups).

    >>> from shardload.plan.epoch import plan_epoch

    >>> plan = plan_epoch([3, 2], batch_size=2, num_workers=0, shuffle=False)
    >>> [b.tolist() for b in iter_worker_batches(plan, 0, 0)]
    [[0, 1], [2, 3], [4]]
    """
    if plan.buckets is None and get_shuffle(plan.shuffle).group_order is None:
        yield from _iter_sequence_batches(plan, rank, worker)
        return
    b, total, at = plan.batch_size, plan.workers[rank][worker].num_rows, 0
    pending: dict[int, np.ndarray] = {}
    for spans, order in iter_worker_spans(plan, rank, worker):
        rows = spans_rows(spans)[order]
        for k, dst, src, cnt in group_batches(at, len(rows), b).tolist():
            out = pending.setdefault(k, np.empty(min(b, total - k * b), np.int64))
            out[dst : dst + cnt] = rows[src : src + cnt]
            if dst + cnt == len(out):
                yield pending.pop(k)
        at += len(rows)
    if pending:  # cannot happen for a consistent plan
        raise PlanError(f"worker {worker} of rank {rank}: the plan ended inside a batch")


#: Rows a block of :func:`_iter_sequence_batches` holds at most (rounded to whole batches).
BLOCK_ROWS = 1 << 16


def _iter_sequence_batches(plan: EpochPlan, rank: int, worker: int) -> Iterator[np.ndarray]:
    """:func:`iter_worker_batches` where every group's order is the rows as they come (no
    ``group_order``, no buckets): the worker's rows are its spans' rows in sequence, from row
    ``skip_rows``, cut into batches a block of about :data:`BLOCK_ROWS` rows at a time (a
    group each would cost a few numpy calls per group: per window, where a window is a group)."""
    wp = plan.workers[rank][worker]
    b = plan.batch_size
    block = max(b, BLOCK_ROWS // b * b)
    pos, end = wp.skip_rows, wp.skip_rows + wp.num_rows
    have = wp.spans.num_rows
    while pos < end:
        stop = min(end, pos + block)
        rows = spans_rows(wp.spans.take(min(pos, have), min(stop, have)))
        if len(rows) != stop - pos:  # cannot happen for a consistent plan
            raise PlanError(f"worker {worker} of rank {rank}: the plan ended inside a batch")
        for s in range(0, len(rows), b):
            yield rows[s : s + b]
        pos += block


def iter_rank_batches(plan: EpochPlan, rank: int) -> Iterator[np.ndarray]:
    """A rank's batches in the order a DataLoader yields them: batch ``k`` is worker ``k % W``'s
    batch ``k // W`` (a simulation of its round robin, for tests and for ``num_workers=0``)."""
    its = [iter_worker_batches(plan, rank, w) for w in range(len(plan.workers[rank]))]
    for k in range(plan.batches_per_rank):
        yield next(its[k % len(its)])
