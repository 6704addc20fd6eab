"""How ``prepare`` reads its source: write tasks planned around the source's own layout (pure).

A source is decoded in *units*: an internal HDF5/netCDF-4/Zarr chunk, a GRIB message (every
grid point of one field). Reading any rows of a unit decodes all of it. Rows are numbered in C
order over the sample dims, so the smallest row range made of whole units is ``c * inner``
rows, where ``c`` is the unit's extent along the outermost sample dim it does not hold whole
(of size 1 along the dims before it) and ``inner`` the product of the sizes after it
(:func:`plan_unit_rows`). Then:

* units smaller than a write block: the store's default ``chunk_rows`` is rounded down to a
  whole number of units (:func:`plan_aligned_chunk_rows`) and each block is read in one piece
  of whole units (:func:`plan_read_chunks`): every unit is decoded once;
* units larger than a write block (a GRIB field with its grid points as samples): the rows
  of several consecutive blocks are read at once, by the first of their write tasks in a
  process, for all of them (:func:`plan_blocks_per_read`), as many as a memory budget allows,
  so that a unit is decoded once per such group instead of once per block.
"""

from __future__ import annotations

from collections.abc import Sequence

#: bytes of decoded rows a process holds for groups of blocks read at once
READ_BUDGET_BYTES = 1 << 30


def plan_unit_rows(sizes: Sequence[int], units: Sequence[int]) -> int:
    """Rows (C order over the sample dims of ``sizes``) of the smallest row range made of
    whole source units, whose extents along those dims are ``units``.

    >>> plan_unit_rows((2160, 4320), (64, 64))   # 64 lines of 4320 points
    276480
    >>> plan_unit_rows((4498560,), (4498560,))   # one GRIB message holds every point
    4498560
    >>> plan_unit_rows((10, 4), (1, 1))          # one message per sample
    1
    >>> plan_unit_rows((100, 30), (1, 7))        # 7 of the 30 points of one step
    7
    """
    if len(sizes) != len(units):
        raise ValueError(f"sizes {tuple(sizes)} and units {tuple(units)} differ in length")
    for i, (size, unit) in enumerate(zip(sizes, units, strict=True)):
        unit = max(1, min(int(unit), int(size)))
        if unit > 1 or i == len(sizes) - 1:
            inner = 1
            for s in sizes[i + 1 :]:
                inner *= int(s)
            return unit * inner
    return 1


def plan_aligned_chunk_rows(chunk_rows: int, unit_rows: int) -> int:
    """``chunk_rows`` made a whole number of units (rounded down) where a unit fits in a chunk,
    else a whole fraction of a unit (the largest divisor of ``unit_rows`` not above it, if one
    is within 2x): no unit is then split between two chunks that another task reads.

    >>> plan_aligned_chunk_rows(4194304, 276480)     # 15 units of 64 grid lines
    4147200
    >>> plan_aligned_chunk_rows(199728, 4498560)     # 1/24 of a GRIB field
    187440
    >>> plan_aligned_chunk_rows(1000, 1)
    1000
    """
    if unit_rows <= 1 or chunk_rows <= 0:
        return chunk_rows
    if unit_rows <= chunk_rows:
        return chunk_rows // unit_rows * unit_rows
    first = -(-unit_rows // chunk_rows)
    for parts in range(first, 2 * first + 1):
        if unit_rows % parts == 0:
            return unit_rows // parts
    return chunk_rows


def plan_blocks_per_read(
    *,
    num_blocks: int,
    block_rows: int,
    row_bytes: int,
    unit_rows: int,
    budget_bytes: int = READ_BUDGET_BYTES,
) -> int:
    """Consecutive write blocks whose rows are read at once (by the first of their tasks in a
    process, for all of them): enough to hold a whole source unit, and no more than half of
    ``budget_bytes`` (two such groups may be held at once, the one ending and the next).

    >>> plan_blocks_per_read(num_blocks=24, block_rows=187440, row_bytes=84,
    ...                      unit_rows=4498560)    # a GRIB field: 378 MB, read once
    24
    >>> plan_blocks_per_read(num_blocks=240, block_rows=187440, row_bytes=840,
    ...                      unit_rows=4498560)    # 3.8 GB: 3 blocks (472 MB) per read
    3
    >>> plan_blocks_per_read(num_blocks=3, block_rows=4147200, row_bytes=4,
    ...                      unit_rows=276480)     # units fit in a block
    1
    """
    if unit_rows <= block_rows or num_blocks <= 1:
        return 1
    want = -(-unit_rows // block_rows)
    by_memory = max(1, budget_bytes // 2 // max(1, block_rows * row_bytes))
    return int(max(1, min(want, by_memory, num_blocks)))


def plan_read_chunks(sizes: Sequence[int], units: Sequence[int], rows: int) -> tuple[int, ...]:
    """Dask chunks along the sample dims (of ``sizes``) for reads of ``rows`` consecutive rows:
    whole dims inside, a whole number of units along the dim a read ends in (never less than
    one unit), 1 outside.

    >>> plan_read_chunks((2160, 4320), (64, 64), 4147200)   # 15 x 64 grid lines
    (960, 4320)
    >>> plan_read_chunks((4498560,), (4498560,), 2249280)   # a unit larger than the read
    (4498560,)
    >>> plan_read_chunks((10, 4), (1, 1), 8)
    (2, 4)
    """
    chunks = [1] * len(sizes)
    inner = 1
    for i in reversed(range(len(sizes))):
        size, unit = int(sizes[i]), max(1, min(int(units[i]), int(sizes[i])))
        if inner * size <= rows:
            chunks[i] = size
            inner *= size
            continue
        take = max(1, rows // inner)
        chunks[i] = min(size, max(unit, take // unit * unit))
        break
    return tuple(chunks)
