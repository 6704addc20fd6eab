"""Missing dates leave the epoch: the rows a dated store lists as missing (``Store.time.missing``,
an anemoi-datasets store's ``missing_dates`` or shardload's own) are cut out of the selection
before the epoch is planned, so no loader ever yields them.

The selection is a list of pieces (``sizes[i]`` rows from global row ``starts[i]``, in store
chunk ``ids[i]``); a piece holding missing rows becomes the runs of rows around them, in the
same chunk. Everything after (shuffle groups, ranks and workers, equal batches, resume state)
plans over the pieces as it does over any cut selection.

``missing_dates`` (the loaders' option):

- ``"skip"`` (default): missing rows are left out;
- ``"error"``: a selection holding a missing row is refused at plan time, naming its date;
- ``"include"``: missing rows are yielded as stored (NaN, or the store's fill value).

Pure: no I/O.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from shardload.errors import PlanError

MISSING_DATES: Final = ("skip", "error", "include")
DEFAULT_MISSING_DATES: Final = "skip"


def check_missing_dates(value: str) -> str:
    """``value`` if it is one of :data:`MISSING_DATES`, else a :class:`PlanError` naming them."""
    if value not in MISSING_DATES:
        raise PlanError(f"missing_dates={value!r}: choose one of {', '.join(MISSING_DATES)}")
    return value


def first_missing_row(
    sizes: np.ndarray, starts: np.ndarray, missing: np.ndarray | tuple[int, ...]
) -> int | None:
    """The first (lowest) missing row inside the pieces, or None.

    >>> first_missing_row(np.array([3, 3]), np.array([0, 10]), (5, 11))
    11
    """
    miss = np.unique(np.asarray(missing, dtype=np.int64))
    if miss.size == 0 or len(sizes) == 0:
        return None
    order = np.argsort(starts, kind="stable")
    s, n = np.asarray(starts, np.int64)[order], np.asarray(sizes, np.int64)[order]
    p = np.searchsorted(s, miss, side="right") - 1  # the piece starting at or before each
    inside = (p >= 0) & (miss < s[np.maximum(p, 0)] + n[np.maximum(p, 0)])
    return int(miss[inside][0]) if inside.any() else None


def cut_missing_rows(
    sizes: np.ndarray, ids: np.ndarray, starts: np.ndarray, missing: np.ndarray | tuple[int, ...]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces ``(sizes, ids, starts)`` without the rows in ``missing`` (global rows): each
    piece becomes the runs of its rows that are not missing, in order; pieces left empty go.

    >>> cut = cut_missing_rows(np.array([4, 4]), np.array([0, 1]), np.array([0, 4]), (1, 2, 4))
    >>> [c.tolist() for c in cut]
    [[1, 1, 3], [0, 0, 1], [0, 3, 5]]
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    ids, starts = np.asarray(ids, dtype=np.int64), np.asarray(starts, dtype=np.int64)
    miss = np.unique(np.asarray(missing, dtype=np.int64))
    if miss.size == 0 or first_missing_row(sizes, starts, miss) is None:
        return sizes, ids, starts
    piece = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    rows = np.repeat(starts - np.cumsum(sizes) + sizes, sizes) + np.arange(int(sizes.sum()))
    keep = ~np.isin(rows, miss)
    piece, rows = piece[keep], rows[keep]
    if rows.size == 0:
        return rows, rows.copy(), rows.copy()
    # a run starts where the piece changes or a row does not follow the one before
    new = np.ones(rows.size, dtype=bool)
    new[1:] = (piece[1:] != piece[:-1]) | (rows[1:] != rows[:-1] + 1)
    first = np.flatnonzero(new)
    out_sizes = np.diff(np.append(first, rows.size))
    return out_sizes.astype(np.int64), ids[piece[first]], rows[first]
