"""Read a row range of a lazy DataArray whose leading dims are stacked into one sample axis.

Rows are numbered in C order over ``sample_dims``. For rows ``[start, stop)`` we load the
smallest slab that holds them -- a range of the first sample dim, full ranges of the others
(a single index of every dim but the last when the rows sit inside one "line") -- and then cut
the rows out of it. Only that slab is read from disk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import dask
import numpy as np
import xarray as xr

from shardload.errors import ViewError


@runtime_checkable
class RowReader(Protocol):
    """A fast reader of a source's rows that bypasses dask (e.g.
    :class:`~shardload.prep.sources.radiation_rows.RadiationRows`): ``read_rows`` returns, for each
    name in ``names``, rows ``[start, stop)`` of the variable made sample-major, exactly what
    :func:`read_many` would return for it."""

    names: Sequence[str]

    def read_rows(
        self,
        names: Sequence[str],
        start: int,
        stop: int,
        *,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """``out`` (optional) holds destination arrays to fill in place, for some names."""
        ...


def read_vars(
    das: Sequence[xr.DataArray],
    sample_dims: Sequence[str],
    start: int,
    stop: int,
    rows: RowReader | None = None,
    *,
    out: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """:func:`read_many`: variables that ``rows`` serves through it (their ``out``
    destinations, per variable or None, may be filled in place and returned), the others
    through the lazy dataset."""
    names = [str(d.name) for d in das]
    served = [rows is not None and n in rows.names for n in names]
    res: list[np.ndarray | None] = [None] * len(das)
    if rows is not None and any(served):
        dests = out or [None] * len(names)
        mine = [n for n, s in zip(names, served, strict=True) if s]
        given = {n: o for n, o, s in zip(names, dests, served, strict=True) if s and o is not None}
        got = rows.read_rows(mine, start, stop, out=given)
        res = [got[n] if s else None for n, s in zip(names, served, strict=True)]
    lazy = [d for d, s in zip(das, served, strict=True) if not s]
    if lazy:
        it = iter(read_many(lazy, sample_dims, start, stop))
        res = [next(it) if r is None else r for r in res]
    return [r for r in res if r is not None]


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
    return read_many([da], sample_dims, start, stop)[0]


def read_many(
    das: Sequence[xr.DataArray], sample_dims: Sequence[str], start: int, stop: int
) -> list[np.ndarray]:
    """:func:`read_rows` for several variables in one dask computation (one graph, one pass)."""
    slabs, cuts = [], []
    for da in das:
        slab, cut = _slab(da, sample_dims, start, stop)
        slabs.append(slab)
        cuts.append(cut)
    lazy = [s.data for s in slabs]
    with dask.config.set(scheduler="synchronous"):
        values = (
            dask.compute(*lazy)
            if any(isinstance(v, dask.array.Array) for v in lazy)
            else [np.asarray(s.values) for s in slabs]
        )
    out = []
    for v, s, (lo, hi) in zip(values, slabs, cuts, strict=True):
        rest = tuple(s.shape[len(sample_dims) :])
        out.append(np.asarray(v).reshape(-1, *rest)[lo:hi])
    return out


def _slab(
    da: xr.DataArray, sample_dims: Sequence[str], start: int, stop: int
) -> tuple[xr.DataArray, tuple[int, int]]:
    """The lazy bounding slab of rows ``[start, stop)`` and where the rows sit inside it."""
    dims = list(sample_dims)
    sizes = [da.sizes[d] for d in dims]
    n = int(np.prod(sizes, dtype=np.int64))
    if not 0 <= start <= stop <= n:
        raise ViewError(f"rows [{start}, {stop}) out of range for {da.name!r} of {n} samples")
    if stop == start:
        return da.isel({dims[0]: slice(0, 0)}), (0, 0)
    strides = np.cumprod([1, *sizes[::-1][:-1]])[::-1]
    first = np.unravel_index(start, sizes)
    last = np.unravel_index(stop - 1, sizes)
    sel: dict[str, slice] = {}
    k = 0
    while k < len(dims) - 1 and first[k] == last[k]:
        sel[dims[k]] = slice(int(first[k]), int(first[k]) + 1)
        k += 1
    sel[dims[k]] = slice(int(first[k]), int(last[k]) + 1)
    for j in range(k + 1, len(dims)):
        sel[dims[j]] = slice(None)
    offset = int(sum(int(sel[d].start or 0) * int(s) for d, s in zip(dims, strides, strict=True)))
    return da.isel(sel), (start - offset, stop - offset)


def load_values(da: xr.DataArray) -> np.ndarray:
    # Inside a write task we are already parallel: compute dask pieces synchronously.
    with dask.config.set(scheduler="synchronous"):
        return np.asarray(da.values)
