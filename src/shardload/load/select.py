"""Which rows a loader reads: a split, an explicit subset of chunks, and/or a row range.

The result is a *chunk table* (sizes, ids, global first rows) that the pure epoch planner
takes as is; a row range cuts the first and last chunks it touches into pieces, and
:func:`split_pieces` cuts long chunks into pieces (the loader's shuffle unit).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from shardload.errors import PlanError, StoreError
from shardload.manifest.core import validate_aligned
from shardload.plan.missing_dates import (
    DEFAULT_MISSING_DATES,
    check_missing_dates,
    cut_missing_rows,
    first_missing_row,
)
from shardload.store.core import Store


@dataclass(frozen=True, eq=False)
class Selection:
    """The rows to read, as pieces of chunks in their natural order, and the arrays to read.

    ``sizes[i]`` rows from global row ``starts[i]``, inside store chunk ``ids[i]``. With
    ``window`` (``(K, step)``: windows of dates, :mod:`shardload.load.dated`) each row is the
    first row of a window.
    """

    arrays: tuple[str, ...]
    sizes: np.ndarray
    ids: np.ndarray
    starts: np.ndarray
    window: tuple[int, int] | None = None

    @property
    def num_rows(self) -> int:
        return int(self.sizes.sum())

    def global_rows(self) -> np.ndarray:
        """Every selected row, in order (for tests and small data)."""
        parts = [
            np.arange(s, s + n, dtype=np.int64)
            for s, n in zip(self.starts, self.sizes, strict=True)
        ]
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)


def select_rows(
    store: Store,
    *,
    split: str | None = None,
    chunks: Sequence[int] | None = None,
    rows: tuple[int, int] | None = None,
    arrays: Sequence[str] | None = None,
    missing_dates: str = DEFAULT_MISSING_DATES,
) -> Selection:
    """Resolve a selection against a store's manifest (no array is opened).

    ``split`` and ``chunks`` are exclusive (``chunks`` are store chunk ids); ``rows`` is a global
    ``(start, stop)`` range intersected with them (or with the whole store). In a dated store
    the rows of missing dates (``store.time.missing``) are left out (``missing_dates="skip"``),
    refused (``"error"``) or kept (``"include"``): :mod:`shardload.plan.missing_dates`.

    Raises
    ------
    StoreError
        Unknown split (the message lists the existing ones) or array; arrays of unequal length.
    PlanError
        Bad chunk ids or row range, or an empty selection.
    """
    m = store.manifest
    names = tuple(arrays) if arrays is not None else tuple(m.arrays)
    missing = [a for a in names if a not in m.arrays]
    if missing:
        raise StoreError(
            f"array(s) {missing} not in store {store.url}; it has {list(m.arrays)}"
            + store.left_out(missing)
        )
    if not names:
        raise StoreError("arrays=[] selects nothing to read")
    validate_aligned([m.arrays[a] for a in names], m.length)
    if split is not None and chunks is not None:
        raise PlanError("pass either split= or chunks=, not both")
    if chunks is not None:
        ids = np.asarray(list(chunks), dtype=np.int64).reshape(-1)
        bad = ids[(ids < 0) | (ids >= m.num_chunks)]
        if len(bad):
            raise PlanError(
                f"chunk ids {bad[:5].tolist()} out of range: the store has {m.num_chunks} chunks"
            )
        if len(np.unique(ids)) != len(ids):
            raise PlanError("chunks= lists a chunk more than once")
    elif split is not None:
        ids = np.asarray(m.split_chunks(split), dtype=np.int64)
    else:
        ids = np.arange(m.num_chunks, dtype=np.int64)
    bounds = m.bounds
    starts, stops = bounds[ids], bounds[ids + 1]
    if rows is not None:
        a, b = (int(r) for r in rows)
        if not 0 <= a <= b <= m.length:
            raise PlanError(f"rows=({a}, {b}) is not a range within 0..{m.length}")
        starts, stops = np.maximum(starts, a), np.minimum(stops, b)
    if split is not None and split in m.split_rows:  # a row-range split cuts its end chunks
        a, b = m.split_rows[split]
        starts, stops = np.maximum(starts, a), np.minimum(stops, b)
    if rows is not None or (split is not None and split in m.split_rows):
        keep = stops > starts
        ids, starts, stops = ids[keep], starts[keep], stops[keep]
    what = (
        f"the selection (split={split!r}, chunks={'given' if chunks is not None else None}, "
        f"rows={rows})"
    )
    if len(ids) == 0:
        raise PlanError(f"{what} has no rows")
    sizes, ids, starts = _dated(store, stops - starts, ids, starts, missing_dates, what)
    return Selection(names, sizes, ids, starts)


def _dated(
    store: Store, sizes: np.ndarray, ids: np.ndarray, starts: np.ndarray, how: str, what: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The pieces without the rows of missing dates (``how``: ``missing_dates``)."""
    check_missing_dates(how)
    axis = store.time
    if axis is None or not axis.missing or how == "include":
        return sizes, ids, starts
    first = first_missing_row(sizes, starts, axis.missing)
    if first is None:
        return sizes, ids, starts
    if how == "error":
        raise PlanError(
            f"missing_dates='error': {what} of {store.url} holds missing dates, the first "
            f"{axis.dates[first]} (row {first}); missing_dates='skip' leaves them out, "
            "'include' yields them as stored"
        )
    cut = cut_missing_rows(sizes, ids, starts, axis.missing)
    if len(cut[0]) == 0:
        raise PlanError(f"{what} of {store.url} has only missing dates: no row to read")
    return cut


def split_pieces(sel: Selection, piece_rows: int) -> Selection:
    """``sel`` with every piece longer than ``piece_rows`` rows cut into equal pieces of at most
    ``piece_rows`` rows (pure; ``piece_rows=0``: unchanged).

    The epoch planner shuffles and groups pieces as it does chunks, so the shuffle buffer costs
    ``shuffle_chunks`` pieces instead of whole chunks, and a chunk's pieces spread over the epoch.

    >>> sel = Selection(("x",), np.array([10, 3]), np.array([0, 1]), np.array([0, 10]))
    >>> cut = split_pieces(sel, 4)
    >>> cut.sizes.tolist(), cut.ids.tolist(), cut.starts.tolist()
    ([4, 3, 3, 3], [0, 0, 0, 1], [0, 4, 7, 10])
    """
    p = int(piece_rows)
    if p < 0:
        raise PlanError(f"piece_rows must be an integer >= 0, got {piece_rows!r}")
    if p == 0 or int(sel.sizes.max()) <= p:
        return sel
    n = sel.sizes.astype(np.int64)
    k = -(-n // p)  # pieces of each entry
    entry = np.repeat(np.arange(len(n)), k)
    j = np.arange(int(k.sum()), dtype=np.int64) - np.repeat(np.cumsum(k) - k, k)
    base, extra = n[entry] // k[entry], n[entry] % k[entry]
    sizes = base + (j < extra)
    starts = sel.starts[entry] + j * base + np.minimum(j, extra)
    return Selection(sel.arrays, sizes, sel.ids[entry], starts.astype(np.int64), sel.window)


def plan_piece_rows(chunk_rows: int, row_bytes: int, target_bytes: int) -> int:
    """Rows per piece so that a chunk of ``chunk_rows`` rows of ``row_bytes`` bytes is cut into
    equal pieces of at most ``target_bytes`` (pure; a chunk that fits stays whole).

    >>> plan_piece_rows(4096, 6208, 8 << 20), plan_piece_rows(1000, 100, 8 << 20)
    (1024, 1000)
    """
    pieces = max(1, -(-int(chunk_rows) * int(row_bytes) // max(1, int(target_bytes))))
    return max(1, -(-int(chunk_rows) // pieces))


def store_fingerprint(store: Store, selection: Selection) -> str:
    """A short hash identifying the data (layout, arrays, statistics) and the selection.

    Statistics make two stores with the same layout but other values differ.
    """
    m = store.manifest
    desc = {
        "length": m.length,
        "bounds": list(m.chunk_bounds),
        "arrays": {a: [list(m.arrays[a].shape), m.arrays[a].dtype] for a in selection.arrays},
    }
    window = getattr(selection, "window", None)  # any object with the Selection's columns
    if window is not None:  # windows of dates: K and step pick other samples
        desc["window"] = list(window)
    h = hashlib.blake2b(json.dumps(desc, sort_keys=True, default=str).encode(), digest_size=8)
    for a in sorted(set(m.stats) & set(selection.arrays)):  # every value, not numpy's summary
        h.update(a.encode())
        for values in (m.stats[a].mean, m.stats[a].std):
            h.update(np.ascontiguousarray(values, "<f8").tobytes())
    for arr in (selection.sizes, selection.ids, selection.starts):
        h.update(np.asarray(arr, "<i8").tobytes())
    return h.hexdigest()
