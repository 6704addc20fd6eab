"""The epoch plan: which rows each (rank, worker) reads, in which order (pure numpy, no I/O).

An epoch is a *sequence* of rows built from the chunks of a split, seeded by ``(seed, epoch)``.
It is never a per-row array: it is a list of segments (a chunk, and a row range or an explicit
array of row offsets inside it), so a plan for 10**9 rows costs what its chunk list costs.

1. **Sequence.** The chunks in a permutation seeded by ``(seed, epoch)`` when ``shuffle``, in
   the given order otherwise. Where a chunk is cut into pieces (several entries with its id),
   the permutation comes in rounds of one piece per chunk (``shuffles.shuffle_order``), so a
   chunk's pieces spread over the epoch and a shuffle group seldom holds two of them; with
   small pieces a group holds pieces of every chunk, on every rank.
   ``shuffle="uniform"``: every row is its own one-row segment, in a uniform permutation of all
   rows seeded by ``(seed, epoch)`` (for readers that read rows where they lie).
2. **Ranks.** ``N`` rows, ``world_size`` ranks. Mode ``drop`` removes the last ``N mod world``
   rows of the sequence; mode ``pad`` appends (cyclically) its first ``(world - N mod world) mod
   world`` rows. The sequence is then cut into ``world_size`` contiguous parts of ``n_r`` rows,
   cutting inside chunks where needed.
3. **Workers.** A rank part forms ``nb = ceil(n_r / batch_size)`` batches (floor with
   ``drop_last``; the rows of the partial batch are then dropped). DataLoader worker ``w`` of
   ``W`` gets ``nb // W + (w < nb % W)`` batches as contiguous rows of the rank part. The rank's
   batch ``k`` is worker ``k % W``'s batch ``k // W`` (the DataLoader's round robin), and the
   partial batch, if any, is the rank's *last* batch in that order (worker ``(nb - 1) % W``).
   Every rank has the same number of batches.
4. **Shuffle groups.** A worker takes its segments ``shuffle_chunks`` at a time; a group's rows
   are shuffled together (seeded by seed, epoch, rank, worker, group), so batches mix chunks
   while a worker holds only about ``shuffle_chunks`` chunks in memory. The shuffle *deals*
   (``shuffles.deal_order``): each segment's rows go to different batches of the group, so a batch
   holds at most one row of a piece that is no longer than the group's batch count.
   ``shuffle="uniform"`` keeps the sequence's (already uniform) order.

The shuffles by name (steps 1 and 4) live in :mod:`shardload.plan.shuffles`, reading a
worker's plan (its groups, their batches) in :mod:`shardload.plan.groups`, resume and the saved
state (``plan_resume``, ``EpochState``) in :mod:`shardload.plan.resume`.

>>> from shardload.plan.groups import iter_rank_batches, worker_rows
>>> plan = plan_epoch([4, 4, 2], world_size=2, num_workers=2, batch_size=2, shuffle=False)
>>> plan.batches_per_rank, plan.num_dropped, plan.num_padded
(3, 0, 0)
>>> [worker_rows(plan, 0, w).tolist() for w in range(2)]
[[0, 1, 2], [3, 4]]
>>> [b.tolist() for b in iter_rank_batches(plan, 1)]
[[5, 6], [8, 9], [7]]
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, TypedDict

import numpy as np

from shardload.errors import PlanError
from shardload.plan.shuffles import SHUFFLES, get_shuffle, shuffle_key
from shardload.plan.spans import Segment, Spans, concat_spans

__all__ = [
    "DEFAULT_SHUFFLE_CHUNKS",
    "SHUFFLES",
    "EpochPlan",
    "PlanOptions",
    "Segment",
    "WorkerPlan",
    "plan_epoch",
    "plan_fingerprint",
]

MODES = ("drop", "pad")
#: Hashed into the fingerprint of shuffled plans: a state saved by a planner that ordered
#: shuffle groups otherwise (a plain permutation, before ``deal_order``) is refused.
GROUP_ORDER_VERSION = b"|groups-dealt"

#: Chunks whose rows one worker permutes together. Memory per worker is about this many chunks
#: (plus prefetch); 4 mixes enough chunks per batch to break the within-chunk correlation of
#: sample-major scientific data (neighbouring times / locations).
DEFAULT_SHUFFLE_CHUNKS = 4


class PlanOptions(TypedDict):
    """The epoch options a resume must keep (those :func:`plan_fingerprint` hashes), as keyword
    arguments of :func:`plan_epoch`, :func:`plan_fingerprint` and ``plan_from_state``."""

    batch_size: int
    seed: int
    mode: str
    drop_last: bool
    shuffle: bool | str
    shuffle_chunks: int


@dataclass(frozen=True, eq=False)
class WorkerPlan:
    """What one DataLoader worker of one rank reads.

    ``segments`` are all the worker's segments; the first ``skip_rows`` rows of its ordered
    sequence were consumed before (a resume) and are not yielded. ``num_rows`` and
    ``num_batches`` count what it *will* yield. ``seed_key`` seeds its shuffle groups.
    """

    rank: int
    worker: int
    num_rows: int
    num_batches: int
    skip_rows: int
    seed_key: tuple[int, ...]
    spans: Spans = field(repr=False)

    @property
    def segments(self) -> tuple[Segment, ...]:
        return tuple(self.spans.segment(i) for i in range(len(self.spans)))


@dataclass(frozen=True, eq=False)
class EpochPlan:
    """The plan of one epoch (or of the rest of one, after :func:`plan_resume`).

    ``workers[rank][worker]``; ``batches_per_rank`` is the same for every rank.
    ``num_dropped`` rows of the input sequence are not yielded; ``num_padded`` yielded rows
    repeat rows of it. ``history`` lists earlier legs of this epoch as
    ``(world_size, num_workers, batches_consumed)`` (one per resume).
    """

    world_size: int
    num_workers: int
    batch_size: int
    epoch: int
    seed: int
    mode: str
    drop_last: bool
    shuffle: bool | str
    shuffle_chunks: int
    workers: tuple[tuple[WorkerPlan, ...], ...]
    num_rows: int
    num_dropped: int
    num_padded: int
    batches_per_rank: int
    fingerprint: str
    history: tuple[tuple[int, int, int], ...] = ()
    #: length-bucketed batches (:class:`~shardload.plan.buckets.Buckets`), or None
    buckets: Any = None


def _check_int(name: str, value: int, lo: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < lo:
        raise PlanError(f"{name} must be an integer >= {lo}, got {value!r}")
    return int(value)


def _chunk_table(chunk_sizes, chunk_ids, chunk_starts) -> tuple[np.ndarray, ...]:
    sizes = np.asarray(chunk_sizes, dtype=np.int64).reshape(-1)
    if len(sizes) == 0:
        raise PlanError("no chunks to plan: chunk_sizes is empty")
    if (sizes < 1).any():
        bad = int(np.flatnonzero(sizes < 1)[0])
        raise PlanError(f"chunk sizes must be >= 1, chunk #{bad} has {int(sizes[bad])} rows")
    ids = np.arange(len(sizes), dtype=np.int64) if chunk_ids is None else np.asarray(chunk_ids)
    if chunk_starts is None:
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
    else:
        starts = np.asarray(chunk_starts)
    for name, arr in (("chunk_ids", ids), ("chunk_starts", starts)):
        if arr.shape != sizes.shape:
            raise PlanError(f"{name} has {arr.size} entries for {sizes.size} chunk sizes")
    return sizes, ids.astype(np.int64), starts.astype(np.int64)


def plan_fingerprint(
    chunk_sizes,
    *,
    chunk_ids=None,
    chunk_starts=None,
    batch_size: int,
    seed: int = 0,
    mode: str = "drop",
    drop_last: bool = False,
    shuffle: bool | str = True,
    shuffle_chunks: int = DEFAULT_SHUFFLE_CHUNKS,
) -> str:
    """A short hash of the chunks and of the options a resume must keep (not the world shape).

    >>> plan_fingerprint([4, 4, 2], batch_size=2) == plan_fingerprint([4, 4, 2], batch_size=3)
    False
    """
    sizes, ids, starts = _chunk_table(chunk_sizes, chunk_ids, chunk_starts)
    h = hashlib.blake2b(digest_size=8)
    for arr in (sizes, ids, starts):
        h.update(arr.astype("<i8").tobytes())
        h.update(b"|")
    shuffle = shuffle_key(shuffle)
    h.update(repr((batch_size, seed, mode, bool(drop_last), shuffle, shuffle_chunks)).encode())
    if shuffle:  # states saved before groups were dealt (``deal_order``) resume other rows
        h.update(GROUP_ORDER_VERSION)
    return h.hexdigest()


def plan_epoch(
    chunk_sizes: Sequence[int] | np.ndarray,
    *,
    chunk_ids: Sequence[int] | np.ndarray | None = None,
    chunk_starts: Sequence[int] | np.ndarray | None = None,
    world_size: int = 1,
    num_workers: int = 1,
    batch_size: int,
    seed: int = 0,
    epoch: int = 0,
    shuffle: bool | str = True,
    mode: str = "drop",
    drop_last: bool = False,
    shuffle_chunks: int = DEFAULT_SHUFFLE_CHUNKS,
) -> EpochPlan:
    """Plan one epoch over the chunks of a split.

    Parameters
    ----------
    chunk_sizes
        Rows of each chunk of the split (the last may be short).
    chunk_ids, chunk_starts
        The chunks' ids in the store and their global first rows (default: ``0, 1, ...`` and
        consecutive chunks from row 0), so that the plan speaks in global rows.
    world_size, num_workers
        Ranks, and DataLoader workers per rank (0 = read in the main process: one reader).
    batch_size, drop_last
        Rows per batch; with ``drop_last`` each rank's partial batch is dropped.
    seed, epoch, shuffle
        Chunk order and shuffle groups are seeded by these. ``shuffle`` names a shuffle of
        ``plan.shuffles.SHUFFLES`` (``True``: ``"pieces"``, ``False``: ``"none"``);
        ``"uniform"``: a uniform permutation of all rows, as one-row segments.
    mode
        ``"drop"`` the ``N mod world_size`` last rows or ``"pad"`` with repeats of the first.
    shuffle_chunks
        Segments per shuffle group of a worker.

    Raises
    ------
    PlanError
        For bad options, or when a rank would get no row (or, with ``drop_last``, no batch).

    >>> from shardload.plan.groups import worker_rows
    >>> plan = plan_epoch([3, 3, 3, 1], world_size=3, num_workers=0, batch_size=2, shuffle=False)
    >>> [worker_rows(plan, r, 0).tolist() for r in range(3)], plan.num_dropped
    ([[0, 1, 2], [3, 4, 5], [6, 7, 8]], 1)
    >>> plan_epoch([3], world_size=4, batch_size=1)
    Traceback (most recent call last):
    shardload.errors.PlanError: mode='drop' leaves no row per rank: 3 rows over world_size=4 ranks; use mode='pad' or fewer ranks
    """
    sizes, ids, starts = _chunk_table(chunk_sizes, chunk_ids, chunk_starts)
    opts = _options(world_size, num_workers, batch_size, seed, epoch, mode, shuffle_chunks)
    named = get_shuffle(shuffle)
    shuffle = named.key
    seq = named.sequence(sizes, ids, starts, np.random.default_rng((seed, epoch, 0)))
    fp = plan_fingerprint(
        sizes,
        chunk_ids=ids,
        chunk_starts=starts,
        batch_size=batch_size,
        seed=seed,
        mode=mode,
        drop_last=drop_last,
        shuffle=shuffle,
        shuffle_chunks=shuffle_chunks,
    )
    return _plan_sequence(
        seq,
        **opts,
        drop_last=bool(drop_last),
        shuffle=shuffle,
        fingerprint=fp,
        history=(),
        allow_empty=False,
    )


def _options(world_size, num_workers, batch_size, seed, epoch, mode, shuffle_chunks) -> dict:
    if mode not in MODES:
        raise PlanError(f"mode must be one of {MODES}, got {mode!r}")
    return dict(
        world_size=_check_int("world_size", world_size, 1),
        num_workers=_check_int("num_workers", num_workers, 0),
        batch_size=_check_int("batch_size", batch_size, 1),
        seed=_check_int("seed", seed, 0),
        epoch=_check_int("epoch", epoch, 0),
        mode=mode,
        shuffle_chunks=_check_int("shuffle_chunks", shuffle_chunks, 1),
    )


def _plan_sequence(
    seq: Spans,
    *,
    world_size: int,
    num_workers: int,
    batch_size: int,
    seed: int,
    epoch: int,
    mode: str,
    drop_last: bool,
    shuffle: bool | str,
    shuffle_chunks: int,
    fingerprint: str,
    history: tuple[tuple[int, int, int], ...],
    allow_empty: bool,
) -> EpochPlan:
    """Cut a sequence over ranks and workers (shared by :func:`plan_epoch` and elastic resume)."""
    n, world, b = seq.num_rows, world_size, batch_size
    n_r = n // world if mode == "drop" else -(-n // world)
    nb = n_r // b if drop_last else -(-n_r // b)
    if nb == 0 and not allow_empty:
        if n == 0:
            raise PlanError("no rows to plan")
        if n_r == 0:
            raise PlanError(
                f"mode='drop' leaves no row per rank: {n} rows over world_size={world} ranks; "
                "use mode='pad' or fewer ranks"
            )
        raise PlanError(
            f"drop_last leaves no batch: each of world_size={world} ranks gets {n_r} rows "
            f"({n} in all), fewer than batch_size={b}; use a smaller batch, fewer ranks or "
            "drop_last=False"
        )
    used = min(n_r, nb * b)
    if nb == 0:
        n_r = used = 0
    pad = world * n_r - n if mode == "pad" else 0
    if pad > 0:  # the first rows again, cyclically (N may be smaller than the pad)
        reps = -(-pad // n)
        seq = concat_spans([seq] * (1 + reps), seq.explicit).take(0, n + pad)
    distinct = _rows_yielded(n, n_r, used, world, pad)
    key = (seed, epoch, 1 + len(history))  # an elastic resume shuffles its groups afresh
    workers = _worker_plans(seq, world, n_r, nb, b, used, num_workers, key)
    return EpochPlan(
        world_size=world,
        num_workers=num_workers,
        batch_size=b,
        epoch=epoch,
        seed=seed,
        mode=mode,
        drop_last=drop_last,
        shuffle=shuffle,
        shuffle_chunks=shuffle_chunks,
        workers=workers,
        num_rows=n,
        num_dropped=n - distinct,
        num_padded=world * used - distinct,
        batches_per_rank=int(nb),
        fingerprint=fingerprint,
        history=history,
    )


def _worker_plans(
    seq: Spans,
    world: int,
    n_r: int,
    nb: int,
    b: int,
    used: int,
    num_workers: int,
    key: tuple[int, int, int],
) -> tuple[tuple[WorkerPlan, ...], ...]:
    """Each rank's part of ``seq`` (``n_r`` rows, ``used`` of them yielded in ``nb`` batches of
    ``b``) cut over its readers: worker ``w`` gets batches ``w, w + W, ...`` as contiguous rows,
    the partial batch (the rank's last) included; ``key`` starts their shuffle seeds."""
    readers = max(1, num_workers)
    nbw = nb // readers + (np.arange(readers) < nb % readers)
    rows_w = nbw * b
    if nb:
        rows_w[(nb - 1) % readers] -= nb * b - used  # the partial batch: the rank's last one
    offs = np.concatenate(([0], np.cumsum(rows_w)))
    return tuple(
        tuple(
            WorkerPlan(
                rank=r,
                worker=w,
                num_rows=int(rows_w[w]),
                num_batches=int(nbw[w]),
                skip_rows=0,
                seed_key=(*key, r, w),
                spans=seq.take(r * n_r + int(offs[w]), r * n_r + int(offs[w + 1])),
            )
            for w in range(readers)
        )
        for r in range(world)
    )


def _rows_yielded(n: int, n_r: int, used: int, world: int, pad: int) -> int:
    """How many distinct positions ``< n`` of the sequence some rank yields.

    Rank ``r`` yields positions ``[r n_r, r n_r + used)`` of the padded sequence; position
    ``j >= n`` repeats position ``(j - n) mod n``.
    """
    if used == 0:
        return 0
    r0 = np.arange(world, dtype=np.int64) * n_r
    main = int(np.clip(np.minimum(r0 + used, n) - r0, 0, None).sum())
    extra = {(j - n) % n for j in range(n, n + pad) if j % n_r < used}
    return main + sum(1 for o in extra if o % n_r >= used)
