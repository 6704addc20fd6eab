"""Time axes and row maps of open-time selections and combinations of dated stores (pure:
no I/O; beside :mod:`.time`, whose axes they read, since ``plan`` sits below ``manifest``).

A selection or combination (``shardload.select``, ``join``, ``concat``;
:mod:`shardload.store.combine`) reads rows of other stores: row ``i`` of the result is row
``base + (i - start) * step`` of store ``part`` for the :class:`Piece` that holds ``i``, or no
row at all in a *gap* (``part == GAP``: dates between two concatenated stores, missing dates of
the result). The planners here decide the pieces and the result's time axis from the time axes
alone; nothing is read.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from shardload.errors import PlanError, StoreError
from shardload.manifest.time import DATE_UNIT, TimeAxis, parse_frequency_s

#: ``Piece.part`` of rows that no store holds (missing dates between concatenated stores)
GAP = -1


class Piece(NamedTuple):
    """Rows ``[start, start + rows)`` of the result are rows ``base, base + step, ...`` of
    store ``part`` (:data:`GAP`: of none)."""

    start: int
    rows: int
    part: int
    base: int = 0
    step: int = 1


def _row(axis: TimeAxis, date: Any, option: str, what: str) -> int:
    try:
        return axis.row_of(date)
    except (StoreError, ValueError) as exc:
        raise PlanError(f"{option}={date!r}: {exc} of {what}") from None


def plan_time_selection(
    axis: TimeAxis, *, start: Any = None, end: Any = None, frequency: Any = None, what: str = ""
) -> tuple[TimeAxis, Piece]:
    """The dates ``start`` to ``end`` (both included; default: the axis's first and last)
    every ``frequency`` (a multiple of the axis's; default: its own), as a time axis and the
    one piece of rows it reads.

    >>> ax = TimeAxis(np.datetime64("2020-01-01"), np.timedelta64(6, "h"), 8, (2, 3))
    >>> sel, piece = plan_time_selection(ax, start="2020-01-01T06", frequency="12h")
    >>> str(sel.start), sel.frequency_text, sel.length, sel.missing, piece
    ('2020-01-01T06:00:00', '12h', 4, (1,), Piece(start=0, rows=4, part=0, base=1, step=2))
    """
    r0 = 0 if start is None else _row(axis, start, "start", what)
    r1 = axis.length - 1 if end is None else _row(axis, end, "end", what)
    step = 1
    if frequency is not None:
        try:
            freq_s = parse_frequency_s(frequency)
        except (StoreError, ValueError, TypeError) as exc:
            raise PlanError(f"frequency={frequency!r}: {exc}") from None
        step, rest = divmod(freq_s, axis.seconds)
        if rest or step < 1:
            raise PlanError(
                f"frequency={frequency!r} is not a multiple of the native frequency "
                f"{axis.frequency_text} of {what}"
            )
    if r1 < r0:
        raise PlanError(
            f"end={end!r} comes before start={start!r} "
            f"({axis.dates[r1]} < {axis.dates[r0]}) in {what}"
        )
    count = (r1 - r0) // step + 1
    missing = [(m - r0) // step for m in axis.missing if r0 <= m <= r1 and (m - r0) % step == 0]
    sel = TimeAxis(
        start=axis.dates[r0], frequency=axis.frequency * step, length=count, missing=tuple(missing)
    )
    return sel, Piece(0, count, 0, r0, step)


def plan_concat(axes: Sequence[TimeAxis], names: Sequence[str]) -> tuple[TimeAxis, list[Piece]]:
    """The time axis of stores one after the other (``names`` for errors): the same
    frequency, each starting after the one before ends; the dates between them (a gap)
    become missing dates of the result.

    >>> f = np.timedelta64(6, "h")
    >>> a = TimeAxis(np.datetime64("2020-01-01"), f, 4, (1,))
    >>> b = TimeAxis(np.datetime64("2020-01-02T06"), f, 2)
    >>> axis, pieces = plan_concat([a, b], ["a", "b"])
    >>> axis.length, axis.missing, [p.part for p in pieces]
    (7, (1, 4), [0, -1, 1])
    """
    if not axes:
        raise PlanError("concat needs at least one store")
    first = axes[0]
    pieces: list[Piece] = []
    missing: list[int] = []
    row = 0
    for k, axis in enumerate(axes):
        if axis.frequency != first.frequency:
            raise PlanError(
                f"concat: {names[k]} has frequency {axis.frequency_text}, "
                f"{names[0]} {first.frequency_text}: select a common frequency first"
            )
        if k:
            prev = axes[k - 1]
            steps, rest = divmod(
                int((axis.start - prev.end) / np.timedelta64(1, DATE_UNIT)), first.seconds
            )
            if steps < 1 or rest:
                raise PlanError(
                    f"concat: {names[k]} starts at {axis.start}, which is not a date after "
                    f"the end of {names[k - 1]} ({prev.end}) every {first.frequency_text}"
                )
            if steps > 1:  # the dates in between: missing
                pieces.append(Piece(row, steps - 1, GAP))
                missing += range(row, row + steps - 1)
                row += steps - 1
        pieces.append(Piece(row, axis.length, k))
        missing += [row + m for m in axis.missing]
        row += axis.length
    out = TimeAxis(first.start, first.frequency, row, tuple(missing))
    return out, pieces


def join_axes(axes: Sequence[TimeAxis], names: Sequence[str]) -> TimeAxis:
    """The time axis of stores joined side by side: their axes must agree (start, frequency,
    length: the first disagreement is the error); a date missing in any is missing.

    >>> a = TimeAxis(np.datetime64("2020-01-01"), np.timedelta64(1, "D"), 3, (0,))
    >>> join_axes([a, TimeAxis(a.start, a.frequency, 3, (2,))], ["a", "b"]).missing
    (0, 2)
    """
    first = axes[0]
    for k, axis in enumerate(axes[1:], 1):
        for what, x, y in (
            ("starts at", axis.start, first.start),
            ("has frequency", axis.frequency_text, first.frequency_text),
            ("has a length of", axis.length, first.length),
            ("ends at", axis.end, first.end),
        ):
            if x != y:
                raise PlanError(
                    f"join: the time axes disagree: {names[k]} {what} {x}, {names[0]} {y}"
                )
    return TimeAxis(
        first.start,
        first.frequency,
        first.length,
        tuple(sorted({m for a in axes for m in a.missing})),
    )


def plan_chunk_bounds(
    pieces: Sequence[Piece], part_bounds: Sequence[Sequence[int]], gap_rows: int
) -> tuple[int, ...]:
    """Chunk bounds of the result: a chunk holds rows of one chunk of one store (so that a
    chunk of the result reads each of its stores' chunks at most once); a gap is cut into
    chunks of ``gap_rows``.

    >>> plan_chunk_bounds([Piece(0, 4, 0, 1, 2)], [(0, 3, 6, 9)], 5)
    (0, 1, 3, 4)
    >>> plan_chunk_bounds([Piece(0, 6, 0), Piece(0, 6, 1)], [(0, 4, 6), (0, 3, 6)], 1)  # a join
    (0, 3, 4, 6)
    """
    bounds = {0}
    for p in pieces:
        if p.part == GAP:
            bounds.update(range(p.start, p.start + p.rows, max(1, gap_rows)))
        else:
            base = p.base + np.arange(p.rows) * p.step
            which = np.searchsorted(np.asarray(part_bounds[p.part]), base, "right")
            bounds.update((p.start + np.flatnonzero(np.diff(which)) + 1).tolist())
            bounds.add(p.start)
        bounds.add(p.start + p.rows)
    return tuple(sorted(int(b) for b in bounds))
