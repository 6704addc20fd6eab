"""Windows of dates at load time (``iter_batches(..., window=K)`` on a dated store).

A sample is a window: ``K`` consecutive states (every ``window_step``-th row) of a store with
a time axis (:class:`~shardload.manifest.time.TimeAxis`), named by its first row. The epoch is
planned over the rows that start a window whose every date exists and lies inside the
selection (:func:`window_selection`, :func:`shardload.plan.dated.plan_window_starts`), so the
shuffle, ranks, workers, splits and resume are those of every store. A batch is a unit of the
one reading loop (:class:`DatedWindowReader`): its distinct rows are read once, each straight
into the first of its places in the batch (``NAME`` of shape ``(B, K, *row_shape)``), in runs
of consecutive rows spread over the reader threads, and copied to the places of the windows
that share it (:func:`shardload.plan.dated.plan_batch_reads`). Batches carry ``dates``
(``datetime64[s]``, ``(B, K)``) and ``index`` (each window's first row).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import replace
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, PlanError, ShardloadError
from shardload.formats.base import ReadsInto
from shardload.load.checks import checked_allocate
from shardload.load.loop import Flight, GroupReader, read_loop
from shardload.load.pool import ReadPool
from shardload.load.reader import read_segments
from shardload.load.recycle import INDEX_KEY, Allocate, BatchRecycler, Specs
from shardload.load.select import Selection, select_rows, split_pieces
from shardload.plan.dated import (
    BatchReads,
    WindowGrid,
    plan_batch_reads,
    plan_grid_reads,
    plan_window_grid,
    plan_window_starts,
    window_rows,
)
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import iter_worker_batches
from shardload.plan.missing_dates import check_missing_dates
from shardload.plan.spans import Segment
from shardload.store.core import Store

#: The batch key of each window's dates (``datetime64[s]``, shape ``(B, K)``).
DATES_KEY = "dates"
#: Bytes a reader task reads at least (a task per small state costs a future and a wake-up).
TASK_BYTES = 1 << 20
#: Batches of windows read ahead of the one yielded, by default (``prefetch=``).
DEFAULT_WINDOW_PREFETCH = 2


#: The reads of a batch read as one strided grid of consecutive rows (no copies to make).
NO_COPIES = BatchReads(*(np.zeros(0, np.int64) for _ in range(6)))


def check_window(window: int | None, window_step: int | None) -> tuple[int, int] | None:
    """``(window, window_step)`` checked (None: no windows)."""
    if window is None:
        if window_step is not None:
            raise PlanError("window_step= needs window= (the states per window)")
        return None
    step = 1 if window_step is None else window_step
    for name, value in (("window", window), ("window_step", step)):
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise PlanError(f"{name} must be an integer >= 1, got {value!r}")
    return int(window), int(step)


def window_selection(store: Store, sel: Selection, window: int, step: int) -> Selection:
    """``sel`` (rows of ``store``) turned into the rows that start a window of ``window``
    states every ``step`` rows, every one an existing date inside ``sel``."""
    axis = store.time
    if axis is None:
        raise PlanError(
            f"window={window}: {store.url} has no time axis (a dated store: the manifest's "
            "'time' entry); windows of dates need one"
        )
    if axis.length != store.manifest.length:
        raise PlanError(
            f"window={window}: the time axis of {store.url} has {axis.length} dates for "
            f"{store.manifest.length} rows"
        )
    ragged = [a for a in sel.arrays if store.manifest.arrays[a].is_ragged]
    if ragged:
        raise PlanError(f"window={window}: variable-length arrays {ragged} cannot be windowed")
    if DATES_KEY in sel.arrays:
        raise PlanError(
            f"window={window}: {store.url} has an array named {DATES_KEY!r}, the key of the "
            "windows' dates; leave it out with arrays="
        )
    sizes, ids, starts = plan_window_starts(
        ~axis.missing_mask, sel.sizes, sel.ids, sel.starts, window=window, step=step
    )
    return replace(sel, sizes=sizes, ids=ids, starts=starts, window=(window, step))


def resolve_windows(
    store: Store,
    sel: Selection,
    win: tuple[int, int],
    shuffle: bool | str,
    piece_rows: int | None,
    shuffle_chunks: int | None,
    prefetch: int | None,
) -> tuple[Selection, int, int, int]:
    """The selection of windows' first rows (:func:`window_selection`) cut into pieces, the
    rows per piece, the pieces per shuffle group (as ``loader_selection`` for rows) and the
    batches read ahead (``prefetch``, default :data:`DEFAULT_WINDOW_PREFETCH`).

    A batch's states are read when the batch is (a shuffle group holds no data), so the
    default shuffle is uniform over windows: each window its own piece (``piece_rows=1``) and
    one shuffle group per worker, whose rows the plan deals to its batches."""
    sel = window_selection(store, sel, *win)
    for name, value in (
        ("piece_rows", piece_rows),
        ("shuffle_chunks", shuffle_chunks),
        ("prefetch", prefetch),
    ):
        if value is not None and (isinstance(value, bool) or int(value) != value or value < 0):
            raise PlanError(f"{name} must be an integer >= 0, got {value!r}")
    piece = int(piece_rows) if piece_rows is not None else 1 if shuffle is True else 0
    group = int(shuffle_chunks) if shuffle_chunks else 0
    if not group:
        group = sel.num_rows if shuffle in (True, "uniform") else 1
    ahead = DEFAULT_WINDOW_PREFETCH if prefetch is None else int(prefetch)
    return split_pieces(sel, piece), piece, group, ahead


def window_specs(store: Store, names: Sequence[str], window: int) -> Specs:
    """``(shape per window, dtype)`` of each key of a batch of windows."""
    infos = store.manifest.arrays
    specs = {a: ((window, *infos[a].row_shape), np.dtype(infos[a].dtype)) for a in names}
    specs[DATES_KEY] = ((window,), np.dtype("datetime64[s]"))
    specs[INDEX_KEY] = ((), np.dtype(np.int64))
    return specs


def new_window_batch(specs: Specs, n: int) -> dict[str, np.ndarray]:
    return {k: np.empty((n, *shape), dtype) for k, (shape, dtype) in specs.items()}


class DatedWindowReader(GroupReader):
    """A batch of windows a unit: its distinct rows read by ``threads`` threads of the ``read``
    lane, up to ``prefetch`` batches ahead of the one yielded."""

    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        plan: EpochPlan,
        rank: int,
        worker: int,
        *,
        window: int,
        step: int,
        prefetch: int,
        threads: int,
        allocate: Allocate | None = None,
        views: bool = False,
    ) -> None:
        super().__init__(plan, rank, worker)
        self.store, self.names, self.window, self.step = store, tuple(names), window, step
        self.specs = window_specs(store, names, window)
        self.allocate, self.views = allocate, views
        self.threads = max(1, threads)
        self.lanes = {"read": self.threads, "copy": self.threads}
        self.pool: ReadPool | None = None  # the loop's, once a batch is started
        self.ahead = max(1, prefetch)
        # a grid's reads (views in date order) in as many tasks as give each thread one
        # among the batches in flight (the loop keeps ``ahead + 1``): a task more is a
        # hand-off more per batch (copied batches keep ``threads`` tasks: their copies wait)
        self.splits = -(-self.threads // (self.ahead + 1))
        self.bounds = np.asarray(store.manifest.chunk_bounds, np.int64)
        if store.time is None:
            raise PlanError(f"window={window}: {store.url} has no time axis")
        self.dates = store.time.dates
        Batch = tuple[dict[str, np.ndarray], BatchReads, WindowGrid | None]
        self.batches: dict[int, Batch] = {}

    def units(self) -> Iterator[Any]:
        return iter_worker_batches(self.plan, self.rank, self.worker)

    def rows(self, unit: Any) -> int:
        return len(unit)

    def start(self, unit: Any, at: int, n: int, pool: ReadPool) -> Flight:
        self.pool = pool
        first = np.asarray(unit, np.int64)
        out = (self.allocate(len(first)) if self.allocate else None) or new_window_batch(
            self.specs, len(first)
        )
        rows = window_rows(first, window=self.window, step=self.step)
        out[INDEX_KEY][...] = first
        out[DATES_KEY][...] = self.dates[rows]
        grid = plan_window_grid(first, window=self.window, step=self.step) if self.views else None
        futs: list[Future[None]] = []
        if grid is not None and grid.gap == 1:  # consecutive rows: a reader call a task
            r = grid.first_row
            for name in self.names:
                flat = _states(out, name)
                for a, b in self._row_tasks(grid.num_rows, flat):
                    futs.append(pool.submit("read", self._read_rows, name, r + a, r + b, flat[a:b]))
            self.batches[at // self.plan.batch_size] = (out, NO_COPIES, grid)
            return Flight(at, n, futures=futs)
        if grid is None:
            reads = plan_batch_reads(rows, self.bounds)
        else:  # the distinct rows in order, each read once; the windows will view them
            reads = plan_grid_reads(grid, self.bounds)
        for name in self.names:
            flat = _states(out, name)
            for segs, outs in self._tasks(name, reads, flat):
                futs.append(pool.submit("read", read_segments, self.store, name, segs, outs))
        self.batches[at // self.plan.batch_size] = (out, reads, grid)
        return Flight(at, n, futures=futs)

    def _tasks(
        self, name: str, reads: BatchReads, flat: np.ndarray
    ) -> Iterator[tuple[list[Segment], list[np.ndarray]]]:
        """The batch's runs of ``name`` in about ``threads`` tasks of at least ``TASK_BYTES``."""
        row_bytes = max(1, flat[0].nbytes if len(flat) else 1)
        cum = np.cumsum(reads.lengths)
        per = max(-(-int(cum[-1]) // self.threads), TASK_BYTES // row_bytes, 1)
        cuts = np.searchsorted(cum, np.arange(per, int(cum[-1]), per), "left") + 1
        chunk = np.searchsorted(self.bounds, reads.rows, "right") - 1
        edges = [0, *sorted(set(cuts.tolist()) - {0, len(cum)}), len(cum)]
        for i, j in itertools.pairwise(edges):
            segs, outs = [], []
            for k in range(i, j):
                r, p, m = int(reads.rows[k]), int(reads.places[k]), int(reads.lengths[k])
                segs.append(Segment(int(chunk[k]), 0, m, chunk_start=r))
                outs.append(flat[p : p + m])
            yield segs, outs

    def _row_tasks(self, n: int, flat: np.ndarray) -> Iterator[tuple[int, int]]:
        """``n`` consecutive states cut into about ``splits`` tasks of at least
        ``TASK_BYTES``: ``(first, stop)`` places."""
        row_bytes = max(1, flat[0].nbytes if len(flat) else 1)
        per = max(-(-n // self.splits), TASK_BYTES // row_bytes, 1)
        for a in range(0, n, per):
            yield a, min(n, a + per)

    def _read_rows(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``start:stop`` of ``name`` (over several chunks) into ``out``: one reader
        call, as a plain read of those rows makes (per-chunk calls cost more CPU)."""
        reader = self.store.reader
        try:
            if isinstance(reader, ReadsInto):
                reader.read_into(name, start, stop, out)
            else:
                out[...] = reader.read(name, start, stop)
        except ShardloadError:
            raise
        except Exception as exc:
            lo, hi = np.searchsorted(self.bounds, [start, stop - 1], "right") - 1
            raise ChunkReadError(
                f"rows {start}:{stop} (chunks {lo}..{hi}) of array {name!r} in "
                f"{self.store.url} could not be read: {type(exc).__name__}: {exc}"
            ) from exc

    def finish(self, k: int, size: int) -> tuple[dict[str, np.ndarray], list[Future[Any]]]:
        """Batch ``k``, its reads done: states shared by windows (read once) are copied to
        their other places by tasks of the ``copy`` lane (runs of slices, no temporary); with
        ``views``, a batch that is a :class:`WindowGrid` is instead one read-only strided view
        of its distinct states per array, and any other batch's arrays are made read-only."""
        out, reads, grid = self.batches.pop(k)
        futs: list[Future[Any]] = []
        if len(reads.copy_to) and self.pool is not None:
            cum = np.cumsum(reads.copy_lengths)
            per = max(1, -(-int(cum[-1]) // self.threads))
            cuts = np.searchsorted(cum, np.arange(per, int(cum[-1]), per), "left") + 1
            edges = [0, *sorted(set(cuts.tolist()) - {0, len(cum)}), len(cum)]
            for name in self.names:
                flat = _states(out, name)
                for i, j in itertools.pairwise(edges):
                    futs.append(self.pool.submit("copy", _copy_runs, flat, reads, i, j))
        if self.views:  # the copy tasks write through their own (writable) views
            for name in self.names:
                out[name] = _read_only(out[name], grid)
        return out, futs


def _copy_runs(flat: np.ndarray, reads: BatchReads, i: int, j: int) -> None:
    """Copy runs ``i:j`` of ``reads`` (shared states to their other places) within ``flat``."""
    for t, f, m in zip(
        reads.copy_to[i:j].tolist(),
        reads.copy_from[i:j].tolist(),
        reads.copy_lengths[i:j].tolist(),
        strict=True,
    ):
        flat[t : t + m] = flat[f : f + m]


def _read_only(arr: np.ndarray, grid: WindowGrid | None) -> np.ndarray:
    """``arr`` (a batch's ``(B, K, *row)`` array) as a read-only view; with ``grid``, of the
    distinct states read into its first ``grid.num_rows`` states: windows that share a state
    share its memory, so a write would change every window holding it (hence read-only)."""
    if grid is None:
        view = arr.view()
        view.flags.writeable = False
        return view
    flat = arr.reshape(-1, *arr.shape[2:])[: grid.num_rows]
    step = flat.strides[0]
    strides = (grid.window_stride * step, grid.state_stride * step, *flat.strides[1:])
    return np.lib.stride_tricks.as_strided(flat, arr.shape, strides, writeable=False)


def _states(out: dict[str, np.ndarray], name: str) -> np.ndarray:
    """Array ``name`` of a batch ``(B, K, *row)`` as its ``B * K`` states: a view, so reads
    into it land in the batch (a copy would leave the batch unwritten)."""
    arr = out[name]
    if not arr.flags.c_contiguous:
        raise PlanError(
            f"the batch array {name!r} is not C-contiguous: windows cannot be read into it"
        )
    return arr.reshape(-1, *arr.shape[2:])


def dated_window_batches(
    store: Store,
    names: Sequence[str],
    plan: EpochPlan,
    rank: int,
    worker: int,
    window: tuple[int, int],
    prefetch: int,
    threads: int,
    *,
    allocate: Allocate | None = None,
    views: bool = False,
) -> Iterator[dict[str, np.ndarray]]:
    """The worker's batches of windows (``window``: ``(K, step)``) of ``store`` (a read group
    member's sliced store, or the whole), in plan order (:class:`DatedWindowReader`), into a
    caller's ``allocate`` (checked against the window shapes) or reused batch memory; with
    ``views`` (not with ``allocate``: its memory is the caller's, read as laid out), read-only
    arrays, windows of a batch in date order viewing one buffer of its distinct states."""
    specs = window_specs(store, names, window[0])
    if views and allocate is not None:  # read_batches refuses it: a slot is read as laid out
        raise PlanError("window_views=True cannot be combined with allocate=")
    if allocate is None:
        allocate = BatchRecycler(specs, plan.batch_size, keep=prefetch + 4).allocate
    else:
        allocate = checked_allocate(allocate, specs)
    return read_loop(
        DatedWindowReader(
            store,
            names,
            plan,
            rank,
            worker,
            window=window[0],
            step=window[1],
            prefetch=prefetch,
            threads=threads,
            allocate=allocate,
            views=views,
        )
    )


def select_windows(
    store: Store,
    win: tuple[int, int],
    where: Mapping[str, Any],
    missing_dates: str,
    shuffle: bool | str,
    piece_rows: int | None,
    shuffle_chunks: int | None,
    prefetch: int | None,
) -> tuple[Selection, int, int, int]:
    """The selection of windows of dates (:func:`resolve_windows`) over
    the rows ``where`` selects, every row kept: a window touching a missing date is left out
    there (``missing_dates="error"`` still refuses a selection holding missing dates)."""
    edge = "error" if check_missing_dates(missing_dates) == "error" else "include"
    sel = select_rows(store, **where, missing_dates=edge)
    return resolve_windows(store, sel, win, shuffle, piece_rows, shuffle_chunks, prefetch)
