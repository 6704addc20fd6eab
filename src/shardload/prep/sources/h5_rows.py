"""Rows of plain netCDF-4/HDF5 variables read with h5py, without dask or xarray indexing.

The lazy xarray dataset gives views their shapes, dtypes and names; reading a block of rows
through it costs a dask graph per block, xarray's lazy indexing and, when the sample axis is not
the first one in storage, an HDF5 hyperslab read that gathers elements across every chunk (one
real file, (2160, 4320, 12) uint8 in gzip chunks (135, 270, 2), took minutes along its last
axis). :class:`H5Rows` reads what a write task needs directly:

* the sample dims' bounding slab of the block (as :func:`~shardload.prep.views.rows.read_many`),
  in *storage* order, then transposed in memory to sample-major rows;
* for compressed (filtered) variables, the slab is cut into chunk-aligned pieces along the
  varying sample dim; each piece is decoded once and kept in a small cache shared by the
  process's threads, so neighbouring blocks that share a source chunk never decode it twice;
* for unfiltered variables whose sample dim is the first one in storage, and whose chunks (or
  contiguous layout) hold whole rows, rows are byte ranges of the file: ``os.preadv`` straight
  into the destination, which releases the GIL (h5py serialises every call in one lock).
* other contiguous, unfiltered variables are mapped (:mod:`~shardload.prep.sources.mapped`):
  each block's rows transposed straight from the page cache, no HDF5 gather, the GIL left.

Numeric variables are served raw where xarray returns them raw, else decoded by
:mod:`~shardload.prep.sources.cf_decode` as xarray does (each raw piece into the block's rows);
what it does not mirror exactly stays on the lazy path. Tests compare both, bit for bit.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from shardload.errors import SourceError
from shardload.prep.sources.h5_vars import H5Var, plan_var
from shardload.prep.sources.mapped import map_contiguous
from shardload.prep.sources.pieces import PieceCache
from shardload.prep.sources.transpose import copy_rows

#: open_kwargs that leave the values xarray returns unchanged (anything else: lazy path)
_NEUTRAL_OPEN_KWARGS = frozenset({"chunks", "phony_dims", "cache", "lock", "inline_array"})
_Layout = tuple[int, int | None, tuple[int | None, ...]]  # see H5Rows._raw_layout
WHOLE_BYTES = 64 << 20  # a contiguous variable up to this size is kept as rows (H5Rows._whole)


class H5Rows:
    """``read_rows(names, start, stop)`` of plain variables of one local netCDF-4/HDF5 file,
    rows numbered in C order over ``sample_dims`` (see :mod:`shardload.prep.views.rows`)."""

    def __init__(self, path: str, variables: Mapping[str, H5Var]) -> None:
        self.path = path
        self.variables = dict(variables)
        self.names = tuple(self.variables)
        self._init_handles()

    def _init_handles(self) -> None:
        self._h5: Any = None
        self._fd: int | None = None
        self._lock = threading.Lock()
        self._cache = PieceCache()
        self._raw: dict[str, _Layout | None] = {}
        self._maps: dict[str, np.ndarray | None] = {}

    def __getstate__(self) -> dict[str, Any]:  # open handles stay in their process
        return {"path": self.path, "variables": self.variables}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.path, self.variables = state["path"], state["variables"]
        self.names = tuple(self.variables)
        self._init_handles()

    def _file(self) -> Any:
        with self._lock:
            if self._h5 is None:
                import h5py

                try:
                    self._h5 = h5py.File(self.path, "r")
                except OSError as exc:
                    raise SourceError(f"cannot open {self.path}: {exc}") from exc
            return self._h5

    def read_rows(
        self,
        names: Sequence[str],
        start: int,
        stop: int,
        *,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` of variables ``names`` as ``(rows, *other dims)``; arrays of
        that shape and the variable's dtype in ``out`` are filled in place (any strides); the
        others of a variable kept as whole rows (:meth:`_whole`) are read-only views of them."""
        unknown = [n for n in names if n not in self.variables]
        if unknown:
            raise SourceError(f"{self.path}: H5Rows cannot read {unknown}; it reads {self.names}")
        res: dict[str, np.ndarray] = {}
        for name in names:
            var = self.variables[name]
            n_rows = int(np.prod(var.sample_sizes, dtype=np.int64))
            if not 0 <= start <= stop <= n_rows:
                raise SourceError(
                    f"rows [{start}, {stop}) out of range for {name!r} of {n_rows} samples"
                )
            dset = self._file()[var.path]
            shape = (stop - start, *var.row_shape)
            dst = (out or {}).get(name)
            raw_dtype = dset.dtype.newbyteorder("=")  # xarray too returns native byte order
            dtype = var.decode.dtype if var.decode else raw_dtype
            whole = self._whole_rows(var, dset)
            if whole is not None and (dst is None or dst.shape != shape or dst.dtype != dtype):
                res[name] = whole[start:stop]  # a read-only view: no copy of the rows
                continue
            if dst is None or dst.shape != shape or dst.dtype != dtype:
                dst = np.empty(shape, dtype)
            if whole is not None:
                np.copyto(dst, whole[start:stop])
                res[name] = dst
                continue
            if stop > start:
                self._read(var, dset, start, stop, dst)
            res[name] = dst
        return res

    # -- one variable ---------------------------------------------------------------------------
    def _read(self, var: H5Var, dset: Any, start: int, stop: int, dst: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``dst``, packed pieces decoded straight into it."""
        decode = var.decode
        if decode is not None and self._raw_layout(var, dset) is not None:
            raw = np.empty(dst.shape, dset.dtype.newbyteorder("="))
            self._read_raw(var, dset, start, stop, raw)
            decode.apply(raw, out=dst)
            return
        if decode is None and self._read_raw(var, dset, start, stop, dst):
            return
        sizes = var.sample_sizes
        first = np.unravel_index(start, sizes)
        last = np.unravel_index(stop - 1, sizes)
        k = 0  # the sample dim that varies within the block; those before it are one index
        while k < len(sizes) - 1 and first[k] == last[k]:
            k += 1
        strides = np.cumprod([1, *sizes[::-1][:-1]])[::-1].tolist()
        base = sum(int(first[j]) * int(strides[j]) for j in range(k))
        k_ax = var.axes[k]
        # pieces along the varying dim: chunk-aligned (decoded once, cached) when filtered
        step = var.chunks[k_ax] if (var.filtered and var.chunks) else None
        whole = None if step else self._mapped(var, dset)  # a contiguous one, read in place
        lo_k, hi_k = int(first[k]), int(last[k]) + 1
        pos = lo_k
        while pos < hi_k:
            if step:
                c0 = pos // step * step
                end = min(hi_k, c0 + step)
                region = self._region(var, first, k, c0, min(var.shape[k_ax], c0 + step))
                piece = self._cache.get(
                    (var.name, region), lambda r=region: self._read_region(dset, r)
                )
                sub = self._cut(var, piece, region, first, k, pos, end)
            elif whole is not None:
                end, region = hi_k, tuple((0, n) for n in var.shape)
                sub = self._cut(var, whole, region, first, k, pos, end)
            else:
                end = hi_k
                region = self._region(var, first, k, pos, end)
                sub = self._cut(var, self._read_region(dset, region), region, first, k, pos, end)
            g0, n_sub = base + pos * int(strides[k]), int(np.prod(sub.shape[: var.num_sample]))
            a, b = max(start, g0), min(stop, g0 + n_sub)  # rows of sub (g0: its first) in dst
            if b > a and decode is not None:  # straight into the block: no raw copy of it
                rows = sub.reshape(-1, *var.row_shape)  # sample-major rows pos..end of dim k
                decode.apply(rows[a - g0 : b - g0], out=dst[a - start : b - start])
            elif b > a:  # transposed straight into the block, in cache-sized blocks
                copy_rows(dst[a - start : b - start], sub, a - g0, b - g0, var.num_sample)
            pos = end

    def _region(
        self, var: H5Var, first: Any, k: int, lo: int, hi: int
    ) -> tuple[tuple[int, int], ...]:
        """Storage-order ``(start, stop)`` per axis: sample dims before ``k`` one index (the
        chunk holding it, when filtered), ``k`` from ``lo`` to ``hi``, everything else full."""
        region = [(0, n) for n in var.shape]
        for j in range(k):
            ax, i = var.axes[j], int(first[j])
            if var.filtered and var.chunks:
                c = var.chunks[ax]
                region[ax] = (i // c * c, min(var.shape[ax], i // c * c + c))
            else:
                region[ax] = (i, i + 1)
        region[var.axes[k]] = (lo, hi)
        return tuple(region)

    def _cut(
        self,
        var: H5Var,
        piece: np.ndarray,
        region: tuple[tuple[int, int], ...],
        first: Any,
        k: int,
        lo: int,
        hi: int,
    ) -> np.ndarray:
        """The part of ``piece`` (storage order, covering ``region``) that holds rows ``lo:hi``
        of sample dim ``k``, transposed to sample-major order."""
        sel: list[Any] = [slice(None)] * piece.ndim
        for j in range(k):
            ax = var.axes[j]
            i = int(first[j]) - region[ax][0]
            sel[ax] = slice(i, i + 1)
        ax = var.axes[k]
        sel[ax] = slice(lo - region[ax][0], hi - region[ax][0])
        return np.transpose(piece[tuple(sel)], var.axes)

    def _read_region(self, dset: Any, region: tuple[tuple[int, int], ...]) -> np.ndarray:
        buf = np.empty(tuple(b - a for a, b in region), dset.dtype.newbyteorder("="))
        if buf.size:
            dset.read_direct(buf, tuple(slice(a, b) for a, b in region))
        return buf

    def _mapped(self, var: H5Var, dset: Any) -> np.ndarray | None:
        """A contiguous, unfiltered variable as a read-only array over a map of the file
        (:mod:`~shardload.prep.sources.mapped`): blocks transpose their rows straight from
        the page cache, where each read a strided slab of it through HDF5 first (a
        time-major series read by space points: every block reads a run of every step).
        None for any other variable."""
        if var.name not in self._maps:
            dt = dset.dtype
            nbytes = int(np.prod(var.shape, dtype=np.int64)) * dt.itemsize
            arr = None
            offset = None
            plain = not var.filtered and var.chunks is None and nbytes > 0
            if plain and dt.isnative and dt.kind in "biuf" and dset.external is None:
                offset = dset.id.get_offset()  # None: never written (fill values): h5py
            if offset is not None:
                arr = map_contiguous(self.path, int(offset), var.shape, dt, name=var.name)
            with self._lock:
                self._maps.setdefault(var.name, arr)
        return self._maps[var.name]

    def _whole(self, var: H5Var, dset: Any) -> np.ndarray | None:
        """A contiguous, unfiltered variable of at most :data:`WHOLE_BYTES` as its
        sample-major rows (``(rows, *row_shape)``, read-only), transposed once per process in
        one pass from the map of the file (:meth:`_mapped`) and kept with the pieces; every
        block's rows are then a slice of it, where each block transposed its own rows into a
        new array (:meth:`read_rows`). None for any other variable."""
        mapped = self._mapped(var, dset)
        if mapped is None or mapped.nbytes > WHOLE_BYTES:
            return None

        def load_rows() -> np.ndarray:
            n = int(np.prod(var.sample_sizes, dtype=np.int64))
            out = np.empty((n, *var.row_shape), mapped.dtype)
            copy_rows(out, np.transpose(mapped, var.axes), 0, n, var.num_sample)
            out.flags.writeable = False
            return out

        return self._cache.get((var.name, "rows"), load_rows)

    def _whole_rows(self, var: H5Var, dset: Any) -> np.ndarray | None:
        """:meth:`_whole`'s rows of a variable served as they are stored (not packed) whose
        rows are not byte ranges of the file; None for any other."""
        if var.decode is not None or self._raw_layout(var, dset) is not None:
            return None
        return self._whole(var, dset)

    # -- unfiltered rows that are byte ranges of the file -----------------------------------------
    def _read_raw(self, var: H5Var, dset: Any, start: int, stop: int, dst: np.ndarray) -> bool:
        """Rows as byte ranges of the file, read with ``preadv``; False where they are not."""
        layout = self._raw_layout(var, dset)
        if layout is None:
            return False
        row_bytes, offset, chunk_offsets = layout
        buf = dst if dst.flags.c_contiguous else np.empty(dst.shape, dst.dtype)
        view = buf.data.cast("B")  # ndarray.data is memoryview(buf)
        if offset is not None:  # contiguous layout
            self._pread(view, offset + start * row_bytes, var)
        else:
            rows = var.chunks[0] if var.chunks else 1
            for c in range(start // rows, (stop - 1) // rows + 1):
                a, b = max(start, c * rows), min(stop, (c + 1) * rows)
                part = view[(a - start) * row_bytes : (b - start) * row_bytes]
                where = chunk_offsets[c]
                if where is None:  # never written: HDF5 returns the fill value
                    np.frombuffer(part, dtype=dst.dtype)[...] = dset.fillvalue
                else:
                    self._pread(part, where + (a - c * rows) * row_bytes, var)
        if buf is not dst:
            dst[...] = buf
        return True

    def _raw_layout(self, var: H5Var, dset: Any) -> _Layout | None:
        """``(row bytes, offset of a contiguous layout, offset of each chunk)``, or None."""
        if var.name in self._raw:
            return self._raw[var.name]
        layout: _Layout | None = None
        dt = dset.dtype
        plain = (
            not var.filtered
            and var.num_sample == 1
            and var.axes[0] == 0
            and dt.isnative
            and dt.kind in "biuf"
            and dset.external is None
        )
        row_bytes = int(np.prod(var.shape[1:], dtype=np.int64)) * dt.itemsize
        if plain and dset.chunks is None:
            offset = dset.id.get_offset()
            if offset is not None:  # None: never written (fill values): read through h5py
                layout = (row_bytes, int(offset), ())
        elif plain and tuple(dset.chunks[1:]) == tuple(var.shape[1:]):
            rows = dset.chunks[0]
            offsets: list[int | None] = []
            for c in range(-(-var.shape[0] // rows)):
                info = dset.id.get_chunk_info_by_coord((c * rows,) + (0,) * (len(var.shape) - 1))
                if info.byte_offset is not None and info.size != rows * row_bytes:
                    offsets = []
                    break  # not a plain chunk after all: read through h5py
                offsets.append(None if info.byte_offset is None else int(info.byte_offset))
            if offsets:
                layout = (row_bytes, None, tuple(offsets))
        self._raw[var.name] = layout
        return layout

    def _pread(self, view: memoryview, offset: int, var: H5Var) -> None:
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
                    weakref.finalize(self, os.close, self._fd)
        done = 0
        while done < len(view):
            got = os.preadv(self._fd, [view[done:]], offset + done)
            if got <= 0:
                raise SourceError(f"{self.path}: variable {var.name!r} is truncated (short read)")
            done += got


def h5_rows(
    path: str,
    ds: Any,
    sample_dims: Sequence[str],
    *,
    group: str | None = None,
    phony_dims: str = "sort",
) -> H5Rows | None:
    """An :class:`H5Rows` for the plain variables of ``ds`` (opened lazily from the local
    netCDF-4/HDF5 file ``path``), or None where none qualifies.

    Each variable is looked up with h5py alone, its dims taken from ``ds`` (which has them
    from the same file, ``phony_dims`` naming those without dimension scales) and its
    attributes read as h5netcdf reads them: opening the file again with h5netcdf, which
    resolves every dimension scale of the file first, was a third of opening the source
    (issue 29)."""
    import h5py

    try:
        with h5py.File(path, "r") as h5:
            node = h5[group] if group else h5
            found = {}
            for name in map(str, ds.data_vars):
                var = plan_var(name, ds[name], node, sample_dims)
                if var is not None:
                    found[name] = var
    except (OSError, KeyError, ValueError):
        return None  # the lazy path opens (or names the fault in) this file
    return H5Rows(path, found) if found else None


def open_kwargs_are_neutral(open_kwargs: Mapping[str, Any]) -> bool:
    """True when ``open_kwargs`` leave the values of the lazy dataset as h5py reads them."""
    return set(open_kwargs) <= _NEUTRAL_OPEN_KWARGS
