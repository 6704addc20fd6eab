"""Windows of dates on a dated store: which rows start a window, and how a batch's windows are
read (pure numpy, no I/O).

A *window* of ``K`` states every ``step`` rows starting at row ``r`` is the rows
``r, r + step, ..., r + (K - 1) * step`` of a dated store (one row per date of a regular time
axis, :class:`~shardload.manifest.time.TimeAxis`). A row may start a window only when every
row of the window is selected (a split's rows, a chunk list, a row range) and none is a missing
date. The loader plans its epoch over these start rows as it plans over rows: the start rows
are a chunk table (:func:`plan_window_starts`), so shuffles, ranks, workers, splits and resume
are the epoch planner's.

A batch's windows overlap where their dates do: :func:`plan_batch_reads` reads each distinct
row once, into the first place of the batch that needs it, in runs of consecutive rows, and
copies it to the other places.

>>> ok = np.array([1, 1, 1, 0, 1, 1, 1, 1], bool)            # row 3 is a missing date
>>> sizes, ids, starts = plan_window_starts(ok, [8], [0], [0], window=2, step=1)
>>> sizes.tolist(), starts.tolist()                           # starts 0, 1 and 4, 5, 6
([2, 3], [0, 4])
>>> window_rows(np.array([4, 0]), window=3, step=2).tolist()
[[4, 6, 8], [0, 2, 4]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from shardload.errors import PlanError


def window_ok(ok: np.ndarray, *, window: int, step: int) -> np.ndarray:
    """``bool[len(ok)]``: whether row ``r`` starts a window whose every row is ``ok``.

    >>> window_ok(np.array([1, 1, 0, 1, 1, 1], bool), window=2, step=2).astype(int).tolist()
    [0, 1, 0, 1, 0, 0]
    """
    ok = np.asarray(ok, bool)
    span = (window - 1) * step
    starts = np.zeros(len(ok), bool)
    n = len(ok) - span
    if n <= 0:
        return starts
    starts[:n] = ok[:n]
    for j in range(1, window):
        starts[:n] &= ok[j * step : j * step + n]
    return starts


def longest_run(ok: np.ndarray) -> int:
    """The most consecutive True entries of ``ok``.

    >>> longest_run(np.array([1, 1, 0, 1, 1, 1, 0], bool)), longest_run(np.zeros(3, bool))
    (3, 0)
    """
    edges = np.diff(np.concatenate(([0], np.asarray(ok, np.int8), [0])))
    return int((np.flatnonzero(edges < 0) - np.flatnonzero(edges > 0)).max(initial=0))


def plan_window_starts(
    ok: np.ndarray,
    sizes: Sequence[int] | np.ndarray,
    ids: Sequence[int] | np.ndarray,
    starts: Sequence[int] | np.ndarray,
    *,
    window: int,
    step: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The start rows of windows, as a chunk table ``(sizes, ids, starts)`` (runs of
    consecutive start rows, each inside one piece of the given table).

    ``ok[r]``: row ``r`` of the store holds a date (not missing); the given table (``sizes[i]``
    rows from global row ``starts[i]``, in store chunk ``ids[i]``) is the selection, and a
    window must lie wholly inside it. Raises :class:`PlanError` when no window fits, naming
    ``window=`` and the longest run of existing dates in the selection.
    """
    sizes = np.asarray(sizes, np.int64)
    ids, starts = np.asarray(ids, np.int64), np.asarray(starts, np.int64)
    entry = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    selected = np.arange(len(entry), dtype=np.int64) + np.repeat(
        starts - (np.cumsum(sizes) - sizes), sizes
    )  # every selected row, piece by piece
    usable = np.zeros(len(ok), bool)
    piece = np.full(len(ok), -1, np.int64)
    usable[selected], piece[selected] = True, entry
    usable &= np.asarray(ok, bool)
    first = window_ok(usable, window=window, step=step)
    rows = np.flatnonzero(first)
    if len(rows) == 0:
        span = (window - 1) * step + 1
        raise PlanError(
            f"window={window} (window_step={step}, {span} rows from first to last state) fits "
            f"nowhere in the selection: its longest run of existing dates is "
            f"{longest_run(usable)} rows; use a smaller window or window_step"
        )
    p = piece[rows]
    new = np.concatenate(([True], (np.diff(rows) != 1) | (np.diff(p) != 0)))
    begin = np.flatnonzero(new)
    run_sizes = np.diff(np.append(begin, len(rows)))
    return run_sizes, ids[p[begin]], rows[begin]


def window_rows(first: np.ndarray, *, window: int, step: int) -> np.ndarray:
    """``int64[len(first), window]``: the rows of the windows starting at ``first``."""
    return np.asarray(first, np.int64)[:, None] + step * np.arange(window, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class BatchReads:
    """How a batch's windows are read: runs ``rows[i]:rows[i] + lengths[i]`` of the store go to
    places ``places[i]:places[i] + lengths[i]`` of the batch (its ``B * K`` states in order);
    then places ``copy_to[j]:copy_to[j] + copy_lengths[j]`` take the states at places
    ``copy_from[j]:...`` (a state that several windows share is read once; every source is a
    place read, never one copied to, so the copies are independent)."""

    rows: np.ndarray
    places: np.ndarray
    lengths: np.ndarray
    copy_to: np.ndarray
    copy_from: np.ndarray
    copy_lengths: np.ndarray

    @property
    def num_rows(self) -> int:
        """Distinct rows read."""
        return int(self.lengths.sum())


def plan_batch_reads(rows: np.ndarray, chunk_bounds: np.ndarray | None = None) -> BatchReads:
    """The reads of a batch whose states are the store rows ``rows`` (flat, in batch order).

    Each distinct row is read once, into the first place that holds it; consecutive rows read
    into consecutive places form one run (a window of ``step=1`` sharing no state with an
    earlier window of the batch is one run), cut where a chunk of ``chunk_bounds`` (the store's
    chunk bounds) ends.

    >>> r = plan_batch_reads(np.array([5, 6, 7, 6, 7, 8]))       # windows 5-7 and 6-8
    >>> r.rows.tolist(), r.places.tolist(), r.lengths.tolist()
    ([5, 8], [0, 5], [3, 1])
    >>> r.copy_to.tolist(), r.copy_from.tolist(), r.copy_lengths.tolist()
    ([3], [1], [2])
    >>> plan_batch_reads(np.array([5, 6, 7]), chunk_bounds=np.array([0, 6, 10])).lengths.tolist()
    [1, 2]
    """
    rows = np.asarray(rows, np.int64).reshape(-1)
    _, first, inverse = np.unique(rows, return_index=True, return_inverse=True)
    primary = first[inverse]  # the place each place's state is read into
    dup = np.flatnonzero(primary != np.arange(len(rows)))
    places = np.sort(first)  # read places, in batch order
    read_rows = rows[places]
    new = np.concatenate(([True], (np.diff(read_rows) != 1) | (np.diff(places) != 1)))
    if chunk_bounds is not None:
        new[np.isin(read_rows, np.asarray(chunk_bounds, np.int64))] = True
    begin = np.flatnonzero(new)
    lengths = np.diff(np.append(begin, len(places)))
    src = primary[dup]  # copies in runs of consecutive places from consecutive places
    run = np.flatnonzero(np.concatenate(([True], (np.diff(dup) != 1) | (np.diff(src) != 1))))
    run = run[: len(dup)]  # no copy: no run
    copies = np.diff(np.append(run, len(dup)))
    return BatchReads(read_rows[begin], places[begin], lengths, dup[run], src[run], copies)


class WindowGrid(NamedTuple):
    """A batch's windows as one strided view of its distinct rows (``window_views=``): rows
    ``first_row + gap * i`` (``i < num_rows``) read in order into a buffer, window ``b``'s state
    ``k`` is buffer row ``b * window_stride + k * state_stride``."""

    first_row: int
    gap: int
    num_rows: int
    window_stride: int
    state_stride: int


def plan_window_grid(first: np.ndarray, *, window: int, step: int) -> WindowGrid | None:
    """The batch of windows starting at ``first`` as a :class:`WindowGrid`, or None when it is
    not one: the starts must be evenly spaced and increasing (windows in date order, no
    missing date between) and every row of the grid a state of some window (no row read that
    no window holds).

    >>> plan_window_grid(np.array([5, 6, 7]), window=3, step=1)   # rows 5..9
    WindowGrid(first_row=5, gap=1, num_rows=5, window_stride=1, state_stride=1)
    >>> plan_window_grid(np.array([4, 8]), window=3, step=2)        # rows 4, 6, .., 12
    WindowGrid(first_row=4, gap=2, num_rows=5, window_stride=2, state_stride=1)
    >>> plan_window_grid(np.array([5, 6, 9]), window=3, step=1) is None   # a gap in the starts
    True
    >>> plan_window_grid(np.array([0, 1]), window=2, step=5) is None      # rows 2-4 unused
    True
    """
    first = np.asarray(first, np.int64).reshape(-1)
    if not len(first):
        return None
    spacing = int(first[1] - first[0]) if len(first) > 1 else step
    if spacing < 1 or (np.diff(first) != spacing).any():
        return None
    gap = math.gcd(spacing, step)
    lo, hi = int(first[0]), int(first[-1]) + step * (window - 1)
    num_rows = (hi - lo) // gap + 1
    # starts on every grid row, at least step // gap of them: every row is some window's
    # (row t > n - 1 is state ceil((t - n + 1) / q) of a window); else count them
    if not (spacing == gap and len(first) >= step // gap):
        used = np.zeros(num_rows, bool)
        used[(window_rows(first, window=window, step=step) - lo) // gap] = True
        if not used.all():
            return None
    return WindowGrid(lo, gap, num_rows, spacing // gap, step // gap)


def plan_grid_reads(grid: WindowGrid, chunk_bounds: np.ndarray) -> BatchReads:
    """The reads of a :class:`WindowGrid`'s rows into places ``0..num_rows - 1`` (no copies):
    what :func:`plan_batch_reads` gives for those rows, without sorting them.

    >>> r = plan_grid_reads(WindowGrid(5, 1, 5, 1, 1), np.array([0, 6, 12]))
    >>> r.rows.tolist(), r.places.tolist(), r.lengths.tolist(), r.num_rows
    ([5, 6], [0, 1], [1, 4], 5)
    """
    lo, n = grid.first_row, grid.num_rows
    if grid.gap == 1:  # one run, cut where a chunk ends
        bounds = np.asarray(chunk_bounds, np.int64)
        places = np.concatenate(([0], bounds[(bounds > lo) & (bounds < lo + n)] - lo))
        lengths = np.diff(np.append(places, n))
    else:  # rows apart: a run each
        places, lengths = np.arange(n, dtype=np.int64), np.ones(n, np.int64)
    none = np.zeros(0, np.int64)
    return BatchReads(lo + grid.gap * places, places, lengths, none, none, none)
