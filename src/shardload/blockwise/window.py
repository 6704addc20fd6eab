"""The window of one block: read once with every attribute's halo, then padded per attribute
exactly as dask's ``map_overlap`` pads the whole array."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import product
from typing import Any

import numpy as np

from shardload.blockwise.job import AttributePlan
from shardload.blockwise.plan import (
    CONSTANT,
    AxisWindow,
    plan_axis,
    runs,
)


def read_window(
    read: Callable[[Sequence[tuple[int, int]]], np.ndarray],
    box: Sequence[tuple[int, int]],
    shape: Sequence[int],
    attributes: Sequence[AttributePlan],
    *,
    dtype: np.dtype[Any],
) -> tuple[np.ndarray, list[np.ndarray], list[list[AxisWindow]]]:
    """Read the window of block ``box`` (the block with every attribute's halo) once: one read,
    or one per piece where a periodic boundary wraps around. Returns the window (read-only),
    the source index of each of its elements per axis, and each attribute's axis windows."""
    axes = [
        [plan_axis(a, b, n, att.depth[k], att.boundary[k]) for att in attributes]
        for k, ((a, b), n) in enumerate(zip(box, shape, strict=True))
    ]
    axis_runs = [runs([i for w in ws for i in w.index]) for ws in axes]
    if all(len(r) == 1 for r in axis_runs):
        buf = read([r[0] for r in axis_runs])
    else:
        buf = np.empty([sum(b - a for a, b in r) for r in axis_runs], dtype=dtype)
        offsets = [np.cumsum([0] + [b - a for a, b in r]) for r in axis_runs]
        for pick in product(*[range(len(r)) for r in axis_runs]):
            where = tuple(
                slice(int(offsets[k][j]), int(offsets[k][j + 1])) for k, j in enumerate(pick)
            )
            buf[where] = read([axis_runs[k][j] for k, j in enumerate(pick)])
    buf.flags.writeable = False
    coords = [np.concatenate([np.arange(a, b) for a, b in r]) for r in axis_runs]
    per_attribute = [[axes[k][j] for k in range(len(shape))] for j in range(len(attributes))]
    return buf, coords, per_attribute


def pad_window(
    buf: np.ndarray, coords: Sequence[np.ndarray], windows: Sequence[AxisWindow], att: AttributePlan
) -> np.ndarray:
    """The attribute's padded block, as dask pads it: a view of the window where no padding is
    needed, else one copy (slice copies per run of the index maps; constants filled).
    Read-only either way."""
    idx, const = [], []
    for k, w in enumerate(windows):
        index = np.asarray(w.index)
        idx.append(np.searchsorted(coords[k], np.maximum(index, 0)))
        const.append(index == CONSTANT)
    if all(not c.any() and (np.diff(i) == 1).all() for i, c in zip(idx, const, strict=True)):
        return buf[tuple(slice(int(i[0]), int(i[-1]) + 1) for i in idx)]
    # one allocation filled by a few slice copies per axis piece, not a fancy index on every axis
    padded = np.empty(tuple(len(i) for i in idx), dtype=buf.dtype)
    axis_pieces = [_pieces(i, c) for i, c in zip(idx, const, strict=True)]
    for combo in product(*axis_pieces):
        dst = tuple(d for d, _ in combo)
        if any(src is None for _, src in combo):
            continue  # a constant piece: filled below
        padded[dst] = buf[tuple(src for _, src in combo if src is not None)]
    for k, c in enumerate(const):
        if c.any():
            padded[(slice(None),) * k + (c,)] = att.boundary[k]
    padded.flags.writeable = False
    return padded


def _pieces(idx: np.ndarray, const: np.ndarray) -> list[tuple[slice, slice | None]]:
    """Split an index map into runs copyable by one slice: ascending, descending (reflect),
    repeated (nearest), or constant (``None``); as ``(destination, source)`` slices.

    >>> [(d.start, d.stop, s.start, s.stop, s.step) for d, s in
    ...  _pieces(np.array([1, 0, 0, 1, 2, 2, 2]), np.zeros(7, bool))]
    [(0, 2, 1, None, -1), (2, 5, 0, 3, None), (5, 7, 2, 3, None)]
    """
    out: list[tuple[slice, slice | None]] = []
    n = len(idx)
    a = 0
    while a < n:
        if const[a]:
            b = a + 1
            while b < n and const[b]:
                b += 1
            out.append((slice(a, b), None))
            a = b
            continue
        b = a + 1
        step = None
        while b < n and not const[b]:
            d = int(idx[b]) - int(idx[b - 1])
            if d not in (-1, 0, 1) or (step is not None and d != step):
                break
            step = d
            b += 1
        first, last = int(idx[a]), int(idx[b - 1])
        if step == -1:
            out.append((slice(a, b), slice(first, last - 1 if last > 0 else None, -1)))
        elif step == 0:  # a repeated index (nearest): one source element, broadcast
            out.append((slice(a, b), slice(first, first + 1)))
        else:  # ascending, or a single element
            out.append((slice(a, b), slice(first, last + 1)))
        a = b
    return out
