"""Sample coordinates of a stacked grid, kept as its 1-D axes (pure numpy).

A flat view stacks its ``sample_dims`` into one sample axis in C order (the first dim
slowest), so sample ``i`` of a grid of ``shape`` lies at ``np.unravel_index(i, shape)``: the
coordinate of dim ``k`` along the samples is that dim's 1-D axis repeated. A store keeps the
axes (a few KB for a 2160 x 4320 grid, where the repeated form is 75 MB) and readers expand
them with :func:`expand_axis`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def expand_axis(values: np.ndarray, shape: Sequence[int], axis: int) -> np.ndarray:
    """The coordinate along the stacked samples of the grid ``shape`` whose dim ``axis`` has
    the 1-D coordinate ``values``: sample ``i`` holds ``values[np.unravel_index(i, shape)[axis]]``.

    >>> expand_axis(np.array([10, 20]), (2, 3), 0).tolist()
    [10, 10, 10, 20, 20, 20]
    >>> expand_axis(np.array([1, 2, 3]), (2, 3), 1).tolist()
    [1, 2, 3, 1, 2, 3]
    """
    shape = tuple(int(s) for s in shape)
    values = np.asarray(values)
    if not 0 <= axis < len(shape) or values.shape != (shape[axis],):
        raise ValueError(f"an axis of {values.shape} values does not fit dim {axis} of {shape}")
    outer = int(np.prod(shape[:axis], dtype=np.int64))
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    # one copy: each value repeated inner times, the whole repeated outer times
    return np.tile(np.repeat(values, inner), outer)


def expand_axis_rows(
    values: np.ndarray, shape: Sequence[int], axis: int, start: int, stop: int
) -> np.ndarray:
    """Rows ``[start, stop)`` of :func:`expand_axis`, without the rest (a chunk of a 9.3 M-sample
    coordinate at a time, not the 37 MB of the whole).

    >>> expand_axis_rows(np.array([10, 20]), (2, 3), 0, 2, 5).tolist()
    [10, 20, 20]
    >>> expand_axis_rows(np.array([1, 2, 3]), (2, 3), 1, 2, 5).tolist()
    [3, 1, 2]
    """
    shape = tuple(int(s) for s in shape)
    values = np.asarray(values)
    if not 0 <= axis < len(shape) or values.shape != (shape[axis],):
        raise ValueError(f"an axis of {values.shape} values does not fit dim {axis} of {shape}")
    inner = int(np.prod(shape[axis + 1 :], dtype=np.int64))
    n = shape[axis]
    first, last = start // inner, max(start, stop - 1) // inner + 1  # the runs rows lie in
    k, count = first % n, last - first  # run j holds values[(first + j) % n]
    if count <= n:  # at most one wrap of the axis: two slices
        sel = (
            values[k : k + count]
            if k + count <= n
            else np.concatenate([values[k:], values[: k + count - n]])
        )
    else:
        sel = np.tile(np.roll(values, -k), count // n + 1)[:count]
    runs = np.repeat(sel, inner) if inner > 1 else sel
    return runs[start - first * inner : stop - first * inner]


def expand_sample_coords(
    values: Mapping[str, np.ndarray], options: Mapping[str, Any], length: int
) -> dict[str, np.ndarray]:
    """A store's sample coordinates (``_coords.npz``) with one value per sample: a grid's 1-D
    axes expanded over the grid that the manifest option ``sample_coords_grid`` gives
    (``{"shape": [...], "axes": {name: dim}}``); per-sample values (stores written before
    2026-11-27, copies) as they are.

    >>> opts = {"sample_coords_grid": {"shape": [2, 2], "axes": {"lat": 0}}}
    >>> expand_sample_coords({"lat": np.array([5, 6])}, opts, 4)["lat"].tolist()
    [5, 5, 6, 6]
    """
    grid = options.get("sample_coords_grid") or {}
    shape, axes = grid.get("shape"), grid.get("axes") or {}
    out = {}
    for n, v in values.items():
        if v.shape == (length,) or shape is None or n not in axes:
            out[n] = np.asarray(v)
        else:
            try:
                out[n] = expand_axis(v, shape, int(axes[n]))
            except ValueError as exc:
                raise ValueError(f"coordinate {n!r}: {exc}") from exc
    return out
