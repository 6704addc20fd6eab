"""``iter_batches``: numpy batches of one (rank, worker) of an epoch, for any framework.

Data flows one way: the user's options become a :class:`~shardload.load.spec.LoadSpec` (once),
the spec plans the epoch (``plan.epoch``, or ``plan.resume`` for a resume state), and the group
reader of the spec's read kind reads the worker's groups into batches in plan order
(:mod:`.gather`, :mod:`.scatter`, :mod:`.decoded`, :mod:`.ragged`, :mod:`.windows`).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from shardload.errors import PlanError
from shardload.load.cache_hook import plan_node_cache
from shardload.load.checks import checked_allocate
from shardload.load.dated import dated_window_batches
from shardload.load.decoded import decode_batches, decoded_sources
from shardload.load.gather import gather_batches
from shardload.load.kinds import ReadKind, read_kind
from shardload.load.options import check_nonneg
from shardload.load.owned import Batches
from shardload.load.ragged import PaddingStats, ragged_batches
from shardload.load.recycle import (
    INDEX_KEY,
    Allocate,
    BatchRecycler,
    batch_specs,
    new_batch,
    store_recycler,
    take_up_kept,
)
from shardload.load.scatter import batches_per_group, groups_in_flight, raw_sources, scatter_batches
from shardload.load.spec import LoadSpec
from shardload.load.url_plan import plan_url_reads
from shardload.load.windows import window_batches
from shardload.plan.epoch import EpochPlan
from shardload.plan.read_groups import ReadGroupAxis, ReadGroupSize
from shardload.plan.resume import EpochState, skip_worker_batches
from shardload.store.core import Store

__all__ = ["INDEX_KEY", "iter_batches", "read_batches"]


def iter_batches(
    store: str | os.PathLike[str] | Store,
    *,
    batch_size: int,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    shuffle: bool | str = True,
    seed: int = 0,
    epoch: int = 0,
    mode: str = "drop",
    split: str | None = None,
    chunks: Sequence[int] | None = None,
    rows: tuple[int, int] | None = None,
    arrays: Sequence[str] | None = None,
    drop_last: bool = False,
    shuffle_chunks: int | None = None,
    piece_rows: int | None = None,
    prefetch: int | None = None,
    threads: int | None = None,
    state: EpochState | Mapping[str, Any] | None = None,
    storage_options: Mapping[str, Any] | None = None,
    skip_batches: int = 0,
    allocate: Allocate | None = None,
    padding_stats: PaddingStats | None = None,
    bucket: bool | str = False,
    missing_dates: str = "skip",
    window: int | None = None,
    window_step: int | None = None,
    read_group_size: ReadGroupSize = 1,
    read_group_axis: ReadGroupAxis = -1,
    window_views: bool = False,
) -> Batches:
    """Batches of one worker of one rank, as dicts of numpy arrays plus ``"index"``.

    Every rank gets the same number of batches (``mode`` ``"drop"`` or ``"pad"``), and the
    batches of workers ``0..num_workers-1`` interleaved round-robin are the rank's batches in
    order (``num_workers=1``: this iterator alone is the rank's sequence). ``"index"`` holds the
    global row numbers (int64) of the batch's samples.

    Parameters
    ----------
    store
        A path, an fsspec URL, or a Store. A store opened here from a path or URL is closed
        when the iterator ends, fails, is closed (``.close()``, a ``with`` block) or is
        dropped, started or not; a Store passed in stays open.
    batch_size, drop_last
        Samples per batch; a rank's last batch may be short unless ``drop_last``.
    rank, world_size, worker, num_workers
        Who is reading. ``num_workers=0`` means the same as 1 (reading in the main process).
    shuffle, seed, epoch, mode
        Chunk order and shuffle groups are seeded by ``(seed, epoch)``; see ``plan_epoch``.
        ``shuffle`` names a shuffle of ``shardload.plan.shuffles.SHUFFLES``: ``True`` is
        ``"pieces"`` (the default below), ``False`` is ``"none"``, ``"chunks"`` the earlier
        default (groups of 4 pieces of at most 8 MiB: ``shuffle=True, shuffle_chunks=4``).
        ``shuffle="uniform"`` (raw rows in local files only: uncompressed Zarr, npy): an
        exact uniform permutation of all rows every epoch, each row read where it lies
        (a batch's rows sorted by file offset, runs coalesced into one ``preadv`` each); no
        buffer of the store, so it works for stores larger than RAM.
    split, chunks, rows, arrays
        What to read: a split, or explicit chunk ids, and/or a global ``(start, stop)`` row
        range; which arrays (default all).
    missing_dates
        A dated store's missing dates (``store.time.missing``, e.g. an anemoi-datasets
        store's ``missing_dates``): ``"skip"`` (default) leaves their rows out of the epoch,
        ``"error"`` raises a ``PlanError`` naming the first one the selection holds,
        ``"include"`` yields them as stored (NaN, or the fill value).
    shuffle_chunks
        Pieces whose rows are shuffled together (the shuffle buffer, in pieces).
    piece_rows
        The shuffle unit: chunks longer than this are cut into equal pieces of at most
        ``piece_rows`` rows, which the plan shuffles (in rounds of one piece per chunk),
        spreads over ranks and workers, and groups as it would chunks. Defaults
        (:func:`resolve_shuffle`): on raw rows in local files (uncompressed Zarr, npy stacks),
        groups of as many rows as 4 pieces of at most 8 MiB, cut into
        ``DEFAULT_GROUP_PIECES`` (256) small pieces (up to 512 when batches hold more than
        a 256th of the group, so a piece has no more rows than the group has batches), so a
        group holds pieces of every chunk; the group deals each piece's rows to different
        batches, and a batch mixes as many chunks as a uniform shuffle; with only ``shuffle_chunks``
        given, pieces of at most 8 MiB (``shuffle_chunks=4``: the earlier default, 4 chunks
        per batch). Other stores (compressed Zarr, HDF5, remote: a piece of a compressed
        chunk would decode the whole chunk): whole chunks, groups of as many chunks as hold
        64 MiB of the selected arrays decoded (4 chunks of prepare's default 16 MiB), at least
        4, at most 4,096 (:func:`whole_chunk_group`; stores with variable-length arrays: 4),
        so a store of small chunks mixes many chunks per batch. ``0``: whole chunks.
    prefetch, threads
        Pieces read ahead in background threads (``threads``, default
        :func:`default_threads`: ``min(4, prefetch, CPUs)``, and for a local store at most
        ``CPUs // num_workers``, the reader processes sharing this machine's CPUs; by URL 32,
        requests in flight waiting their round trips together). Default
        ``prefetch`` (:func:`resolve_prefetch`): 4; on stores read by whole chunks, a
        group ahead, at most 64 MiB decoded (as 4 chunks of 16 MiB); by URL, unsharded chunk
        files up to 32 ahead across groups within those 64 MiB, and an npy stack a group.
        Memory per reader is about ``(shuffle_chunks + prefetch)`` pieces of the selected
        arrays, plus the batches the caller holds.
    state
        Resume mid-epoch from an :class:`~shardload.plan.resume.EpochState` (or its dict, as
        saved by ``shardload.torch``); the epoch is the state's. The world shape may differ
        from the saved one (the unseen rows are re-planned).
    skip_batches
        Leave out this worker's first ``skip_batches`` batches without reading them (a
        per-worker resume, as ``torchdata``'s ``StatefulDataLoader`` restores workers).
    allocate
        ``allocate(n)`` returns the arrays (one per array name and ``"index"``) a batch of ``n``
        rows is gathered into, or None for fresh ones (``shardload.torch`` passes its
        shared-memory ring). The caller must not reuse them before the batch is consumed.
        Not used for stores with variable-length arrays (their batch width varies).
    padding_stats
        A :class:`~shardload.load.ragged.PaddingStats` that counts the values and padded
        cells of the batches of variable-length arrays (the padding waste).
    bucket
        Length-bucketed batches (variable-length arrays, ``shuffle=True``): each shuffle
        group's rows are sorted by length and dealt to its batches in a random batch order, so
        a batch holds rows of similar length (less padding; batch counts, resume and the rows
        of each group unchanged). ``True``: by the summed lengths of the selected
        variable-length arrays; a name: by that array's lengths. Larger ``shuffle_chunks``
        buckets over more rows.
    read_group_size, read_group_axis
        Read groups for model parallelism: ranks ``0..G-1`` form group 0, ``G..2G-1`` group 1,
        ...; the ranks of a group get the same batches in the same order (the epoch is planned
        over ``world_size // G`` groups, and a resume state is a group's), and each reads only
        its slice of ``read_group_axis`` of every array's rows (an axis of the row, default
        -1, the last; or ``{array: axis or None}``; None: that array whole), the slices cut as
        ``np.array_split`` cuts the axis. Two levels, ``read_group_size=(E, G)`` with
        ``read_group_axis=(members_axis, grid_axis)`` (each as above): groups of ``E * G``
        ranks; member ``m`` of a group reads member slice ``m // G`` and grid slice ``m % G``
        (docs/weather.md). See docs/loading.md ("Read groups").

    window, window_step
        Windows of dates on a dated store (one with a time axis, ``store.time``): a sample is
        ``window`` states every ``window_step`` (default 1) rows, and each array comes as
        ``NAME`` of shape ``(B, window, *row_shape)``, with ``"dates"`` (``datetime64[s]``,
        ``(B, window)``) and ``"index"`` the first row of each window. Only windows whose every
        date exists and lies in the selection are planned; shuffle, ranks, splits and resume
        are over windows; a state shared by windows of a batch is read once (docs/weather.md).
    window_views
        With ``window``: serve each array read-only, and a batch whose windows come in date
        order (evenly spaced, as with ``shuffle=False``) as one strided view of its distinct
        states instead of copying each shared state to every window holding it. Not with
        ``allocate``. Values are the same; the arrays may overlap in memory (docs/weather.md).

    Variable-length arrays (one 1-D array per sample, ``store.ragged``) come as ``NAME``, a
    ``(rows, longest row of the batch)`` array zero-padded after each row's values, and
    ``NAME_length`` (int64): see docs/loading.md ("Variable-length arrays").

    Raises
    ------
    PlanError
        Bad options, or a batch larger than a rank's share with ``drop_last``, or no row per
        rank.
    StateError
        A ``state`` saved for other data, chunks, seed or options.
    StoreError
        Unknown split or array, unaligned arrays; ``ChunkReadError`` while iterating when a
        chunk is missing or corrupt.

    Examples
    --------
    >>> for batch in iter_batches("store", batch_size=256, split="train", epoch=0):  # doctest: +SKIP
    ...     x, y, idx = batch["x"], batch["y"], batch["index"]
    """
    spec = LoadSpec.build(
        store,
        batch_size=batch_size,
        split=split,
        chunks=chunks,
        rows=rows,
        arrays=arrays,
        shuffle=shuffle,
        seed=seed,
        mode=mode,
        drop_last=drop_last,
        shuffle_chunks=shuffle_chunks,
        piece_rows=piece_rows,
        prefetch=prefetch,
        threads=threads,
        bucket=bucket,
        storage_options=storage_options,
        missing_dates=missing_dates,
        window=window,
        window_step=window_step,
        read_group_size=read_group_size,
        read_group_axis=read_group_axis,
    )
    owned = None if isinstance(store, Store) else spec.store  # opened here: closed here
    if owned is not None:
        take_up_kept(owned)  # the buffers the last epoch's store of this path kept
    try:
        batches = read_batches(
            spec,
            rank=rank,
            world_size=world_size,
            worker=worker,
            num_workers=num_workers,
            epoch=epoch,
            state=state,
            skip_batches=skip_batches,
            allocate=allocate,
            padding_stats=padding_stats,
            window_views=window_views,
        )
    except BaseException:
        if owned is not None:
            owned.close()
        raise
    return Batches(batches, owned)


def read_batches(
    spec: LoadSpec,
    *,
    rank: int = 0,
    world_size: int = 1,
    worker: int = 0,
    num_workers: int = 1,
    epoch: int = 0,
    state: EpochState | Mapping[str, Any] | None = None,
    skip_batches: int = 0,
    allocate: Allocate | None = None,
    padding_stats: PaddingStats | None = None,
    window_views: bool = False,
    plan: EpochPlan | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """The batches of one worker of one rank of ``spec``'s store (:func:`iter_batches` after
    its options are resolved): the epoch is planned, and checked, before this returns. With
    read groups, ``rank`` and ``world_size`` are the world's; the plan is the groups'.
    ``plan``: ``spec.plan`` of these arguments if the caller has it (a DataLoader worker gets
    its main process's), instead of planning again."""
    if not 0 <= rank < world_size:
        raise PlanError(f"rank={rank} is not within 0..{world_size - 1}")
    rank, world_size, member = spec.split_rank(rank, world_size)
    if plan is None:
        plan = spec.plan(world_size=world_size, num_workers=num_workers, epoch=epoch, state=state)
    elif (plan.world_size, plan.num_workers, plan.epoch) != (world_size, num_workers, epoch):
        raise PlanError(
            f"the plan given is of {plan.world_size} ranks, {plan.num_workers} workers, epoch "
            f"{plan.epoch}; this read is of {world_size}, {num_workers}, epoch {epoch}"
        )
    readers = max(1, int(num_workers))
    if not 0 <= worker < readers:
        raise PlanError(f"worker={worker} is not within 0..{readers - 1}")
    skip = check_nonneg("skip_batches", skip_batches)
    if skip:
        plan = skip_worker_batches(plan, rank, worker, skip)
    warm = plan_node_cache(spec, plan, rank, worker)  # the node cache's schedule, if any
    prefetch, threads = spec.read_ahead(readers, warm=bool(warm))  # warm: read in place
    st = spec.member_store(member)
    plan_url_reads(st, spec.selection.arrays, plan, rank, worker)  # by URL: what to keep
    kind = spec.kind if st is spec.store else read_kind(st, spec.selection.arrays)
    if window_views and spec.window is None:
        raise PlanError("window_views=True needs window= (windows of dates)")
    if window_views and allocate is not None:
        raise PlanError(
            "window_views=True serves windows as views of the loader's own batch memory; "
            "it cannot be combined with allocate= (whose memory is read as laid out)"
        )
    views = bool(window_views)
    ahead = (prefetch, threads)
    return _read(spec, st, kind, plan, rank, worker, ahead, allocate, padding_stats, views)


def _read(
    spec: LoadSpec,
    st: Store,
    kind: ReadKind,
    plan: EpochPlan,
    rank: int,
    worker: int,
    ahead: tuple[int, int],
    allocate: Allocate | None,
    padding_stats: PaddingStats | None,
    views: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """Run the group reader of ``kind`` over ``st`` (``spec``'s store, or a read group
    member's slice of it; a generator: nothing runs before the first batch is asked for),
    ``ahead``: its ``(prefetch, threads)``."""
    names, (prefetch, threads) = spec.selection.arrays, ahead
    if kind == "ragged":
        yield from ragged_batches(
            st,
            names,
            plan,
            rank,
            worker,
            prefetch=prefetch,
            threads=threads,
            index_key=INDEX_KEY,
            padding_stats=padding_stats,
        )
        return
    if spec.window is not None:  # windows of dates (load/dated.py)
        win = (spec.window, prefetch, threads)
        yield from dated_window_batches(
            st, names, plan, rank, worker, *win, allocate=allocate, views=views
        )
        return
    if allocate is None:  # reuse the memory of batches the caller has dropped
        spans = plan.workers[rank][worker].spans
        longest = int((spans.hi - spans.lo).max()) if len(spans) else 1
        allocate = batch_recycler(st, names, plan, prefetch, chunk_rows=longest).allocate
    else:  # the caller's arrays: checked before any read or gather writes into them
        allocate = checked_allocate(allocate, batch_specs(st, names))
    specs = {a: st.manifest.arrays[a] for a in names}
    raw = raw_sources(st, names) if kind == "scatter" else None
    into: dict[str, Any] = dict(  # the readers that write rows straight into their batches
        prefetch=prefetch,
        threads=threads,
        new_batch=lambda n: new_batch(specs, n),
        index_key=INDEX_KEY,
        allocate=allocate,
    )
    if kind == "window":  # windows cut at load time (load/windows.py)
        yield from window_batches(st, names, plan, rank, worker, **into)
    elif raw is not None:  # raw local chunks: straight into the batches (load/scatter.py)
        yield from scatter_batches(st, names, plan, rank, worker, raw=raw, **into)
    elif decoded_sources(st, names):  # compressed local shards, decoded in (load/decoded.py)
        yield from decode_batches(st, names, plan, rank, worker, **into)
    else:
        yield from gather_batches(
            st, names, plan, rank, worker, prefetch=prefetch, threads=threads, allocate=allocate
        )


def batch_recycler(
    store: Store, names: Sequence[str], plan: EpochPlan, prefetch: int, *, chunk_rows: int
) -> BatchRecycler:
    """The store's recycler of batches of ``names`` and ``plan.batch_size`` rows, keeping idle
    about the batches of the groups a worker has in flight (``chunk_rows``: the longest piece
    it reads); one per store and layout, shared by its iterators (thread-safe)."""
    group_batches = batches_per_group(
        chunk_rows=chunk_rows, shuffle_chunks=plan.shuffle_chunks, batch_size=plan.batch_size
    )
    groups = groups_in_flight(prefetch=prefetch, shuffle_chunks=plan.shuffle_chunks)
    keep = (groups + 1) * group_batches + 8
    return store_recycler(store, batch_specs(store, names), plan.batch_size, keep=keep)
