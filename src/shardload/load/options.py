"""The loader's defaults, and the helpers that turn a user's options into checked values.

Each depends on the store's manifest and the selection only (never on the platform), so every
rank resolves the same pieces and groups; :class:`~shardload.load.spec.LoadSpec` calls them
once. docs/loading.md ("Shuffle quality", "Memory") says why the defaults are what they are.
"""

from __future__ import annotations

import os
import warnings

import numpy as np

from shardload.errors import PlanError, ShuffleQualityWarning
from shardload.load.kinds import reads_rows_in_place
from shardload.load.ragged import ragged_names
from shardload.load.reader import plans_requests
from shardload.load.scatter import raw_rows
from shardload.load.select import Selection, plan_piece_rows
from shardload.load.windows import WindowReader
from shardload.plan.chunks import DEFAULT_TARGET_CHUNK_BYTES
from shardload.plan.epoch import DEFAULT_SHUFFLE_CHUNKS
from shardload.store.core import Store

#: Segments (at most a chunk each) read ahead of the group being yielded.
DEFAULT_PREFETCH = DEFAULT_SHUFFLE_CHUNKS
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
#: sharded, HDF5): a group holds as many decoded bytes as ``DEFAULT_SHUFFLE_CHUNKS``
#: chunks of prepare's default chunk size (``plan.chunks.DEFAULT_TARGET_CHUNK_BYTES``), and at
#: least ``DEFAULT_SHUFFLE_CHUNKS`` chunks: stores of default chunks plan as before, and a store
#: of small chunks mixes rows of many more chunks in the same memory (docs/loading.md).
WHOLE_CHUNK_GROUP_BYTES = DEFAULT_SHUFFLE_CHUNKS * DEFAULT_TARGET_CHUNK_BYTES
#: The most chunks a default whole-chunk group holds (each chunk read is a task of its own).
MAX_GROUP_CHUNKS = 4096
#: A store read by whole chunks whose default group holds fewer chunks than this (and than a
#: batch has rows), and fewer than the selection has, cannot mix well at the default: a batch
#: draws its rows from at most that many chunks (:func:`warn_unmixed`).
WELL_MIXED_CHUNKS = 256

_WARNED: set[str] = set()  # stores already warned about in this process (forks inherit it)


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
    store's manifest and the batch size only, never on the platform or where the store lives
    (:func:`~shardload.load.kinds.reads_rows_in_place`), so every rank, and every copy of the
    store (local, by URL, staged, a SquashFS image), plans the same pieces.

    - Raw rows (uncompressed Zarr, npy), both None (the default): a group holds
      the rows of ``DEFAULT_SHUFFLE_CHUNKS`` pieces of at most ``DEFAULT_PIECE_BYTES`` (the
      earlier default's memory), as ``DEFAULT_GROUP_PIECES`` small pieces, or more (at most
      ``MAX_GROUP_PIECES``) so that a piece has no more rows than the group has batches of
      ``batch_size`` (its rows are dealt to different batches).
    - Only ``shuffle_chunks`` given: pieces of at most ``DEFAULT_PIECE_BYTES`` (raw rows)
      or whole chunks, as before small pieces were the default
      (``shuffle_chunks=4`` is that earlier default).
    - Any other store (read by whole chunks: a piece of a compressed chunk would decode the
      whole chunk), both None: groups of :func:`whole_chunk_group` chunks, as many as hold
      ``WHOLE_CHUNK_GROUP_BYTES`` (64 MiB) decoded, at least ``DEFAULT_SHUFFLE_CHUNKS``; only
      ``piece_rows`` given: ``DEFAULT_SHUFFLE_CHUNKS`` per group.
    - ``shuffle="uniform"`` (raw rows only): whole chunks (the planner cuts rows
      itself) and groups of as many rows as the default.
    """
    raw = reads_rows_in_place(store, sel.arrays)
    if shuffle_chunks is not None:
        shuffle_chunks = check_int1("shuffle_chunks", shuffle_chunks)
    if piece_rows is not None:
        piece_rows = check_nonneg("piece_rows", piece_rows)
    infos = store.manifest.arrays
    row_bytes = sum(infos[a].row_bytes for a in sel.arrays) + 8
    chunk_rows = int(np.diff(store.manifest.bounds).max())
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
                f"shuffle='uniform' reads rows where they lie and needs raw rows (npy, or Zarr "
                f"prepared with compression 'none' and no shards); {store.url} arrays "
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
    chunk_rows = int(np.diff(store.manifest.bounds).max())
    chunk_bytes = max(1, chunk_rows * sum(infos[a].row_bytes for a in sel.arrays))
    return int(
        min(MAX_GROUP_CHUNKS, max(DEFAULT_SHUFFLE_CHUNKS, WHOLE_CHUNK_GROUP_BYTES // chunk_bytes))
    )


def warn_unmixed(store: Store, sel: Selection, *, shuffle_chunks: int, batch_size: int) -> None:
    """Warn once per store and process when the default load of ``store`` cannot mix well: it
    is read by whole chunks, its default group holds ``shuffle_chunks`` chunks, fewer than
    ``WELL_MIXED_CHUNKS`` and than a batch has rows, and the selection has more chunks than a
    group (a store smaller than one group mixes as a uniform shuffle does). The caller checks
    that the defaults are in use. Says the fix: the store rewritten in the default layout."""
    if (
        store.url in _WARNED
        or reads_rows_in_place(store, sel.arrays)
        or ragged_names(store, sel.arrays)
        or isinstance(store.reader, WindowReader)
        or shuffle_chunks >= min(WELL_MIXED_CHUNKS, batch_size)
        or len(np.unique(sel.ids)) <= shuffle_chunks
    ):
        return
    _WARNED.add(store.url)
    chunk_rows = int(np.diff(store.manifest.bounds).max())
    msg = (
        f"{store.url}: its chunks of {chunk_rows} rows are decoded whole, and a default shuffle "
        f"group holds only {shuffle_chunks} of them, so a batch of {batch_size} rows draws from "
        f"at most {shuffle_chunks} chunks where a uniform shuffle draws from about {batch_size}: "
        f"rows stored together stay together. Rewrite it in the default layout (small chunks "
        f"in shard files): `shardload copy {store.url} NEW_STORE`, or prepare it again as Zarr "
        "(the default format) without chunk_rows / target_chunk_bytes / shard_chunks "
        "(docs/loading.md, 'Default quality, per format')"
    )
    warnings.warn(msg, ShuffleQualityWarning, stacklevel=2)


def resolve_prefetch(
    store: Store,
    sel: Selection,
    prefetch: int | None,
    *,
    shuffle_chunks: int,
    piece_rows: int,
    local: bool | None = None,
) -> int:
    """``prefetch`` checked, or its default: for stores read by whole chunks (``piece_rows``
    0) a group's worth of chunks ahead when default groups are larger than
    ``DEFAULT_SHUFFLE_CHUNKS`` (:func:`whole_chunk_group`: small chunks, so at most
    ``WHOLE_CHUNK_GROUP_BYTES`` decoded ahead, as ``DEFAULT_PREFETCH`` chunks of the default
    size), else ``DEFAULT_PREFETCH`` segments (an npy stack by URL: a group's); by URL,
    unsharded chunk files up to ``URL_IN_FLIGHT`` chunks ahead within the same decoded bytes,
    across groups. ``local``: whether the store is read in place (default: ``store.is_local``;
    True for an epoch the node cache holds whole). Decides no row order (not in the plan)."""
    local = store.is_local if local is None else local
    if prefetch is not None:
        return check_nonneg("prefetch", prefetch)
    if piece_rows or isinstance(store.reader, WindowReader) or raw_rows(store, sel.arrays):
        if piece_rows and not local and plans_requests(store, sel.arrays):
            # raw rows by URL (an npy stack, a raw Zarr array) read a group's pieces in
            # planned requests, one call per array (formats/npy/url.py, formats/zarr/ranges.py):
            # the next group's call runs while this one is used
            return max(DEFAULT_PREFETCH, shuffle_chunks)
        return DEFAULT_PREFETCH
    group = whole_chunk_group(store, sel)
    ahead = max(DEFAULT_PREFETCH, min(shuffle_chunks, group))
    if not local and not _sharded(store, sel.arrays):
        # chunk files by URL: each waits a round trip, so the files of the groups after the
        # current one are asked for together, up to the requests in flight and the same
        # decoded bytes (``group`` chunks hold WHOLE_CHUNK_GROUP_BYTES)
        from shardload.move.remote import URL_IN_FLIGHT

        ahead = max(ahead, min(URL_IN_FLIGHT, group))
    return ahead


def _sharded(store: Store, names: tuple[str, ...]) -> bool:
    """Some of ``names`` are sharded Zarr arrays (by URL their calls plan their own requests
    per group: ``formats/zarr/shard_fetch.py``)."""
    layout = getattr(store.reader, "layout", None)
    return callable(layout) and any(getattr(layout(n), "shard", None) for n in names)


def default_threads(prefetch: int, readers: int, *, local: bool) -> int:
    """Reader threads of one reader by default: ``min(4, prefetch, CPUs)``; for a local store
    at most ``CPUs // readers`` (``readers``: the DataLoader workers reading the same rank),
    since its reads are CPU work (decoding, copies from the page cache) and more threads than
    CPUs only contend: 2 workers of 1 thread each on 2 CPUs load a zstd store as fast as 2
    workers of 2, with the first batch sooner and 8-12% less memory (docs/benchmarks.md,
    session 11). A store read by URL: ``URL_IN_FLIGHT``, since its threads mostly wait a
    round trip each, so the requests in flight, not the CPUs, set its speed far from the
    server. A thread starts only when a queued read finds none idle, so what is in flight is
    what the plan has queued (the current group's reads and ``prefetch`` segments ahead), up
    to that bound."""
    if not local:
        from shardload.move.remote import URL_IN_FLIGHT

        return URL_IN_FLIGHT
    cpus = max(1, _cores() // max(1, readers))
    return min(4, max(1, prefetch), cpus)


def gather_threads(threads: int) -> int:
    """Gather threads of a reader of ``threads`` read threads: at most this process's CPUs. A
    gather is memory work, not a wait; and the loop holds back as many finished batches as
    gathers run (``GroupReader.lag``): with a store by URL's ``URL_IN_FLIGHT`` (32) read
    threads, 33 batches, so a group of 32 batches yielded its first only once the next group
    was read."""
    return min(max(1, int(threads)), _cores())


def _cores() -> int:
    """CPUs this process may run on (more reader threads than that only contend)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def check_int1(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise PlanError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def check_nonneg(name: str, value: int) -> int:
    if isinstance(value, bool) or int(value) != value or value < 0:
        raise PlanError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)
