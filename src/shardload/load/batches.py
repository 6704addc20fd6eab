"""``iter_batches``: numpy batches of one (rank, worker) of an epoch, for any framework."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import Any

import numpy as np

from shardload.errors import PlanError, StateError
from shardload.load.checks import check_indices, checked_allocate
from shardload.load.ragged import PaddingStats, ragged_batches, ragged_names, resolve_buckets
from shardload.load.reader import BufferPool, Group, read_groups
from shardload.load.recycle import Allocate, BatchRecycler
from shardload.load.scatter import (
    batches_per_group,
    groups_in_flight,
    raw_rows,
    raw_sources,
    scatter_batches,
)
from shardload.load.select import (
    Selection,
    plan_piece_rows,
    select_rows,
    split_pieces,
    store_fingerprint,
)
from shardload.load.windows import window_batches
from shardload.manifest.ragged import LENGTH_SUFFIX
from shardload.plan.buckets import bucketed_fingerprint
from shardload.plan.chunks import DEFAULT_TARGET_CHUNK_BYTES
from shardload.plan.epoch import (
    DEFAULT_SHUFFLE_CHUNKS,
    EpochPlan,
    PlanOptions,
    group_batches,
    iter_worker_groups,
    plan_epoch,
    plan_fingerprint,
)
from shardload.plan.resume import EpochState, plan_from_state
from shardload.store.core import Store, open_store
from shardload.store.windows import WindowReader

#: Segments (at most a chunk each) read ahead of the group being yielded.
DEFAULT_PREFETCH = DEFAULT_SHUFFLE_CHUNKS
INDEX_KEY = "index"
#: Batch pieces smaller than this are gathered in the calling thread (no thread hop).
INLINE_GATHER_BYTES = 256 * 1024
#: ``piece_rows=None`` on raw local chunks: cut chunks into pieces of at most this many bytes
#: (all selected arrays and the index), the loader's unit of shuffling and of memory.
DEFAULT_PIECE_BYTES = 8 << 20
#: ``piece_rows=None, shuffle_chunks=None`` on raw local chunks (the default): a shuffle group
#: holds as many rows as ``DEFAULT_SHUFFLE_CHUNKS`` pieces of ``DEFAULT_PIECE_BYTES`` (the
#: memory of the earlier default), cut into this many small pieces drawn from all chunks, so a
#: batch mixes rows of as many chunks as a uniform shuffle's (see docs/loading.md, "Shuffle
#: quality"). Scatter reads make a small piece cheap: one read of a few rows. The group deals
#: a piece's rows to different batches (``plan.epoch.deal_order``), so a piece may hold as
#: many rows as the group has batches; more pieces (up to ``MAX_GROUP_PIECES``) where batches
#: are bigger (:func:`resolve_shuffle`).
DEFAULT_GROUP_PIECES = 256
#: The most pieces a default group is cut into (batches of more than group rows / 256).
MAX_GROUP_PIECES = 512
#: ``shuffle_chunks=None, piece_rows=None`` on stores read by whole chunks (compressed Zarr,
#: HDF5, remote stores): a group holds as many decoded bytes as ``DEFAULT_SHUFFLE_CHUNKS``
#: chunks of prepare's default chunk size (``plan.chunks.DEFAULT_TARGET_CHUNK_BYTES``), and at
#: least ``DEFAULT_SHUFFLE_CHUNKS`` chunks: stores of default chunks plan as before, and a store
#: of small chunks mixes rows of many more chunks in the same memory (docs/loading.md).
WHOLE_CHUNK_GROUP_BYTES = DEFAULT_SHUFFLE_CHUNKS * DEFAULT_TARGET_CHUNK_BYTES
#: The most chunks a default whole-chunk group holds (each chunk read is a task of its own).
MAX_GROUP_CHUNKS = 4096


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
) -> Iterator[dict[str, np.ndarray]]:
    """Batches of one worker of one rank, as dicts of numpy arrays plus ``"index"``.

    Every rank gets the same number of batches (``mode`` ``"drop"`` or ``"pad"``), and the
    batches of workers ``0..num_workers-1`` interleaved round-robin are the rank's batches in
    order (``num_workers=1``: this iterator alone is the rank's sequence). ``"index"`` holds the
    global row numbers (int64) of the batch's samples.

    Parameters
    ----------
    store
        A path, an fsspec URL, or a :class:`~shardload.store.core.Store`.
    batch_size, drop_last
        Samples per batch; a rank's last batch may be short unless ``drop_last``.
    rank, world_size, worker, num_workers
        Who is reading. ``num_workers=0`` means the same as 1 (reading in the main process).
    shuffle, seed, epoch, mode
        Chunk order and shuffle groups are seeded by ``(seed, epoch)``; see ``plan_epoch``.
        ``shuffle="uniform"`` (raw rows in local files only: uncompressed Zarr, npy): an
        exact uniform permutation of all rows every epoch, each row read where it lies
        (a batch's rows sorted by file offset, runs coalesced into one ``preadv`` each); no
        buffer of the store, so it works for stores larger than RAM.
    split, chunks, rows, arrays
        What to read: a split, or explicit chunk ids, and/or a global ``(start, stop)`` row
        range; which arrays (default all).
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
        ``CPUs // num_workers``, the reader processes sharing this machine's CPUs). Default
        ``prefetch`` (:func:`resolve_prefetch`): 4; on stores read by whole chunks, a
        group ahead, at most 64 MiB decoded (as 4 chunks of 16 MiB).
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
    st = open_store(store, storage_options=storage_options, arrays=arrays)
    sel, piece, shuffle_chunks = loader_selection(
        st, split=split, chunks=chunks, rows=rows, arrays=arrays, piece_rows=piece_rows,
        shuffle_chunks=shuffle_chunks, shuffle=shuffle, batch_size=batch_size,
    )  # fmt: skip
    plan = plan_for(
        st, sel, batch_size=batch_size, world_size=world_size, num_workers=num_workers,
        shuffle=shuffle, seed=seed, epoch=epoch, mode=mode, drop_last=drop_last,
        shuffle_chunks=shuffle_chunks, state=state, bucket=bucket,
    )  # fmt: skip
    readers = max(1, int(num_workers))
    if not 0 <= rank < world_size:
        raise PlanError(f"rank={rank} is not within 0..{world_size - 1}")
    if not 0 <= worker < readers:
        raise PlanError(f"worker={worker} is not within 0..{readers - 1}")
    prefetch = resolve_prefetch(st, sel, prefetch, shuffle_chunks=shuffle_chunks, piece_rows=piece)
    threads = (
        default_threads(prefetch, readers, local=st.is_local)
        if threads is None
        else max(1, int(threads))
    )
    skip = _check_nonneg("skip_batches", skip_batches)
    if skip:
        plan = skip_worker_batches(plan, rank, worker, skip)
    if ragged_names(st, sel.arrays):
        return ragged_batches(
            st, sel.arrays, plan, rank, worker, prefetch=prefetch, threads=threads,
            index_key=INDEX_KEY, padding_stats=padding_stats,
        )  # fmt: skip
    return _batches(
        st, sel.arrays, plan, rank, worker, prefetch=prefetch, threads=threads, allocate=allocate
    )


def loader_selection(
    store: Store,
    *,
    split: str | None = None,
    chunks: Sequence[int] | None = None,
    rows: tuple[int, int] | None = None,
    arrays: Sequence[str] | None = None,
    piece_rows: int | None = None,
    shuffle_chunks: int | None = None,
    shuffle: bool | str = True,
    batch_size: int | None = None,
) -> tuple[Selection, int, int]:
    """The selection a loader plans over: :func:`select_rows` cut into pieces, the rows per
    piece it was cut with and the pieces per shuffle group (:func:`resolve_shuffle`; pass both
    on, e.g. to workers, so nothing decides them twice)."""
    sel = select_rows(store, split=split, chunks=chunks, rows=rows, arrays=arrays)
    for name in ragged_names(store, sel.arrays):
        if name + LENGTH_SUFFIX in store.manifest.arrays:
            raise PlanError(
                f"variable-length array {name!r} of {store.url}: its batches carry its lengths "
                f"as {name + LENGTH_SUFFIX!r}, which is also an array of the store; rename one"
            )
    piece, group = resolve_shuffle(
        store, sel, piece_rows, shuffle_chunks, shuffle, batch_size=batch_size
    )
    return split_pieces(sel, piece), piece, group


def resolve_shuffle(
    store: Store,
    sel: Selection,
    piece_rows: int | None,
    shuffle_chunks: int | None,
    shuffle: bool | str = True,
    *,
    batch_size: int | None = None,
) -> tuple[int, int]:
    """``(piece_rows, shuffle_chunks)`` checked, with the defaults filled in. Depends on the
    store and the batch size only, never on the platform, so every rank plans the same pieces.

    - Raw rows in local files (uncompressed Zarr, npy), both None (the default): a group holds
      the rows of ``DEFAULT_SHUFFLE_CHUNKS`` pieces of at most ``DEFAULT_PIECE_BYTES`` (the
      earlier default's memory), as ``DEFAULT_GROUP_PIECES`` small pieces, or more (at most
      ``MAX_GROUP_PIECES``) so that a piece has no more rows than the group has batches of
      ``batch_size`` (its rows are dealt to different batches).
    - Only ``shuffle_chunks`` given: pieces of at most ``DEFAULT_PIECE_BYTES`` (raw local
      chunks) or whole chunks, as before small pieces were the default
      (``shuffle_chunks=4`` is that earlier default).
    - Any other store (read by whole chunks: a piece of a compressed chunk would decode the
      whole chunk), both None: groups of :func:`whole_chunk_group` chunks, as many as hold
      ``WHOLE_CHUNK_GROUP_BYTES`` (64 MiB) decoded, at least ``DEFAULT_SHUFFLE_CHUNKS``; only
      ``piece_rows`` given: ``DEFAULT_SHUFFLE_CHUNKS`` per group.
    - ``shuffle="uniform"`` (raw local chunks only): whole chunks (the planner cuts rows
      itself) and groups of as many rows as the default.
    """
    # variable-length arrays are read by whole chunks (loader/ragged.py), never as raw rows;
    # windows cut at load time are read each where it lies, as raw rows are
    raw = (not ragged_names(store, sel.arrays) and raw_rows(store, sel.arrays)) or isinstance(
        store.reader, WindowReader
    )
    if shuffle_chunks is not None:
        shuffle_chunks = _check_int1("shuffle_chunks", shuffle_chunks)
    if piece_rows is not None:
        piece_rows = _check_nonneg("piece_rows", piece_rows)
    infos = store.manifest.arrays
    row_bytes = sum(infos[a].row_bytes for a in sel.arrays) + 8
    chunk_rows = int(np.diff(np.asarray(store.manifest.chunk_bounds)).max())
    big_piece = plan_piece_rows(chunk_rows, row_bytes, DEFAULT_PIECE_BYTES)
    group_rows = DEFAULT_SHUFFLE_CHUNKS * big_piece  # the earlier default's resident rows
    if shuffle == "uniform":
        if ragged_names(store, sel.arrays):
            raise PlanError(
                f"shuffle='uniform' is not available for variable-length arrays "
                f"{ragged_names(store, sel.arrays)} of {store.url}: they are read by whole "
                "chunks (use shuffle=True)"
            )
        if not raw:
            raise PlanError(
                f"shuffle='uniform' reads rows where they lie and needs raw rows in local files "
                f"(uncompressed Zarr or npy on a local disk); {store.url} arrays "
                f"{list(sel.arrays)} are not (use shuffle=True)"
            )
        return 0, shuffle_chunks or group_rows
    if piece_rows is None:
        if not raw:
            piece_rows = 0
            if shuffle_chunks is None:
                shuffle_chunks = whole_chunk_group(store, sel)
        elif shuffle_chunks is not None:
            piece_rows = big_piece
        else:
            per_batch = group_rows // max(1, batch_size or 1)  # the group's batches
            piece_rows = max(
                group_rows // MAX_GROUP_PIECES, min(group_rows // DEFAULT_GROUP_PIECES, per_batch)
            )
            piece_rows = max(1, piece_rows)
            shuffle_chunks = max(1, group_rows // piece_rows)
    return piece_rows, shuffle_chunks or DEFAULT_SHUFFLE_CHUNKS


def whole_chunk_group(store: Store, sel: Selection) -> int:
    """Chunks per default shuffle group of a store read by whole chunks: as many as hold
    ``WHOLE_CHUNK_GROUP_BYTES`` decoded bytes of the selected arrays, at least
    ``DEFAULT_SHUFFLE_CHUNKS``, at most ``MAX_GROUP_CHUNKS`` (pure: the manifest only). Stores
    with variable-length arrays keep ``DEFAULT_SHUFFLE_CHUNKS`` (their decoded size varies)."""
    if ragged_names(store, sel.arrays) or not len(store.manifest.chunk_bounds) > 1:
        return DEFAULT_SHUFFLE_CHUNKS
    infos = store.manifest.arrays
    chunk_rows = int(np.diff(np.asarray(store.manifest.chunk_bounds)).max())
    chunk_bytes = max(1, chunk_rows * sum(infos[a].row_bytes for a in sel.arrays))
    return int(
        min(MAX_GROUP_CHUNKS, max(DEFAULT_SHUFFLE_CHUNKS, WHOLE_CHUNK_GROUP_BYTES // chunk_bytes))
    )


def resolve_prefetch(
    store: Store, sel: Selection, prefetch: int | None, *, shuffle_chunks: int, piece_rows: int
) -> int:
    """``prefetch`` checked, or its default: for stores read by whole chunks (``piece_rows``
    0) a group's worth of chunks ahead when default groups are larger than
    ``DEFAULT_SHUFFLE_CHUNKS`` (:func:`whole_chunk_group`: small chunks, so at most
    ``WHOLE_CHUNK_GROUP_BYTES`` decoded ahead, as ``DEFAULT_PREFETCH`` chunks of the default
    size), else ``DEFAULT_PREFETCH`` segments. Decides no row order (not in the plan)."""
    if prefetch is not None:
        return _check_nonneg("prefetch", prefetch)
    if piece_rows or isinstance(store.reader, WindowReader) or raw_rows(store, sel.arrays):
        return DEFAULT_PREFETCH
    return max(DEFAULT_PREFETCH, min(shuffle_chunks, whole_chunk_group(store, sel)))


def skip_worker_batches(plan: EpochPlan, rank: int, worker: int, skip: int) -> EpochPlan:
    """``plan`` with worker ``worker`` of ``rank`` starting after its first ``skip`` batches.

    >>> from shardload.plan.epoch import iter_worker_batches
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
        wp, num_rows=wp.num_rows - rows, num_batches=wp.num_batches - skip,
        skip_rows=wp.skip_rows + rows,
    )  # fmt: skip
    ranks = list(plan.workers)
    ranks[rank] = (*plan.workers[rank][:worker], wp, *plan.workers[rank][worker + 1 :])
    return replace(plan, workers=tuple(ranks))


def default_threads(prefetch: int, readers: int, *, local: bool) -> int:
    """Reader threads of one reader by default: ``min(4, prefetch, CPUs)``; for a local store
    at most ``CPUs // readers`` (``readers``: the DataLoader workers reading the same rank),
    since its reads are CPU work (decoding, copies from the page cache) and more threads than
    CPUs only contend: 2 workers of 1 thread each on 2 CPUs load a zstd store as fast as 2
    workers of 2, with the first batch sooner and 8-12% less memory (docs/benchmarks.md,
    session 11). A remote store's threads wait on the network, so they keep the CPU count."""
    cpus = _cores()
    if local:
        cpus = max(1, cpus // max(1, readers))
    return min(4, max(1, prefetch), cpus)


def _cores() -> int:
    """CPUs this process may run on (more reader threads than that only contend)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _check_int1(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise PlanError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_nonneg(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise PlanError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def plan_for(
    store: Store, sel: Selection, *, batch_size: int, world_size: int, num_workers: int,
    shuffle: bool | str, seed: int, epoch: int, mode: str, drop_last: bool, shuffle_chunks: int,
    state: EpochState | Mapping[str, Any] | None = None, bucket: bool | str = False,
) -> EpochPlan:  # fmt: skip
    """The epoch plan of a selection, fresh or resumed from ``state``."""
    opts: PlanOptions = dict(
        batch_size=batch_size, seed=seed, mode=mode, drop_last=drop_last, shuffle=shuffle,
        shuffle_chunks=shuffle_chunks,
    )  # fmt: skip
    buckets = resolve_buckets(store, sel.arrays, bucket, shuffle)
    if state is None:
        plan = plan_epoch(
            sel.sizes, chunk_ids=sel.ids, chunk_starts=sel.starts, **opts,
            world_size=world_size, num_workers=num_workers, epoch=epoch,
        )  # fmt: skip
        if buckets is None:
            return plan
        return replace(plan, buckets=buckets, fingerprint=bucketed_fingerprint(plan.fingerprint))
    if isinstance(state, Mapping):
        data = state.get("dataset")
        if data is not None and data != store_fingerprint(store, sel):
            raise StateError(
                f"the resume state was saved for other data (dataset fingerprint {data}); this "
                f"is {store.url} with arrays {list(sel.arrays)} and {len(sel.sizes)} chunks "
                f"(fingerprint {store_fingerprint(store, sel)})"
            )
        state = EpochState.from_dict(dict(state))
    try:
        return plan_from_state(
            state, sel.sizes, chunk_ids=sel.ids, chunk_starts=sel.starts, **opts,
            world_size=world_size, num_workers=num_workers, buckets=buckets,
        )  # fmt: skip
    except StateError as exc:
        hint = earlier_default_hint(sel, opts, state.fingerprint)
        if not hint:
            raise
        raise StateError(f"{exc}{hint}") from exc


def earlier_default_hint(sel: Selection, opts: PlanOptions, fingerprint: str) -> str:
    """For a refused resume state: a sentence saying it was planned with ``shuffle_chunks=4``
    (``DEFAULT_SHUFFLE_CHUNKS``, the default of every store read by whole chunks before groups
    were sized by decoded bytes, :func:`whole_chunk_group`) and how to resume it; else ''."""
    if opts["shuffle_chunks"] == DEFAULT_SHUFFLE_CHUNKS:
        return ""
    old: PlanOptions = {**opts, "shuffle_chunks": DEFAULT_SHUFFLE_CHUNKS}
    fp = plan_fingerprint(sel.sizes, chunk_ids=sel.ids, chunk_starts=sel.starts, **old)
    if fingerprint not in (fp, bucketed_fingerprint(fp)):
        return ""
    return (
        f"; it was saved with shuffle_chunks={DEFAULT_SHUFFLE_CHUNKS} (the default for stores "
        f"read by whole chunks before default groups were sized by decoded bytes; this one's is "
        f"now {opts['shuffle_chunks']}): pass shuffle_chunks={DEFAULT_SHUFFLE_CHUNKS} to resume it"
    )


def new_batch(specs: Mapping[str, Any], n: int) -> dict[str, np.ndarray]:
    """Freshly allocated, contiguous, writable arrays for a batch of ``n`` rows."""
    out = {a: np.empty((n, *s.row_shape), np.dtype(s.dtype)) for a, s in specs.items()}
    out[INDEX_KEY] = np.empty(n, np.int64)
    return out


def batch_recycler(
    store: Store, names: Sequence[str], plan: EpochPlan, prefetch: int, *, chunk_rows: int
) -> BatchRecycler:
    """A recycler that keeps idle about the batches of the groups a worker has in flight
    (``chunk_rows``: the longest piece it reads)."""
    group_batches = batches_per_group(
        chunk_rows=chunk_rows, shuffle_chunks=plan.shuffle_chunks, batch_size=plan.batch_size
    )
    groups = groups_in_flight(prefetch=prefetch, shuffle_chunks=plan.shuffle_chunks)
    keep = (groups + 1) * group_batches + 8
    return BatchRecycler(batch_specs(store, names), plan.batch_size, keep=keep)


def batch_specs(store: Store, names: Sequence[str]) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``(row_shape, dtype)`` of each array of a batch, ``"index"`` included."""
    infos = store.manifest.arrays
    specs = {a: (tuple(infos[a].row_shape), np.dtype(infos[a].dtype)) for a in names}
    specs[INDEX_KEY] = ((), np.dtype(np.int64))
    return specs


def _gather(g: Group, sel: np.ndarray, at: int, names: Sequence[str], out: dict) -> None:
    for a in names:
        np.take(g.bufs[a], sel, axis=0, out=out[a][at : at + len(sel)], mode="clip")
    np.take(g.rows, sel, out=out[INDEX_KEY][at : at + len(sel)], mode="clip")


def _batches(
    store: Store, names: Sequence[str], plan: EpochPlan, rank: int, worker: int, *,
    prefetch: int, threads: int, allocate: Allocate | None = None,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """Cut the worker's groups into batches: one gather per array per batch (two when a batch
    straddles groups), into arrays from ``allocate`` (default: fresh ones). Raw local chunks
    skip the group buffers and the gather: :mod:`.scatter` reads them into the batches.

    The gathers run in a pool of ``threads`` threads (numpy releases the GIL in ``take``), up to
    ``threads + 1`` batches ahead of the one yielded; batches are yielded in plan order, so the
    result does not depend on the thread count. Before the next group is asked for, the gathers
    from the current one are waited for and its buffers go back to the reader's pool (so a
    worker holds two groups' buffers, not three).
    """
    specs = {a: store.manifest.arrays[a] for a in names}
    if allocate is None:  # reuse the memory of batches the caller has dropped
        spans = plan.workers[rank][worker].spans
        longest = int((spans.hi - spans.lo).max()) if len(spans) else 1
        allocate = batch_recycler(store, names, plan, prefetch, chunk_rows=longest).allocate
    else:  # the caller's arrays: checked before any read or gather writes into them
        allocate = checked_allocate(allocate, batch_specs(store, names))
    if isinstance(store.reader, WindowReader):  # windows cut at load time (store/windows.py)
        yield from window_batches(
            store, names, plan, rank, worker, prefetch=prefetch, threads=threads,
            new_batch=lambda n: new_batch(specs, n), index_key=INDEX_KEY, allocate=allocate,
        )  # fmt: skip
        return
    raw = raw_sources(store, names)
    if raw is not None:  # raw local chunks: straight into the batches (loader/scatter.py)
        yield from scatter_batches(
            store, names, plan, rank, worker, raw=raw, prefetch=prefetch, threads=threads,
            new_batch=lambda n: new_batch(specs, n), index_key=INDEX_KEY, allocate=allocate,
        )  # fmt: skip
        return
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
