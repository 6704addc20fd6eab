"""CF decoding of plain Zarr arrays (mask and scale), as ``xarray.open_zarr`` does it, in numpy.

Zarr written by xarray (or any CF-aware tool) stores packed and masked values: ``_FillValue`` /
``missing_value`` mark missing data, ``scale_factor`` / ``add_offset`` pack floats into small
integers. xarray undoes both when it opens the store (its ``CFMaskCoder`` and
``CFScaleOffsetCoder``); a loader serving the stored numbers instead would be silently wrong
(1e20 where xarray gives NaN, values 10x off). The read side must not import xarray, so the
same rules are re-implemented here, step for step, and tests compare with ``xr.open_zarr``:

- **Fill values.** Zarr v2: the array's ``fill_value`` is the ``_FillValue`` (xarray's
  ``use_zarr_fill_value_as_mask`` default for v2); Zarr v3: only the ``_FillValue`` attribute
  (base64 of a little-endian float64 for floats, as xarray writes it). ``missing_value`` in both.
  NaN fill values mask nothing; an integer array whose fill values are all NaN drops them.
- **Mask.** Values equal to a fill value become NaN, in float32 for integers of <= 2 bytes,
  float64 for wider integers, the stored float type for floats; packed data (with
  ``scale_factor`` or ``add_offset``) in the packed float type below.
- **Scale.** ``x * scale_factor + add_offset`` in xarray's ``_choose_float_dtype``: the type of
  the attributes when both are given and of one float type (float64 for JSON numbers; int32
  upcast to float64), float64 with an ``add_offset`` otherwise, else the ``scale_factor``'s type.
- **Byte order.** Big-endian data is served in native order.

What xarray would decode into other types is refused with a :class:`StoreError` naming the
variable (the loader skips such variables when it picks arrays by itself): CF times (``units``
"<unit> since <date>": xarray makes datetime64 of them), timedeltas (``dtype`` attribute
``timedelta64[...]``), ``_Unsigned`` integers, booleans (``dtype: bool``) and non-numeric data.
"""

from __future__ import annotations

import base64
import math
import re
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.errors import StoreError

#: xarray's CF timedelta units.
TIME_UNITS = ("days", "hours", "minutes", "seconds", "milliseconds", "microseconds", "nanoseconds")
_FILL_KEYS = ("missing_value", "_FillValue")


@dataclass(frozen=True)
class CFDecoding:
    """How one array's stored values become the values xarray serves.

    ``fills`` are the encoded missing values, each as ``(value, dtype)`` so that the comparison
    uses xarray's numpy scalar types; ``mask_dtype`` is the type masking casts to (None: no
    mask), ``scale_dtype`` the type scaling casts to (None: no scaling); ``dtype`` is the result.
    """

    stored: str
    dtype: str
    fills: tuple[tuple[Any, str], ...] = ()
    mask_dtype: str | None = None
    scale: float | int | None = None
    offset: float | int | None = None
    scale_dtype: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "stored": self.stored,
            "dtype": self.dtype,
            "fills": [list(f) for f in self.fills],
            "mask_dtype": self.mask_dtype,
            "scale": self.scale,
            "offset": self.offset,
            "scale_dtype": self.scale_dtype,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CFDecoding:
        return cls(
            stored=d["stored"],
            dtype=d["dtype"],
            fills=tuple((v, t) for v, t in d["fills"]),
            mask_dtype=d["mask_dtype"],
            scale=d["scale"],
            offset=d["offset"],
            scale_dtype=d["scale_dtype"],
        )

    def apply(self, raw: np.ndarray) -> np.ndarray:
        """The decoded values of ``raw`` (stored values), as xarray computes them."""
        data = raw
        if self.mask_dtype is not None:  # xarray's _apply_mask
            data = np.array(data, dtype=self.mask_dtype, copy=True)
            cond: Any = False
            for value, dtype in self.fills:
                cond |= data == np.dtype(dtype).type(value)
            data[cond] = np.nan
        if self.scale_dtype is not None:  # xarray's _scale_offset_decoding
            data = data.astype(self.scale_dtype, copy=True)
            if self.scale is not None:
                data *= self.scale
            if self.offset is not None:
                data += self.offset
        return data.astype(self.dtype, copy=False)

    def apply_into(self, raw: np.ndarray, out: np.ndarray) -> None:
        """Decode ``raw`` into ``out`` (which may be ``raw`` itself when the types agree)."""
        if raw is out and self.scale_dtype is None and np.dtype(self.mask_dtype) == raw.dtype:
            cond: Any = False  # masking only, same type: in place, no copy
            for value, dtype in self.fills:
                cond |= out == np.dtype(dtype).type(value)
            out[cond] = np.nan
            return
        out[...] = self.apply(raw)


def _refuse(name: str, why: str) -> StoreError:
    return StoreError(
        f"variable {name!r} cannot be served as xarray would decode it: {why}; shardload reads "
        "plain Zarr with CF mask and scale only (open it with xarray, or leave it out: "
        "arrays=[...])"
    )


def _time_units(units: Any) -> str | None:
    """'datetime' / 'timedelta' for units xarray treats as times (its ``_is_time_like``)."""
    if not isinstance(units, str):
        return None
    if "since" in units:
        return "datetime" if re.match(r"(.+) since (.+)", units) else None
    return "timedelta" if units in TIME_UNITS else None


def _fill_from_attr(value: Any, dtype: np.dtype) -> Any:
    """A Zarr v3 ``_FillValue`` attribute as xarray reads it (FillValueCoder.decode)."""
    if dtype.kind == "f" and isinstance(value, (str, bytes)):
        return struct.unpack("<d", base64.standard_b64decode(value))[0]
    if dtype.kind in "iu" and isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value) if math.isfinite(value) else value  # NaN: dropped below
    return value


def _isnull(v: Any) -> bool:
    return v is None or (isinstance(v, (float, np.floating)) and math.isnan(v))


def choose_float_dtype(dtype: np.dtype, attrs: Mapping[str, Any]) -> np.dtype:
    """xarray's ``_choose_float_dtype``: a float type that holds ``dtype``'s decoded values.

    >>> str(choose_float_dtype(np.dtype("i2"), {"scale_factor": 0.1, "add_offset": 5.0}))
    'float64'
    >>> str(choose_float_dtype(np.dtype("i2"), {"scale_factor": np.float32(0.1)}))
    'float32'
    >>> str(choose_float_dtype(np.dtype("i2"), {}))
    'float32'
    """
    scale, offset = attrs.get("scale_factor"), attrs.get("add_offset")
    if scale is not None or offset is not None:
        scale_type = np.dtype(type(scale)) if scale is not None else None
        offset_type = np.dtype(type(offset)) if offset is not None else None
        if (
            offset is not None
            and scale is not None
            and offset_type == scale_type
            and scale_type in (np.float32, np.float64)
        ):
            if dtype.itemsize == 4 and np.issubdtype(dtype, np.integer):
                return np.dtype(np.float64)
            return np.dtype(scale_type)
        if offset is not None:
            return np.dtype(np.float64)
        assert scale_type is not None
        return scale_type
    if dtype.itemsize <= 4 and np.issubdtype(dtype, np.floating):
        return np.dtype(np.float32)
    if dtype.itemsize <= 2 and np.issubdtype(dtype, np.integer):
        return np.dtype(np.float32)
    return np.dtype(np.float64)


def _promote(dtype: np.dtype) -> np.dtype:
    """xarray's ``maybe_promote`` for real numbers: a type that holds NaN."""
    if dtype.kind == "f":
        return dtype
    return np.dtype(np.float32 if dtype.itemsize <= 2 else np.float64)


def _check_servable(name: str, dtype: np.dtype, attrs: Mapping[str, Any]) -> None:
    """Raise :class:`StoreError` for what xarray would decode into another kind of value."""
    kind = _time_units(attrs.get("units"))
    if kind == "datetime":
        raise _refuse(
            name,
            f"it holds CF times (units {attrs['units']!r}), which xarray decodes to datetime64",
        )
    if kind == "timedelta" and str(attrs.get("dtype", "")).startswith("timedelta64"):
        raise _refuse(name, f"it holds timedeltas (dtype attribute {attrs['dtype']!r})")
    if attrs.get("dtype") == "bool":
        raise _refuse(name, "it holds booleans (dtype attribute 'bool')")
    if "_Unsigned" in attrs:
        raise _refuse(name, f"_Unsigned={attrs['_Unsigned']!r} integers are not decoded")
    if dtype.kind not in "iuf":
        raise _refuse(name, f"its dtype {dtype} is not a real number type")
    for key in ("scale_factor", "add_offset"):
        v = attrs.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float, np.number))):
            raise _refuse(name, f"{key}={v!r} is not a number")


def plan_cf_decoding(
    name: str, *, dtype: np.dtype, attrs: Mapping[str, Any], fill_value: Any, zarr_format: int
) -> CFDecoding | None:
    """How ``xr.open_zarr`` would decode array ``name`` (pure), None when it serves the stored
    values as they are; raises :class:`StoreError` (naming ``name``) for what it would turn
    into another kind of value (times, booleans, ...), which shardload does not serve.

    ``fill_value`` is the array's Zarr ``fill_value`` (the ``_FillValue`` of Zarr v2 data).

    >>> d = plan_cf_decoding("t", dtype=np.dtype("i2"), zarr_format=3, fill_value=0,
    ...                      attrs={"scale_factor": 0.5, "add_offset": 10.0, "_FillValue": -1})
    >>> str(np.dtype(d.dtype)), d.apply(np.array([-1, 0, 4], "i2")).tolist()
    ('float64', [nan, 10.0, 12.0])
    """
    dtype = np.dtype(dtype)
    attrs = dict(attrs)
    if zarr_format == 2:
        if fill_value is not None:
            attrs["_FillValue"] = fill_value
    elif "_FillValue" in attrs:
        attrs["_FillValue"] = _fill_from_attr(attrs["_FillValue"], dtype)
    _check_servable(name, dtype, attrs)
    # xarray's _check_fill_values
    fill_keys, fills = [], []
    for key in _FILL_KEYS:
        if key not in attrs:
            continue
        kfill = [fv for fv in np.ravel(attrs[key]) if not _isnull(fv)]
        if not kfill and dtype.kind in "iu":
            continue  # a NaN fill of integers: dropped, as xarray does (with a warning)
        fill_keys.append(key)
        for fv in kfill:
            fv = np.asarray(fv)
            if fv.dtype.kind not in "iuf":
                raise _refuse(name, f"{key}={attrs[key]!r} is not a number")
            item = (fv.item(), fv.dtype.str)
            if item not in fills:
                fills.append(item)
    packed = "scale_factor" in attrs or "add_offset" in attrs
    mask_dtype = None
    current = dtype
    if fills:  # CFMaskCoder
        current = choose_float_dtype(dtype, attrs) if packed else _promote(dtype)
        if current.kind != "f":  # an integer scale_factor alone: xarray fails too
            raise _refuse(
                name,
                f"its mask would be NaN in {current} (scale_factor="
                f"{attrs.get('scale_factor')!r} is an integer)",
            )
        mask_dtype = current.str
    scale_dtype = None
    if packed:  # CFScaleOffsetCoder
        if not fill_keys:
            current = choose_float_dtype(current, attrs)
        scale_dtype = current.str
    native = current.newbyteorder("=")
    if mask_dtype is None and scale_dtype is None and native == dtype:
        return None
    return CFDecoding(
        stored=dtype.str,
        dtype=native.str,
        fills=tuple(fills),
        mask_dtype=mask_dtype,
        scale=attrs.get("scale_factor"),
        offset=attrs.get("add_offset"),
        scale_dtype=scale_dtype,
    )
