"""``LoadSpec``: a loader's options resolved once, against one store.

As dask's ``normalize_chunks`` turns every way of writing chunks into one canonical value, a
``LoadSpec`` turns what a user passes to ``iter_batches`` or ``shardload.torch`` into one frozen
value: the selection cut into pieces, the read kind (:mod:`.kinds`), the epoch plan options,
the read-ahead, the fingerprints a resume state is checked against; with ``window``, the
selection is the rows that start a window of dates (:mod:`.dated`). Every later step reads it;
none asks the store again what kind it is. It pickles (the store without open handles), so a
DataLoader worker takes the one its main process resolved.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from shardload.errors import PlanError, StateError
from shardload.load.dated import check_window, select_windows, window_specs
from shardload.load.kinds import ReadKind, read_kind
from shardload.load.options import (
    default_threads,
    resolve_prefetch,
    resolve_shuffle,
    warn_unmixed,
)
from shardload.load.ragged import ragged_names, resolve_buckets
from shardload.load.read_groups import check_read_groups, level_slices, merged_slices
from shardload.load.recycle import Specs, batch_specs, plan_batch_layout
from shardload.load.ring import plan_ring_slots
from shardload.load.scatter import batches_per_group, groups_in_flight
from shardload.load.select import Selection, select_rows, split_pieces, store_fingerprint
from shardload.manifest.ragged import LENGTH_SUFFIX
from shardload.plan.buckets import bucketed_fingerprint
from shardload.plan.epoch import (
    DEFAULT_SHUFFLE_CHUNKS,
    EpochPlan,
    PlanOptions,
    plan_epoch,
    plan_fingerprint,
)
from shardload.plan.missing_dates import DEFAULT_MISSING_DATES
from shardload.plan.read_groups import (
    ReadGroupAxis,
    ReadGroupSize,
    RowSlice,
    check_read_group_size,
    read_group_levels,
    split_rank,
)
from shardload.plan.resume import EpochState, plan_from_state
from shardload.plan.shuffles import get_shuffle
from shardload.store.core import Store, open_store
from shardload.store.sliced import SlicedStore

__all__ = ["LoadSpec", "earlier_default_hint", "loader_selection", "plan_for"]


@dataclass(frozen=True, eq=False)
class LoadSpec:
    """What one loader reads and how, resolved once (:meth:`build`).

    ``selection`` is cut into pieces of ``piece_rows`` rows (0: whole chunks); ``options`` are
    the epoch plan's (``shuffle_chunks`` included: the pieces per shuffle group); ``kind`` picks
    the group reader; ``prefetch`` counts the segments read ahead (``warm_prefetch``: of an
    epoch the node cache holds whole, read as a local store is; None: ``prefetch``); ``threads``
    is the user's (None: :meth:`read_ahead` picks per reader). ``split`` and ``bucket`` as given.
    ``window``: ``(K, step)`` for windows of dates (kind ``"dated"``), else None.
    ``read_group_size`` and ``read_group_axis``: read groups (:meth:`split_rank`,
    :meth:`member_store`; ``shardload.plan.read_groups``).
    """

    store: Store
    selection: Selection
    kind: ReadKind
    piece_rows: int
    options: PlanOptions
    prefetch: int
    threads: int | None
    split: str | None = None
    bucket: bool | str = False
    window: tuple[int, int] | None = None
    read_group_size: ReadGroupSize = 1
    read_group_axis: ReadGroupAxis = -1
    warm_prefetch: int | None = None

    @classmethod
    def build(
        cls,
        store: str | os.PathLike[str] | Store,
        *,
        batch_size: int,
        split: str | None = None,
        chunks: Sequence[int] | None = None,
        rows: tuple[int, int] | None = None,
        arrays: Sequence[str] | None = None,
        shuffle: bool | str = True,
        seed: int = 0,
        mode: str = "drop",
        drop_last: bool = False,
        shuffle_chunks: int | None = None,
        piece_rows: int | None = None,
        prefetch: int | None = None,
        threads: int | None = None,
        bucket: bool | str = False,
        storage_options: Mapping[str, Any] | None = None,
        missing_dates: str = DEFAULT_MISSING_DATES,
        window: int | None = None,
        window_step: int | None = None,
        read_group_size: ReadGroupSize = 1,
        read_group_axis: ReadGroupAxis = -1,
    ) -> LoadSpec:
        """Open ``store`` (a path, URL or Store) and resolve the options of ``iter_batches``."""
        st = open_store(store, storage_options=storage_options, arrays=arrays)
        named = get_shuffle(shuffle)  # a name becomes the key its plans carry
        shuffle = named.key
        defaults = shuffle_chunks is None and piece_rows is None and shuffle is True
        if shuffle_chunks is None:
            shuffle_chunks = named.group
        win = check_window(window, window_step)
        kind: ReadKind = "dated"
        warm: int | None = None
        if win is not None:  # windows of dates (load/dated.py): their first rows are planned
            where = dict(split=split, chunks=chunks, rows=rows, arrays=arrays)
            sel, piece, group, ahead = select_windows(
                st, win, where, missing_dates, shuffle, piece_rows, shuffle_chunks, prefetch
            )
        else:
            sel, piece, group = loader_selection(
                st,
                split=split,
                chunks=chunks,
                rows=rows,
                arrays=arrays,
                piece_rows=piece_rows,
                shuffle_chunks=shuffle_chunks,
                shuffle=shuffle,
                batch_size=batch_size,
                missing_dates=missing_dates,
            )
            resolve = functools.partial(resolve_prefetch, st, sel, prefetch, piece_rows=piece)
            ahead, warm = resolve(shuffle_chunks=group), resolve(shuffle_chunks=group, local=True)
            if defaults:
                warn_unmixed(st, sel, shuffle_chunks=group, batch_size=batch_size)
            kind = read_kind(st, sel.arrays)
        options: PlanOptions = dict(
            batch_size=batch_size,
            seed=seed,
            mode=mode,
            drop_last=drop_last,
            shuffle=shuffle,
            shuffle_chunks=group,
        )
        levels = read_group_levels(read_group_size)  # (G,) or (E, G)
        if check_read_group_size(levels) > 1:
            check_read_groups(st, sel.arrays, levels, read_group_axis)
        return cls(
            store=st,
            selection=sel,
            kind=kind,
            piece_rows=piece,
            options=options,
            prefetch=ahead,
            threads=threads,
            split=split,
            bucket=bucket,
            window=win,
            read_group_size=levels[0] if len(levels) == 1 else levels,
            read_group_axis=read_group_axis,
            warm_prefetch=warm,
        )

    # -- read groups ---------------------------------------------------------------------------
    def split_rank(self, rank: int, world_size: int) -> tuple[int, int, int]:
        """``(group, groups, member)`` of ``rank``: the epoch is planned over the groups of
        ``read_group_size`` consecutive ranks (``plan.read_groups.split_rank``)."""
        return split_rank(rank, world_size, self.read_group_size)

    def member_level_slices(self, member: int) -> tuple[dict[str, RowSlice], ...]:
        """``{array: (axis of the row, start, stop)}`` that read group member ``member`` reads,
        one per level of ``read_group_size`` that cuts something (``load.read_groups``)."""
        return level_slices(self.store, self.selection.arrays, self, member)

    def member_slices(self, member: int) -> dict[str, RowSlice] | dict[str, tuple[RowSlice, ...]]:
        """One level: ``{array: (axis, start, stop)}`` that member ``member`` reads (arrays read
        whole not listed); several: ``{array: ((axis, start, stop), ...)}``, a slice per level
        that cuts the array, outermost first."""
        return merged_slices(self.member_level_slices(member), self.read_group_size)

    def member_store(self, member: int) -> Store:
        """The store as member ``member`` of a read group reads it: its slices of each row (a
        store over the level before's at each level)."""
        st = self.store
        for slices in self.member_level_slices(member):
            st = SlicedStore(st, slices)
        return st

    # -- what a resume state is checked against ------------------------------------------------
    @functools.cached_property
    def fingerprint(self) -> str:
        """The data's (layout, arrays, statistics) and the selection's: ``store_fingerprint``."""
        return store_fingerprint(self.store, self.selection)

    @functools.cached_property
    def plan_fingerprint(self) -> str:
        """The epoch plan's (chunks and the options a resume must keep), bucketed or not."""
        sel = self.selection
        fp = plan_fingerprint(sel.sizes, chunk_ids=sel.ids, chunk_starts=sel.starts, **self.options)
        buckets = resolve_buckets(self.store, sel.arrays, self.bucket, self.options["shuffle"])
        return fp if buckets is None else bucketed_fingerprint(fp)

    def resume_hint(self, fingerprint: str) -> str:
        """For a refused resume state: how to resume it, if it was saved with the earlier
        default groups (:func:`earlier_default_hint`); else ''."""
        return earlier_default_hint(self.selection, self.options, fingerprint)

    # -- planning and reading ------------------------------------------------------------------
    def plan(
        self,
        *,
        world_size: int,
        num_workers: int,
        epoch: int,
        state: EpochState | Mapping[str, Any] | None = None,
    ) -> EpochPlan:
        """The epoch plan, fresh or resumed from ``state`` (:func:`plan_for`)."""
        return plan_for(
            self.store,
            self.selection,
            world_size=world_size,
            num_workers=num_workers,
            epoch=epoch,
            state=state,
            bucket=self.bucket,
            **self.options,
        )

    def read_ahead(self, readers: int, *, warm: bool = False) -> tuple[int, int]:
        """``(prefetch, threads)`` of one of ``readers`` readers of a rank: ``threads``, or the
        default share of this machine's CPUs (:func:`~shardload.load.options.default_threads`);
        ``warm``: an epoch the node cache holds whole, read in place as a local store is."""
        ahead = self.warm_prefetch if warm and self.warm_prefetch is not None else self.prefetch
        if self.threads is None:  # windows of dates: a batch's reads spread over the threads
            most = max(ahead, 4) if self.kind == "dated" else ahead
            return ahead, default_threads(most, readers, local=warm or self.store.is_local)
        return ahead, max(1, int(self.threads))

    @property
    def ragged(self) -> list[str]:
        """The variable-length arrays selected."""
        return ragged_names(self.store, self.selection.arrays)

    def batch_specs(self, member: int = 0) -> Specs:
        """``(row_shape, dtype)`` of each array of a batch, ``"index"`` included (of read group
        member ``member``'s batches: its slices; windows of dates: ``(K, *row_shape)`` and
        ``"dates"``)."""
        if self.window is not None:
            return window_specs(self.member_store(member), self.selection.arrays, self.window[0])
        return batch_specs(self.member_store(member), self.selection.arrays)

    def batch_bytes(self) -> int:
        """Bytes of one full batch laid out in one buffer (a ring slot)."""
        return plan_batch_layout(self.batch_specs(), max(1, self.options["batch_size"]))[1]

    def ring_slots(self, *, workers: int, extra: int) -> int:
        """Ring slots for the batches in flight of ``workers`` readers, plus ``extra`` each."""
        sizes, group = self.selection.sizes, self.options["shuffle_chunks"]
        chunk_rows = int(sizes.max()) if len(sizes) else 1
        if self.options["shuffle"] == "uniform":  # groups of one-row segments
            chunk_rows = 1
        b = self.options["batch_size"]
        per_group = batches_per_group(chunk_rows=chunk_rows, shuffle_chunks=group, batch_size=b)
        flights = groups_in_flight(prefetch=self.prefetch, shuffle_chunks=group)
        if self.kind == "dated":  # windows of dates: a batch a unit, ``prefetch`` ahead
            per_group, flights = 1, max(1, self.prefetch) + 1
        return plan_ring_slots(
            group_batches=per_group,
            groups_in_flight=flights,
            workers=workers,
            slot_bytes=self.batch_bytes(),
            extra=extra,
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
    missing_dates: str = DEFAULT_MISSING_DATES,
) -> tuple[Selection, int, int]:
    """The selection a loader plans over: :func:`select_rows` (without missing dates, unless
    ``missing_dates`` says otherwise) cut into pieces, the rows per piece it was cut with and
    the pieces per shuffle group (:func:`resolve_shuffle`)."""
    sel = select_rows(
        store, split=split, chunks=chunks, rows=rows, arrays=arrays, missing_dates=missing_dates
    )
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


def plan_for(
    store: Store,
    sel: Selection,
    *,
    batch_size: int,
    world_size: int,
    num_workers: int,
    shuffle: bool | str,
    seed: int,
    epoch: int,
    mode: str,
    drop_last: bool,
    shuffle_chunks: int,
    state: EpochState | Mapping[str, Any] | None = None,
    bucket: bool | str = False,
) -> EpochPlan:
    """The epoch plan of a selection, fresh or resumed from ``state``."""
    opts: PlanOptions = dict(
        batch_size=batch_size,
        seed=seed,
        mode=mode,
        drop_last=drop_last,
        shuffle=shuffle,
        shuffle_chunks=shuffle_chunks,
    )
    buckets = resolve_buckets(store, sel.arrays, bucket, shuffle)
    if state is None:
        plan = plan_epoch(
            sel.sizes,
            chunk_ids=sel.ids,
            chunk_starts=sel.starts,
            **opts,
            world_size=world_size,
            num_workers=num_workers,
            epoch=epoch,
        )
        if buckets is None:
            return plan
        return replace(plan, buckets=buckets, fingerprint=bucketed_fingerprint(plan.fingerprint))
    if isinstance(state, Mapping):
        data = state.get("dataset")
        if data is not None and data != store_fingerprint(store, sel):
            raise StateError(
                f"the resume state was saved for other data (dataset fingerprint {data}); this "
                f"is {store.url} with arrays {list(sel.arrays)} and {len(sel.sizes)} chunks "
                f"(fingerprint {store_fingerprint(store, sel)}): another split, rows, chunks, "
                "arrays, window or missing_dates= than the state's selects other data"
            )
        state = EpochState.from_dict(dict(state))
    try:
        return plan_from_state(
            state,
            sel.sizes,
            chunk_ids=sel.ids,
            chunk_starts=sel.starts,
            **opts,
            world_size=world_size,
            num_workers=num_workers,
            buckets=buckets,
        )
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
