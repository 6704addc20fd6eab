"""Read a row range of a lazy DataArray whose leading dims are stacked into one sample axis.

Rows are numbered in C order over ``sample_dims``. For rows ``[start, stop)`` we load the
smallest slab that holds them -- a range of the first sample dim, full ranges of the others
(a single index of every dim but the last when the rows sit inside one "line") -- and then cut
the rows out of it. Only that slab is read from disk.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeGuard, runtime_checkable

import numpy as np
import xarray as xr

from shardload.errors import ViewError

if TYPE_CHECKING:
    import dask.array


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
        dests = [o for o, s in zip(out or [None] * len(das), served, strict=True) if not s]
        it = iter(read_many(lazy, sample_dims, start, stop, out=dests))
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
    das: Sequence[xr.DataArray],
    sample_dims: Sequence[str],
    start: int,
    stop: int,
    *,
    out: Sequence[np.ndarray | None] | None = None,
) -> list[np.ndarray]:
    """:func:`read_rows` for several variables in one dask computation (one graph, one pass).

    ``out``: destinations ``(rows, *rest)`` per variable (or None); a variable read in several
    dask chunks whose slab is exactly its rows is stored chunk by chunk into its destination
    (no concatenated copy: a read of 21 GRIB messages stays one pass over memory)."""
    slabs, cuts = [], []
    for da in das:
        slab, cut = _slab(da, sample_dims, start, stop)
        slabs.append(slab)
        cuts.append(cut)
    lazy = [s.data for s in slabs]
    dests = list(out or [None] * len(das))
    into = [_store_target(s, c, d) for s, c, d in zip(lazy, cuts, dests, strict=True)]
    if any(t is not None for t in into):
        for s, t in zip(lazy, into, strict=True):
            if t is not None:
                _store_striped(s, t)
        left = [i for i, t in enumerate(into) if t is None]
        got = read_many([das[i] for i in left], sample_dims, start, stop) if left else []
        it = iter(got)
        return [np.asarray(dests[i]) if t is not None else next(it) for i, t in enumerate(into)]
    if any(_is_dask_array(v) for v in lazy):
        import dask

        with synchronous():
            values = dask.compute(*lazy)
    else:
        values = [np.asarray(s.values) for s in slabs]
    rows = []
    for v, s, (lo, hi) in zip(values, slabs, cuts, strict=True):
        rest = tuple(s.shape[len(sample_dims) :])
        rows.append(np.asarray(v).reshape(-1, *rest)[lo:hi])
    return rows


#: bytes of a destination's rows that :func:`_store_striped` fills from every chunk at once
STRIPE_BYTES = 1 << 20


def _store_striped(lazy: dask.array.Array, target: np.ndarray) -> None:
    """Compute ``lazy``'s chunks and copy them into ``target`` (same shape) stripe by stripe of
    rows: chunks split along the feature axes (GRIB: one message per level) fill a stripe of
    whole rows while it is in cache, where storing each chunk in turn writes strided columns
    over the whole destination once per chunk (10x slower for 21 messages)."""
    import dask

    with synchronous():
        flat = lazy.to_delayed().ravel().tolist()
        parts = dask.compute(*flat)
    index = list(np.ndindex(*lazy.numblocks))
    offsets = [np.cumsum([0, *c]).tolist() for c in lazy.chunks]
    row_bytes = max(1, target.nbytes // max(1, target.shape[0]))
    step = max(1, STRIPE_BYTES // row_bytes)
    by_row: dict[int, list[tuple[tuple[int, ...], np.ndarray]]] = {}
    for idx, part in zip(index, parts, strict=True):
        by_row.setdefault(idx[0], []).append((idx, np.asarray(part)))
    stripes = []  # (first row of the chunk row, stripe rows, that chunk row's parts)
    for j, group in by_row.items():
        lo, hi = offsets[0][j], offsets[0][j + 1]
        stripes += [(lo, a, min(a + step, hi), group) for a in range(lo, hi, step)]

    def fill(some: list[tuple[int, int, int, list[Any]]]) -> None:
        for lo, a, b, group in some:
            for idx, part in group:
                where = tuple(
                    slice(offsets[d][idx[d]], offsets[d][idx[d] + 1]) for d in range(1, part.ndim)
                )
                target[(slice(a, b), *where)] = part[a - lo : b - lo]

    threads = min(stripe_threads(target.nbytes), len(stripes))
    if threads <= 1:
        fill(stripes)
        return
    # numpy copies without the GIL: the stripes in a few threads, this one included (the
    # other write tasks of this process wait for this read, which they share: their cores
    # are otherwise idle)
    import threading

    per = -(-len(stripes) // threads)
    shares = [stripes[i : i + per] for i in range(0, len(stripes), per)]
    errors: list[BaseException] = []

    def fill_share(some: list[tuple[int, int, int, list[Any]]]) -> None:
        try:
            fill(some)
        except BaseException as exc:  # raised below, in the reading thread
            errors.append(exc)

    helpers = [
        threading.Thread(target=fill_share, args=(some,), name=f"shardload-stripes-{i}")
        for i, some in enumerate(shares[1:], 1)
    ]
    for t in helpers:
        t.start()
    fill_share(shares[0])
    for t in helpers:
        t.join()
    if errors:
        raise errors[0]


#: a read of at least this many bytes is copied into its rows by :func:`stripe_threads` threads
STRIPE_THREADS_BYTES = 32 << 20
#: at most this many threads copy one read into its rows
MAX_STRIPE_THREADS = 4


def stripe_threads(nbytes: int) -> int:
    """Threads that copy a read of ``nbytes`` into its rows (:func:`_store_striped`): one
    below :data:`STRIPE_THREADS_BYTES`, else one per core of this process, at most
    :data:`MAX_STRIPE_THREADS` (a 378 MB GRIB read: 21 messages transposed into rows of 21
    values, 0.7 s in one thread on the development VM)."""
    if nbytes < STRIPE_THREADS_BYTES:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(MAX_STRIPE_THREADS, cores or 1))


def _store_target(lazy: object, cut: tuple[int, int], dest: np.ndarray | None) -> np.ndarray | None:
    """``dest`` seen with the slab's shape, where the slab is a dask array of several chunks
    that holds exactly the rows of ``dest`` (else None: computed and cut as usual)."""
    if dest is None or not _is_dask_array(lazy) or lazy.npartitions < 2:
        return None
    shape = tuple(int(n) for n in lazy.shape)
    rows = int(np.prod(shape[: lazy.ndim - (dest.ndim - 1)], dtype=np.int64))
    if cut != (0, rows) or dest.shape[0] != rows or lazy.dtype != dest.dtype:
        return None
    try:
        v = dest.view()
        v.shape = shape  # raises rather than copying
    except (AttributeError, ValueError):
        return None
    return v


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


def synchronous() -> Any:
    """``dask.config.set`` of the synchronous scheduler, as the function itself: by its name
    (``"synchronous"``) dask's ``get_scheduler`` first imports ``distributed`` (0.18 s in a
    fresh process, where installed) to look for a client that a write task never uses."""
    import dask
    import dask.local

    return dask.config.set(scheduler=dask.local.get_sync)


def _is_dask_array(v: object) -> TypeGuard[dask.array.Array]:
    """Whether ``v`` is a dask array, without importing dask (0.05-0.1 s in a fresh process,
    for a prepare whose rows h5py reads): none exists unless ``dask.array`` was imported."""
    module = sys.modules.get("dask.array")
    return module is not None and isinstance(v, module.Array)


def load_values(da: xr.DataArray) -> np.ndarray:
    # Inside a write task we are already parallel: compute dask pieces synchronously.
    with synchronous():
        return np.asarray(da.values)
