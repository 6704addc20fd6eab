"""Read a row range of a lazy DataArray whose leading dims are stacked into one sample axis.

Rows are numbered in C order over ``sample_dims``. For rows ``[start, stop)`` we load the
smallest slab that holds them -- a range of the first sample dim, full ranges of the others
(a single index of every dim but the last when the rows sit inside one "line") -- and then cut
the rows out of it. Only that slab is read from disk.
"""

from __future__ import annotations

from collections.abc import Sequence

import dask
import numpy as np
import xarray as xr

from ..errors import ViewError


def sample_length(da: xr.DataArray, sample_dims: Sequence[str]) -> int:
    missing = [d for d in sample_dims if d not in da.dims]
    if missing:
        raise ViewError(
            f"variable {da.name!r} lacks sample dim(s) {missing}; its dims are {list(da.dims)}"
        )
    return int(np.prod([da.sizes[d] for d in sample_dims], dtype=np.int64))


def sample_major(da: xr.DataArray, sample_dims: Sequence[str]) -> xr.DataArray:
    """Transpose so that the sample dims come first, in the given order."""
    sample_length(da, sample_dims)
    rest = [d for d in da.dims if d not in sample_dims]
    return da.transpose(*sample_dims, *rest)


def read_rows(da: xr.DataArray, sample_dims: Sequence[str], start: int, stop: int) -> np.ndarray:
    """Rows ``[start, stop)`` of ``da`` with ``sample_dims`` stacked, as ``(rows, *rest)``.

    ``da`` must already be sample-major (see :func:`sample_major`).
    """
    dims = list(sample_dims)
    sizes = [da.sizes[d] for d in dims]
    n = int(np.prod(sizes, dtype=np.int64))
    if not 0 <= start <= stop <= n:
        raise ViewError(f"rows [{start}, {stop}) out of range for {da.name!r} of {n} samples")
    rest_shape = tuple(da.shape[len(dims) :])
    if stop == start:
        return np.empty((0, *rest_shape), dtype=da.dtype)
    # strides of the stacked index, C order
    strides = np.cumprod([1, *sizes[::-1][:-1]])[::-1]
    first = np.unravel_index(start, sizes)
    last = np.unravel_index(stop - 1, sizes)
    # find the first dim where first and last differ: dims before it are single indices
    sel: dict[str, slice] = {}
    k = 0
    while k < len(dims) - 1 and first[k] == last[k]:
        sel[dims[k]] = slice(int(first[k]), int(first[k]) + 1)
        k += 1
    sel[dims[k]] = slice(int(first[k]), int(last[k]) + 1)
    for j in range(k + 1, len(dims)):
        sel[dims[j]] = slice(None)
    slab = _load(da.isel(sel))
    slab = slab.reshape(-1, *rest_shape)
    # offset of the slab's first row in the stacked numbering
    offset = int(sum(int(sel[d].start or 0) * int(s) for d, s in zip(dims, strides, strict=True)))
    return slab[start - offset : stop - offset]


def _load(da: xr.DataArray) -> np.ndarray:
    # Inside a write task we are already parallel: compute dask pieces synchronously.
    with dask.config.set(scheduler="synchronous"):
        return np.asarray(da.values)
