"""Resuming an epoch mid-way, on the same or on another world shape (pure numpy, no I/O).

The position in an epoch is ``(epoch, batches consumed per rank)``: in DDP every rank has taken
the same number of steps. With the same world shape the plan simply continues. With another
shape (elastic), each old worker's unconsumed rows (the tail of its ordered sequence; its
partly read shuffle group leaves an explicit row array) are concatenated in (rank, worker)
order into a new sequence, which is cut over the new world with the same drop / pad rules.

>>> plan = plan_epoch([4, 4, 2], world_size=2, num_workers=2, batch_size=2, shuffle=False)
>>> rest = plan_resume(plan, 1, world_size=1, num_workers=0)
>>> [b.tolist() for b in iter_rank_batches(rest, 0)]
[[2, 3], [4, 7], [8, 9]]
>>> state = plan_state(plan, 1)
>>> again = plan_from_state(state, [4, 4, 2], batch_size=2, shuffle=False, world_size=1, num_workers=0)
>>> [b.tolist() for b in iter_rank_batches(again, 0)]
[[2, 3], [4, 7], [8, 9]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from shardload.errors import StateError
from shardload.plan.buckets import bucketed_fingerprint
from shardload.plan.epoch import (
    DEFAULT_SHUFFLE_CHUNKS,
    EpochPlan,
    WorkerPlan,
    _check_int,
    _plan_sequence,
    plan_epoch,
    plan_fingerprint,
)
from shardload.plan.groups import (
    _bucketed,
    _group_bounds,
    _group_order,
    iter_rank_batches,  # noqa: F401 - used by the doctests
)
from shardload.plan.spans import Spans, concat_spans


def plan_resume(
    old: EpochPlan,
    batches_consumed: int,
    *,
    world_size: int | None = None,
    num_workers: int | None = None,
) -> EpochPlan:
    """The plan of the rows ``old`` has not yielded after ``batches_consumed`` batches per rank.

    ``world_size`` / ``num_workers`` default to the old ones. With the same number of ranks and
    of readers the result continues ``old`` exactly: old worker ``w`` consumed
    ``k // W + (w < k % W)`` batches, and new DataLoader worker ``j`` reads old worker
    ``(k + j) % W`` so that the round robin goes on where it stopped. Otherwise the unseen rows
    are re-planned (elastic); ``num_dropped`` / ``num_padded`` then count rows of the unseen
    sequence. An elastic plan whose ranks would get no batch drops every unseen row instead of
    raising (the end of an epoch resumed on a bigger world).

    Raises
    ------
    StateError
        When ``batches_consumed`` is not within ``0 .. old.batches_per_rank``.
    """
    k = int(batches_consumed)
    if k != batches_consumed or not 0 <= k <= old.batches_per_rank:
        raise StateError(
            f"batches_consumed={batches_consumed!r} is not within 0..{old.batches_per_rank}, "
            f"the batches per rank of epoch {old.epoch}'s plan"
        )
    world = old.world_size if world_size is None else _check_int("world_size", world_size, 1)
    workers = old.num_workers if num_workers is None else _check_int("num_workers", num_workers, 0)
    history = (*old.history, (old.world_size, old.num_workers, k))
    readers = max(1, old.num_workers)
    if world == old.world_size and max(1, workers) == readers:
        ranks = tuple(
            tuple(
                _continue(old.workers[r][(k + j) % readers], j, k, readers, old.batch_size)
                for j in range(readers)
            )
            for r in range(world)
        )
        remaining = sum(wp.num_rows for wp in ranks[0])
        return replace(
            old,
            num_workers=workers,
            workers=ranks,
            num_rows=remaining * world,
            num_dropped=0,
            num_padded=0,
            batches_per_rank=old.batches_per_rank - k,
            history=history,
        )

    explicit = list(old.workers[0][0].spans.explicit)
    pieces = [
        piece
        for rank in old.workers
        for w, wp in enumerate(rank)
        for piece in _unconsumed(wp, _consumed(w, k, readers) * old.batch_size, old, explicit)
    ]
    seq = _prune(concat_spans(pieces, tuple(explicit)))
    new = _plan_sequence(
        seq,
        world_size=world,
        num_workers=workers,
        batch_size=old.batch_size,
        seed=old.seed,
        epoch=old.epoch,
        mode=old.mode,
        drop_last=old.drop_last,
        shuffle=old.shuffle,
        shuffle_chunks=old.shuffle_chunks,
        fingerprint=old.fingerprint,
        history=history,
        allow_empty=True,
    )
    return replace(new, buckets=old.buckets) if old.buckets is not None else new


def _consumed(w: int, k: int, readers: int) -> int:
    """Batches worker ``w`` of ``readers`` gave to a rank that consumed ``k``."""
    return k // readers + (w < k % readers)


def _continue(wp: WorkerPlan, slot: int, k: int, readers: int, batch_size: int) -> WorkerPlan:
    done = _consumed(wp.worker, k, readers)
    rows = min(done * batch_size, wp.num_rows)
    return replace(
        wp,
        worker=slot,
        num_rows=wp.num_rows - rows,
        num_batches=wp.num_batches - done,
        skip_rows=wp.skip_rows + rows,
    )


def _unconsumed(
    wp: WorkerPlan, rows_done: int, old: EpochPlan, explicit: list[np.ndarray]
) -> list[Spans]:
    """The tail of a worker's ordered rows after ``skip_rows + rows_done`` of them."""
    spans, k = wp.spans, old.shuffle_chunks
    skip = wp.skip_rows + min(rows_done, wp.num_rows)
    bounds = _group_bounds(spans, k)
    if skip >= bounds[-1]:
        return []
    g = int(np.searchsorted(bounds, skip, "right")) - 1
    group, rest = spans.seg(g * k, (g + 1) * k), spans.seg((g + 1) * k, len(spans))
    n, local = int(bounds[g + 1] - bounds[g]), skip - int(bounds[g])
    if local == 0:
        return [group, rest]
    if old.shuffle is not True:  # rows in sequence order (buckets need shuffle=True)
        return [group.take(local, n), rest]
    # The rest of a shuffled group is a set of rows of its segments: keep it per segment.
    order = _group_order(wp, g, group, int(bounds[g]), n, old.shuffle, old.batch_size)
    if old.buckets is not None:
        order = _bucketed(old, wp, g, group, order, int(bounds[g]))
    keep = np.sort(order[local:])
    seg_of = np.searchsorted(group.cum, keep, "right") - 1
    cols: list[list[int]] = [[], [], [], [], []]
    for j in np.unique(seg_of):
        offs = group.offsets(int(j))[keep[seg_of == j] - group.cum[j]]
        lo, hi, ex = group.lo[j], group.hi[j], group.ex[j]
        if len(offs) < hi - lo:
            if ex < 0 and offs[-1] - offs[0] + 1 == len(offs):
                lo, hi = offs[0], offs[-1] + 1
            else:
                lo, hi, ex = 0, len(offs), len(explicit)
                explicit.append(offs)
        for col, v in zip(cols, (group.chunk[j], group.base[j], lo, hi, ex), strict=True):
            col.append(int(v))
    chunk, base, lo_, hi_, ex_ = (np.array(c, dtype=np.int64) for c in cols)
    head = Spans(chunk, base, lo_, hi_, ex_)
    return [head, rest]


def _prune(seq: Spans) -> Spans:
    """Drop explicit row arrays no segment refers to any more (resumes can chain)."""
    used = np.unique(seq.ex[seq.ex >= 0])
    remap = np.full(len(seq.explicit) + 1, -1, dtype=np.int64)
    remap[used] = np.arange(len(used))
    return replace(seq, ex=remap[seq.ex], explicit=tuple(seq.explicit[i] for i in used))


@dataclass(frozen=True)
class EpochState:
    """Where training stands in an epoch: enough to rebuild the rest of it.

    ``history`` holds the earlier legs of the epoch as ``(world_size, num_workers,
    batches_consumed)``; ``fingerprint`` ties the state to the chunks and options
    (:func:`~shardload.plan.epoch.plan_fingerprint`).
    """

    epoch: int
    batches_consumed: int
    world_size: int
    num_workers: int
    fingerprint: str
    history: tuple[tuple[int, int, int], ...] = ()

    def to_dict(self) -> dict:
        d = asdict(self)
        d["history"] = [list(h) for h in self.history]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> EpochState:
        """Inverse of :meth:`to_dict`; raises :class:`StateError` for anything else."""
        try:
            return cls(
                epoch=int(d["epoch"]),
                batches_consumed=int(d["batches_consumed"]),
                world_size=int(d["world_size"]),
                num_workers=int(d["num_workers"]),
                fingerprint=str(d["fingerprint"]),
                history=tuple((int(a), int(b), int(c)) for a, b, c in d.get("history", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"not an epoch state: {d!r} ({exc})") from exc


def plan_state(plan: EpochPlan, batches_consumed: int) -> EpochState:
    """The state to save after each rank consumed ``batches_consumed`` batches of ``plan``."""
    if not 0 <= batches_consumed <= plan.batches_per_rank:
        raise StateError(
            f"batches_consumed={batches_consumed} is not within 0..{plan.batches_per_rank}"
        )
    return EpochState(
        plan.epoch,
        int(batches_consumed),
        plan.world_size,
        plan.num_workers,
        plan.fingerprint,
        plan.history,
    )


def plan_from_state(
    state: EpochState,
    chunk_sizes: Sequence[int] | np.ndarray,
    *,
    chunk_ids: Sequence[int] | np.ndarray | None = None,
    chunk_starts: Sequence[int] | np.ndarray | None = None,
    batch_size: int,
    seed: int = 0,
    mode: str = "drop",
    drop_last: bool = False,
    shuffle: bool | str = True,
    shuffle_chunks: int = DEFAULT_SHUFFLE_CHUNKS,
    world_size: int,
    num_workers: int,
    buckets: Any = None,
) -> EpochPlan:
    """Rebuild the rest of the epoch a state was saved in, for a (possibly new) world shape.
    ``buckets``: the epoch's length-bucketed batches (``plan/buckets.py``), if any.

    Raises
    ------
    StateError
        When the chunks or the options differ from those of the run that saved ``state``.
    """
    opts: dict[str, Any] = dict(
        chunk_ids=chunk_ids,
        chunk_starts=chunk_starts,
        batch_size=batch_size,
        seed=seed,
        mode=mode,
        drop_last=drop_last,
        shuffle=shuffle,
        shuffle_chunks=shuffle_chunks,
    )
    fp = plan_fingerprint(chunk_sizes, **opts)
    if buckets is not None:
        fp = bucketed_fingerprint(fp)
    if fp != state.fingerprint:
        raise StateError(
            f"the state (fingerprint {state.fingerprint}) was saved for other chunks or options "
            f"than these (fingerprint {fp}: {len(chunk_sizes)} chunks, batch_size={batch_size}, "
            f"seed={seed}, mode={mode!r}, drop_last={drop_last}, shuffle={shuffle}, "
            f"shuffle_chunks={shuffle_chunks})"
        )
    legs = (*state.history, (state.world_size, state.num_workers, state.batches_consumed))
    plan = plan_epoch(
        chunk_sizes, world_size=legs[0][0], num_workers=legs[0][1], epoch=state.epoch, **opts
    )
    if buckets is not None:
        plan = replace(plan, buckets=buckets, fingerprint=fp)
    shapes = [leg[:2] for leg in legs[1:]] + [(world_size, num_workers)]
    for (_, _, k), (world, workers) in zip(legs, shapes, strict=True):
        plan = plan_resume(plan, k, world_size=world, num_workers=workers)
    return plan


def skip_worker_batches(plan: EpochPlan, rank: int, worker: int, skip: int) -> EpochPlan:
    """``plan`` with worker ``worker`` of ``rank`` starting after its first ``skip`` batches.

    >>> from shardload.plan.groups import iter_worker_batches
    >>> plan = plan_epoch([3, 2], batch_size=2, num_workers=0, shuffle=False)
    >>> [b.tolist() for b in iter_worker_batches(skip_worker_batches(plan, 0, 0, 1), 0, 0)]
    [[2, 3], [4]]
    """
    wp = plan.workers[rank][worker]
    if skip > wp.num_batches:
        raise StateError(
            f"cannot skip {skip} batches of worker {worker} of rank {rank}: it has "
            f"{wp.num_batches} in this plan"
        )
    rows = min(skip * plan.batch_size, wp.num_rows)
    wp = replace(
        wp,
        num_rows=wp.num_rows - rows,
        num_batches=wp.num_batches - skip,
        skip_rows=wp.skip_rows + rows,
    )
    ranks = list(plan.workers)
    ranks[rank] = (*plan.workers[rank][:worker], wp, *plan.workers[rank][worker + 1 :])
    return replace(plan, workers=tuple(ranks))
