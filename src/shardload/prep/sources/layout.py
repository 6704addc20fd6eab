"""The decode units of an opened source, per dim: what one read of the file decodes whole.

* HDF5 / netCDF-4 / Zarr variables: their internal chunks (xarray's ``preferred_chunks``,
  else the ``chunksizes`` / ``chunks`` of their encoding); contiguous variables have none.
* GRIB (cfgrib): one message is one field, every grid point of it: the grid dims (``values``,
  or ``latitude``/``longitude``, ``y``/``x``) whole, 1 along every other dim.

:func:`plan_reads` turns them into how ``prepare`` reads (:mod:`shardload.plan.reads`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from shardload.plan.reads import (
    READ_BUDGET_BYTES,
    plan_aligned_chunk_rows,
    plan_blocks_per_read,
    plan_read_chunks,
    plan_unit_rows,
)

#: cfgrib's grid types whose fields have two grid dims (all others: one, ``values``)
_GRIB_2D = frozenset(
    {
        "regular_ll",
        "regular_gg",
        "rotated_ll",
        "rotated_gg",
        "lambert",
        "lambert_azimuthal_equal_area",
        "albers",
        "polar_stereographic",
        "mercator",
        "space_view",
    }
)


def is_grib(da: Any) -> bool:
    """Whether ``da`` was opened from GRIB by cfgrib (its encoding names the message filter;
    a netCDF file converted from GRIB keeps the ``GRIB_*`` attributes, not that)."""
    enc = getattr(da, "encoding", {}) or {}
    return "GRIB_gridType" in getattr(da, "attrs", {}) and "filter_by_keys" in enc


def unit_extents(da: Any) -> dict[str, int]:
    """``{dim: extent}`` of one variable's decode unit (dims it has no unit along: absent)."""
    attrs = getattr(da, "attrs", {})
    if is_grib(da):
        geo = 2 if attrs["GRIB_gridType"] in _GRIB_2D else 1
        dims = list(da.dims)
        grid = set(dims[len(dims) - geo :])
        return {str(d): int(da.sizes[d]) if d in grid else 1 for d in dims}
    enc = getattr(da, "encoding", {}) or {}
    preferred = enc.get("preferred_chunks")
    if isinstance(preferred, Mapping) and preferred:
        return {str(d): int(c) for d, c in preferred.items() if d in da.dims}
    chunks = enc.get("chunksizes") or enc.get("chunks")
    if chunks and len(chunks) == da.ndim and not enc.get("contiguous"):
        return {str(d): int(c) for d, c in zip(da.dims, chunks, strict=True)}
    return {}


@dataclass(frozen=True)
class ReadPlan:
    """How the write tasks read the source: ``chunk_rows`` of the store, ``blocks_per_read``
    consecutive write blocks read at once, and the dask ``chunks`` to open the source with
    (``None``: as before, the source's own)."""

    chunk_rows: int
    blocks_per_read: int = 1
    chunks: tuple[tuple[str, int], ...] | None = None
    unit_rows: int = 1


def plan_reads(
    ds: Any,
    names: Sequence[str],
    sample_dims: Sequence[str],
    *,
    chunk_rows: int,
    chunks_per_block: int,
    row_bytes: int,
    length: int,
    align: bool,
    budget_bytes: int = READ_BUDGET_BYTES,
) -> ReadPlan:
    """The :class:`ReadPlan` of variables ``names`` of ``ds`` (opened lazily) read along
    ``sample_dims``. ``align``: the store's ``chunk_rows`` is ours to round (not the user's).
    ``budget_bytes``: decoded rows one process may hold for read groups."""
    das = [ds[n] for n in names if n in ds.variables]
    das = [d for d in das if all(s in d.dims for s in sample_dims)]
    if not das or not sample_dims:
        return ReadPlan(chunk_rows)
    sizes = [int(ds.sizes[d]) for d in sample_dims]
    per_dim: dict[str, int] = {}
    for da in das:
        for dim, ext in unit_extents(da).items():
            per_dim[dim] = min(math.lcm(per_dim.get(dim, 1), ext), int(ds.sizes[dim]))
    if not per_dim:  # no decode units known (contiguous, netCDF-3): the source's own chunks
        return ReadPlan(chunk_rows)
    units = [per_dim.get(d, 1) for d in sample_dims]
    unit_rows = plan_unit_rows(sizes, units)
    if align:
        chunk_rows = min(plan_aligned_chunk_rows(chunk_rows, unit_rows), length) or chunk_rows
    block_rows = chunk_rows * max(1, chunks_per_block)
    num_blocks = -(-length // block_rows)
    per_read = plan_blocks_per_read(
        num_blocks=num_blocks,
        block_rows=block_rows,
        row_bytes=row_bytes,
        unit_rows=unit_rows,
        budget_bytes=budget_bytes,
    )
    read = plan_read_chunks(sizes, units, per_read * block_rows)
    chunks = dict(zip(sample_dims, read, strict=True))
    for da in das:  # dims that are not sample dims: read whole, GRIB fields one at a time
        for dim in da.dims:
            if dim not in chunks:
                grib = is_grib(da)
                chunks[str(dim)] = per_dim.get(str(dim), 1) if grib else int(da.sizes[dim])
    for dim, unit in per_dim.items():  # a whole number of units, or the whole dim
        size = int(ds.sizes[dim])
        if chunks.get(dim, size) % unit and chunks.get(dim, size) < size:
            chunks[dim] = max(unit, chunks[dim] // unit * unit)
    return ReadPlan(chunk_rows, per_read, tuple(sorted(chunks.items())), unit_rows)
