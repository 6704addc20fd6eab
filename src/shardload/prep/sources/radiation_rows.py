"""Rows of the packed radiation view read straight from the raw files, without dask.

:func:`~shardload.prep.sources.radiation.open_radiation` describes the packed ML view lazily; that is
what views use for shapes, dtypes and feature names. Reading a block of columns through it
costs a dask graph of some hundred tasks per block and several xarray copies. A write task
only ever needs "rows ``a:b`` of these packed arrays", so :class:`RadiationRows` does exactly
that: each raw variable's slab is read once (h5py ``read_direct`` for netCDF-4/HDF5 files,
xarray's lazy backend indexing otherwise) straight into its place in the packed output
(e.g. feature ``k`` of ``col_inputs``), and the heating rates are computed with the same
float32 operations as :func:`~shardload.prep.sources.radiation.heating_rate`. Values are identical
to the xarray packing (a test compares them); a variable that needs CF decoding (scale, offset,
a non-NaN fill value) or has unexpected dims is read through xarray, which decodes it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import SourceError
from shardload.prep.sources.radiation import (
    COLUMN_VARIABLES,
    FLUX_VARIABLES,
    GRAVITY,
    HALF_LEVEL_VARIABLES,
    HEAT_CAPACITY,
    SECONDS_PER_DAY,
    SURFACE_VARIABLES,
)

_DECODE_ATTRS = ("scale_factor", "add_offset", "missing_value", "valid_min", "valid_max")
_INPUTS = ("sca_inputs", "col_inputs", "hl_inputs", "inter_inputs", "pressure_hl")
NAMES = (*_INPUTS, *FLUX_VARIABLES, "hr_sw", "hr_lw")
_LEVEL_DIM = {  # the raw level dim of each packed input array that has one
    "col_inputs": "level",
    "hl_inputs": "half_level",
    "inter_inputs": "level_interface",
    "pressure_hl": "half_level",
}
_CACHE_BYTES = 1 << 18  # rows transposed at a time: about this much of the stack


@dataclass(frozen=True)
class _Place:
    """Where one raw variable goes: packed array ``array``, feature slice ``features``."""

    variable: str
    array: str
    features: slice
    band_dim: str | None  # a raw dim that becomes features (sw_albedo_band, aerosol_type)


def _places() -> list[_Place]:
    out: list[_Place] = []
    k = 0
    for name, band in SURFACE_VARIABLES:
        width = {"sw_albedo_band": 6, "lw_emissivity_band": 2}.get(band or "", 1)
        out.append(_Place(name, "sca_inputs", slice(k, k + width), band))
        k += width
    for k, name in enumerate(COLUMN_VARIABLES[: COLUMN_VARIABLES.index("aerosol_mmr")]):
        out.append(_Place(name, "col_inputs", slice(k, k + 1), None))
    k = COLUMN_VARIABLES.index("aerosol_mmr")
    out.append(_Place("aerosol_mmr", "col_inputs", slice(k, k + 12), "aerosol_type"))
    for j, name in enumerate(COLUMN_VARIABLES[k + 1 :]):
        out.append(_Place(name, "col_inputs", slice(k + 12 + j, k + 13 + j), None))
    for k, name in enumerate(HALF_LEVEL_VARIABLES):
        out.append(_Place(name, "hl_inputs", slice(k, k + 1), None))
    out.append(_Place("overlap_param", "inter_inputs", slice(0, 1), None))
    out.append(_Place("pressure_hl", "pressure_hl", slice(0, 1), None))
    return out


PLACES = _places()


class _File:
    """One raw file, opened lazily in the process that reads it (nothing open is pickled).

    netCDF-4/HDF5 files are read with h5py (dims from h5netcdf, no xarray decoding pass); any
    other file (netCDF-3, ...) through xarray's lazy backend indexing."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._h5: Any = None  # h5py.File
        self._nc: Any = None  # h5netcdf.File over it, or an xarray.Dataset
        self._xr: Any = None  # xarray over an HDF5 file, opened only when needed
        self._fast: dict[tuple[str, tuple[str, ...]], bool] = {}
        self._offsets: dict[str, int | None] = {}  # byte offset of contiguous raw data
        self._fd: int | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"path": self.path}

    def __del__(self) -> None:
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)  # type: ignore[arg-type]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["path"])  # type: ignore[misc]

    def _open(self) -> None:
        with self._lock:
            if self._nc is not None:
                return
            from shardload.prep.sources.paths import guess_engine

            try:
                if guess_engine(self.path) == "h5netcdf":
                    import h5netcdf
                    import h5py

                    self._h5 = h5py.File(self.path, "r")
                    self._nc = h5netcdf.File(self._h5, "r", phony_dims="sort")
                else:
                    import xarray as xr

                    self._nc = xr.open_dataset(self.path, cache=False, chunks=None)
            except (OSError, ValueError) as exc:
                raise SourceError(f"cannot open {self.path}: {exc}") from exc

    def columns(self) -> int:
        self._open()
        if self._h5 is not None:
            return int(self._nc.dimensions["column"].size)
        return int(self._nc.sizes["column"])

    def _dims(self, var: str) -> tuple[str, ...]:
        if var not in self._nc.variables:
            raise SourceError(f"{self.path}: missing variable {var!r}")
        v = self._nc.variables[var]
        return tuple(v.dimensions if self._h5 is not None else v.dims)

    def read(self, var: str, dims: tuple[str, ...], a: int, b: int, out: np.ndarray) -> None:
        """Columns ``a:b`` of ``var`` with dims ``dims`` (column first) into ``out`` (float32)."""
        self._open()
        key = (var, dims)
        if key not in self._fast:
            found = self._dims(var)  # names file and variable when it is missing
            self._fast[key] = self._h5 is not None and found in (dims, ()) and self._plain(var)
            if self._fast[key]:
                self._offsets[var] = _raw_offset(self._h5[var])
        if self._fast[key]:
            dst = out if out.flags.c_contiguous else np.empty(out.shape, np.float32)
            offset = self._offsets.get(var)
            if offset is not None:  # contiguous, unfiltered float32: a plain pread
                row_bytes = dst[:1].nbytes
                self._pread(dst, offset + a * row_bytes, (b - a) * row_bytes, var)
            else:
                dset = self._h5[var]
                if dset.ndim == 0:  # a scalar broadcast to every column
                    dst[...] = np.float32(dset[()])
                else:
                    dset.read_direct(dst, np.s_[a:b])
            if dst is not out:  # e.g. a slice of a flat view's buffer
                out[...] = dst
            return
        da = self._xarray()[var]
        if "column" not in da.dims:
            out[...] = np.asarray(da.values, dtype=np.float32)
            return
        sub = da.isel(column=slice(a, b)).transpose(*dims)
        out[...] = np.asarray(sub.values).astype(np.float32)

    def _pread(self, dst: np.ndarray, offset: int, nbytes: int, var: str) -> None:
        """Read ``nbytes`` at ``offset`` into ``dst`` (releases the GIL, unlike h5py)."""
        if self._fd is None:
            with self._lock:
                if self._fd is None:
                    self._fd = os.open(self.path, os.O_RDONLY)
        view = dst.data.cast("B")  # ndarray.data: numpy's stubs give __buffer__ on 3.12+ only
        done = 0
        while done < nbytes:
            got = os.preadv(self._fd, [view[done:nbytes]], offset + done)
            if got <= 0:
                raise SourceError(f"{self.path}: variable {var!r} is truncated (short read)")
            done += got

    def _xarray(self) -> Any:
        """The file through xarray, for variables that need CF decoding or a transpose."""
        if self._h5 is None:
            return self._nc
        with self._lock:
            if self._xr is None:
                import xarray as xr

                self._xr = xr.open_dataset(self.path, engine="h5netcdf", cache=False, chunks=None)
            return self._xr

    def _plain(self, var: str) -> bool:
        """True when h5py's raw values are what xarray's CF decoding would give."""
        attrs = self._h5[var].attrs
        if any(k in attrs for k in _DECODE_ATTRS):
            return False
        fill = attrs.get("_FillValue")
        return fill is None or bool(np.all(np.isnan(np.asarray(fill, dtype=np.float64))))


class RadiationRows:
    """``read_rows(names, start, stop)`` of the packed radiation view (column sample axis).

    Parameters
    ----------
    pairs
        ``(input file, output file or None)`` per file, in the order of
        :func:`~shardload.prep.sources.radiation.open_radiation`.
    columns
        Columns per file (from the lazy dataset's metadata).
    """

    names = NAMES

    def __init__(self, pairs: Sequence[tuple[str, str | None]], columns: Sequence[int]) -> None:
        if len(pairs) != len(columns):
            raise ValueError("one column count per file pair")
        self.files = [(_File(i), _File(o) if o else None) for i, o in pairs]
        self.offsets = np.concatenate(([0], np.cumsum(columns))).astype(np.int64)
        self.length = int(self.offsets[-1])

    def read_rows(
        self,
        names: Sequence[str],
        start: int,
        stop: int,
        *,
        out: Mapping[str, np.ndarray] | None = None,
    ) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` of packed arrays ``names``, shaped like the lazy view's;
        float32 arrays of the right shape in ``out`` are filled in place (any strides)."""
        unknown = [n for n in names if n not in NAMES]
        if unknown:
            raise SourceError(f"RadiationRows cannot read {unknown}; it reads {list(NAMES)}")
        if not 0 <= start <= stop <= self.length:
            raise SourceError(f"rows [{start}, {stop}) out of range for {self.length} columns")
        n = stop - start
        given = dict(out or {})
        res: dict[str, np.ndarray] = {}
        for name in names:
            shape = (n, *_row_shape(name))
            dst = given.get(name)
            if dst is None or dst.shape != shape or dst.dtype != np.float32:
                dst = np.empty(shape, np.float32)
            res[name] = dst
        for f, lo, hi, at in self._pieces(start, stop):
            self._read_piece(f, lo, hi, {k: v[at : at + hi - lo] for k, v in res.items()})
        return res

    def _pieces(self, start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
        """``(file, first column, end column, position in the output)`` per file touched."""
        f = int(np.searchsorted(self.offsets, start, side="right")) - 1
        pos = start
        while pos < stop:
            hi = min(stop, int(self.offsets[f + 1]))
            yield f, pos - int(self.offsets[f]), hi - int(self.offsets[f]), pos - start
            pos, f = hi, f + 1

    def _read_piece(self, f: int, a: int, b: int, out: Mapping[str, np.ndarray]) -> None:
        inp, outp = self.files[f]
        n = b - a
        for array in _INPUTS:
            if array in out:
                self._read_inputs(inp, array, a, b, out[array])
        want_out = [k for k in (*FLUX_VARIABLES, "hr_sw", "hr_lw") if k in out]
        if not want_out:
            return
        if outp is None:
            raise SourceError(f"{want_out} need output files; none paired with {inp.path}")
        fluxes: dict[str, np.ndarray] = {}
        for name in FLUX_VARIABLES:
            needed = name in out or f"hr_{name[-2:]}" in out
            if needed:
                buf = out[name] if name in out else np.empty((n, 138), np.float32)
                outp.read(name, ("column", "half_level"), a, b, buf)
                fluxes[name] = buf
        if "hr_sw" in out or "hr_lw" in out:
            p = np.empty((n, 138), np.float32)
            inp.read("pressure_hl", ("column", "half_level"), a, b, p)
            for band in ("sw", "lw"):
                if f"hr_{band}" in out:
                    out[f"hr_{band}"][...] = heating_rate_np(
                        fluxes[f"flux_dn_{band}"], fluxes[f"flux_up_{band}"], p
                    )

    @staticmethod
    def _read_inputs(inp: _File, array: str, a: int, b: int, dst: np.ndarray) -> None:
        """Fill packed input array ``dst`` (columns, [levels,] features) from its variables.

        Each variable is read into a feature-major stack (contiguous reads), which is then
        transposed into ``dst`` in blocks of rows that fit in cache: writing one feature at a
        time into ``dst`` would stream all of ``dst`` through memory once per feature.
        """
        n = b - a
        level = _LEVEL_DIM.get(array)
        stack = np.empty((dst.shape[-1], *dst.shape[:-1]), np.float32)  # (features, n[, L])
        for place in PLACES:
            if place.array != array:
                continue
            dims = ("column", place.band_dim) if place.band_dim else ("column",)
            dims = (*dims, level) if level else dims
            part = stack[place.features]
            if place.band_dim is None:
                inp.read(place.variable, dims, a, b, part[0])
            else:  # (column, band[, level]) -> features first
                tmp = np.empty((n, len(part), *part.shape[2:]), np.float32)
                inp.read(place.variable, dims, a, b, tmp)
                part[...] = np.moveaxis(tmp, 1, 0)
        step = max(1, _CACHE_BYTES // max(1, stack[:, :1].nbytes))
        for r in range(0, n, step):
            dst[r : r + step] = np.moveaxis(stack[:, r : r + step], 0, -1)


def _raw_offset(dset: Any) -> int | None:
    """Byte offset of ``dset``'s values when they are stored contiguously, unfiltered, as
    native float32 (then rows are one byte range of the file); else None."""
    if dset.ndim == 0 or dset.chunks is not None or dset.compression is not None:
        return None
    if dset.dtype != np.dtype(np.float32):  # np.float32 is native, so byte order matches
        return None
    offset = dset.id.get_offset()
    return None if offset is None else int(offset)


def heating_rate_np(flux_dn: np.ndarray, flux_up: np.ndarray, p: np.ndarray) -> np.ndarray:
    """:func:`~shardload.prep.sources.radiation.heating_rate` on numpy rows, same float32 ops."""
    net = flux_dn - flux_up
    d_net = net[:, 1:] - net[:, :-1]
    d_p = p[:, 1:] - p[:, :-1]
    scale = np.float32(-GRAVITY / HEAT_CAPACITY * SECONDS_PER_DAY)
    with np.errstate(divide="ignore", invalid="ignore"):
        return ((scale * d_net) / d_p).astype(np.float32)


def _row_shape(name: str) -> tuple[int, ...]:
    return {
        "sca_inputs": (17,),
        "col_inputs": (137, 27),
        "hl_inputs": (138, 2),
        "inter_inputs": (136, 1),
        "pressure_hl": (138, 1),
        "hr_sw": (137,),
        "hr_lw": (137,),
    }.get(name, (138,))


def radiation_rows(
    inputs: Sequence[str | Path], outputs: Sequence[str | Path] | None, ds: Any
) -> RadiationRows | None:
    """A :class:`RadiationRows` for these files, or None where it cannot serve (URLs, or a
    dataset whose packed shapes differ from the MAELSTROM ones)."""
    from shardload.prep.sources.paths import is_url

    if any(is_url(str(p)) for p in [*inputs, *(outputs or [])]):
        return None
    for name in NAMES:
        if name in ds.variables and tuple(ds[name].shape[1:]) != _row_shape(name):
            return None
    columns = [_File(str(p)).columns() for p in inputs]
    if sum(columns) != ds.sizes.get("column"):
        return None
    outs: list[str | None] = [str(o) for o in outputs] if outputs else [None] * len(inputs)
    return RadiationRows(list(zip(map(str, inputs), outs, strict=True)), columns)
