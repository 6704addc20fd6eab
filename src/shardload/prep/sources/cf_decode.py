"""CF decoding of packed variables in numpy, step for step as xarray decodes them.

A packed netCDF variable (integers with ``scale_factor`` / ``add_offset``, masked by
``_FillValue`` / ``missing_value``, maybe ``_Unsigned``) is read raw with h5py by
:class:`~shardload.prep.sources.h5_rows.H5Rows` and decoded here, so that prepare never goes
through xarray's lazy decoding and dask for it. The values must be bit for bit those of
``xr.open_dataset(path)[name].values``, so :func:`plan_cf_decode` mirrors xarray's
``CFMaskCoder`` then ``CFScaleOffsetCoder`` (``xarray/coding/variables.py``), including:

* the order: ``_Unsigned`` reinterprets the integers (and the ``_FillValue`` with them, not
  ``missing_value``), then the mask casts to the float dtype, compares the cast values with
  every fill value (NaN ones dropped; numpy's promotion, so an int32 fill against float32
  values compares in float64) and sets NaN, then ``* scale_factor`` and ``+ add_offset``
  in place, with the attributes' own numpy scalars (a float64 ``scale_factor`` on float32
  data computes in float64 and rounds once, as xarray does);
* the float dtype: that of ``scale_factor`` and ``add_offset`` when both are float32 or both
  float64 (float64 for 32-bit integers), float64 when only ``add_offset`` is given, the
  ``scale_factor``'s own otherwise; an integer masked without packing becomes float32 up to
  16 bits, float64 above;
* what xarray does not do: ``valid_min`` / ``valid_max`` / ``valid_range`` mask nothing.

Whatever it cannot mirror exactly (time-like units, non-numeric or multi-valued packing
attributes, a result dtype other than xarray's lazy variable's) gets None: that variable stays
on xarray's path. Tests compare both paths bit for bit on generated and real packed files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

#: units that make xarray decode a variable as times or durations (then it is not ours)
_TIME_UNITS = frozenset(
    {"days", "hours", "minutes", "seconds", "milliseconds", "microseconds", "nanoseconds"}
)
_PACKING = ("scale_factor", "add_offset")
#: the attributes a plan reads (xarray's mask, scale and time decoding look at these)
_READ = (*_PACKING, "_FillValue", "missing_value", "_Unsigned", "units")


@dataclass(frozen=True)
class CFDecode:
    """How to decode one variable's raw values (see :func:`plan_cf_decode`)."""

    as_dtype: np.dtype | None  # _Unsigned: the raw integers reinterpreted as this dtype
    fills: tuple[Any, ...]  # encoded fill values, compared after the cast to ``mask_dtype``
    mask_dtype: np.dtype | None  # None: no mask
    scale_dtype: np.dtype | None  # None: no scale_factor nor add_offset
    scale_factor: Any
    add_offset: Any
    dtype: np.dtype  # the decoded dtype (xarray's)

    @property
    def identity(self) -> bool:
        """Whether the decoded values are the raw ones (no attribute xarray applies)."""
        return self.as_dtype is None and self.mask_dtype is None and self.scale_dtype is None

    def apply(self, raw: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        """The decoded values of ``raw``, written into ``out`` (any strides) when given."""
        if out is None:
            out = np.empty(raw.shape, self.dtype)
        data = raw if self.as_dtype is None else np.asarray(raw, dtype=self.as_dtype)
        np.copyto(out, data, casting="unsafe")  # as ``np.array(data, dtype=...)`` / astype
        if self.mask_dtype is not None and self.fills:
            hit = out == self.fills[0]
            for fv in self.fills[1:]:
                hit |= out == fv
            np.copyto(out, np.nan, where=hit)
        if self.scale_factor is not None:
            out *= self.scale_factor
        if self.add_offset is not None:
            out += self.add_offset
        return out


def plan_cf_decode(
    attrs: Mapping[str, Any], raw_dtype: np.dtype, want: np.dtype
) -> CFDecode | None:
    """The decoding xarray applies (default ``mask_and_scale``) to a variable stored as
    ``raw_dtype`` with attributes ``attrs`` (as h5netcdf returns them), or None where it is
    not exactly mirrored here or its result dtype is not ``want`` (xarray's lazy variable's)."""
    raw, want = np.dtype(raw_dtype).newbyteorder("="), np.dtype(want).newbyteorder("=")
    if raw.kind not in "biuf" or raw.fields is not None:
        return None
    names = set(attrs)  # the names only: a file's other attributes (GRIB_*, history) unread
    if not names & {*_PACKING, "_FillValue", "missing_value", "_Unsigned"}:
        return CFDecode(None, (), None, None, None, None, raw) if raw == want else None
    if raw.kind == "b":
        return None
    attrs = {
        k: _text(attrs[k]) if k not in ("_FillValue", "missing_value") else attrs[k]
        for k in _READ
        if k in names
    }
    units = attrs.get("units")
    if isinstance(units, str) and ("since" in units or units.strip() in _TIME_UNITS):
        return None  # xarray may decode it as times (or mask it to int64 for that)
    try:
        plan = _plan(attrs, raw)
    except (TypeError, ValueError, KeyError, OverflowError):
        return None  # odd attributes: xarray's path decodes (or names) them
    if plan is None or plan.dtype != want or plan.dtype.kind not in "iuf":
        return None
    return plan


def _plan(attrs: Mapping[str, Any], raw: np.dtype) -> CFDecode | None:
    # CFMaskCoder.decode: fill values (missing_value, then _FillValue), NaNs dropped
    raw_fill: dict[str, Any] = {}
    fills: set[Any] = set()
    for key in ("missing_value", "_FillValue"):
        if key not in attrs:
            continue
        flat = np.ravel(attrs[key])
        if flat.dtype.kind not in "iuf":
            return None
        kept = {fv for fv in flat if not (flat.dtype.kind == "f" and np.isnan(fv))}
        if kept or raw.kind == "f":
            raw_fill[key] = attrs[key]
            fills |= kept
        # an integer variable's all-NaN fill: xarray warns and drops it
    packed = any(k in attrs for k in _PACKING)
    data = raw
    as_dtype = None
    if "_Unsigned" in attrs:
        unsigned, fill = attrs["_Unsigned"], raw_fill.get("_FillValue")
        if raw.kind == "i" and unsigned == "true":
            as_dtype = np.dtype(f"u{raw.itemsize}")
            if fill is not None:
                fills.remove(fill)
                fills.add(np.array(fill, dtype=raw).view(as_dtype).item())
        elif raw.kind == "u" and unsigned == "false":
            as_dtype = np.dtype(f"i{raw.itemsize}")
            if fill is not None:
                fills.remove(fill)
                fills.add(as_dtype.type(fill))
        data = as_dtype or raw
    mask_dtype = None
    if fills:
        mask_dtype = _choose_float_dtype(data, attrs) if packed else _promote(data)
        if mask_dtype.kind != "f":
            return None  # an integer scale_factor: xarray fails to set NaN (its error, its path)
        data = mask_dtype
    scale_dtype, sf, ao = None, None, None
    if packed:
        sf, ao = _scalar(attrs.get("scale_factor")), _scalar(attrs.get("add_offset"))
        scale_dtype = data if raw_fill else _choose_float_dtype(data, attrs)
        data = scale_dtype
    return CFDecode(as_dtype, tuple(fills), mask_dtype, scale_dtype, sf, ao, np.dtype(data))


def _choose_float_dtype(dtype: np.dtype, attrs: Mapping[str, Any]) -> np.dtype:
    """xarray's ``_choose_float_dtype``: the float dtype of packed (or masked) values."""
    sf, ao = attrs.get("scale_factor"), attrs.get("add_offset")
    if sf is not None or ao is not None:
        st = np.dtype(type(sf)) if sf is not None else None
        ot = np.dtype(type(ao)) if ao is not None else None
        if st is not None and ot is not None and st == ot and st in (np.float32, np.float64):
            if dtype.itemsize == 4 and dtype.kind in "iu":
                return np.dtype(np.float64)
            return st
        if ao is not None:
            return np.dtype(np.float64)
        assert st is not None
        return st
    if dtype.itemsize <= 4 and dtype.kind == "f":
        return np.dtype(np.float32)
    if dtype.itemsize <= 2 and dtype.kind in "iu":
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _promote(dtype: np.dtype) -> np.dtype:
    """xarray's ``dtypes.maybe_promote`` for real numbers: floats stay, integers become float32
    up to 16 bits and float64 above."""
    if dtype.kind == "f":
        return dtype
    return np.dtype(np.float32 if dtype.itemsize <= 2 else np.float64)


def _scalar(v: Any) -> Any:
    """A packing attribute as xarray applies it: numpy scalars as they are, one-element arrays
    as their Python number; anything else is not mirrored (ValueError)."""
    if v is None:
        return None
    if np.ndim(v) > 0:
        v = np.asarray(v).item()  # ValueError for several values, as in xarray
    if not isinstance(v, (np.integer, np.floating, int, float)) or isinstance(v, bool):
        raise ValueError(f"packing attribute {v!r} is not a number")
    return v


def _text(v: Any) -> Any:
    """xarray's h5netcdf backend decodes bytes attributes as UTF-8 (except the fill values)."""
    if isinstance(v, bytes):
        try:
            return v.decode("utf-8")
        except UnicodeDecodeError:
            return v
    return v
