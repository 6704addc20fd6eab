"""A user function as a view: ``"pkg.module:function"`` maps the lazy dataset to named arrays.

The function gets the lazy ``xarray.Dataset`` (and ``kwargs``) and returns a mapping of names to
sample-major ``xarray.DataArray`` (sample dims first, or those in ``sample_dims`` are stacked),
dask arrays or numpy arrays. Keep it lazy: it runs once per worker process, and each write
task then reads only its rows.

A variable-length (ragged) array is a list (or tuple, or numpy object array) of one 1-D array
per sample, of any lengths: the store keeps it as values + offsets (docs/loading.md,
"Variable-length arrays"). Its lengths are read once, when the view is built.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from shardload.errors import ViewError
from shardload.manifest.core import ArraySpec
from shardload.manifest.ragged import as_ragged_block
from shardload.prep.views.base import check_lengths, check_numeric
from shardload.prep.views.flat import feature_names
from shardload.prep.views.rows import read_rows, sample_major, synchronous
from shardload.util.imports import import_function


def _is_ragged(arr: Any) -> bool:
    """A list / tuple / object array of per-sample arrays (a variable-length array)."""
    if isinstance(arr, (list, tuple)):
        return True
    return isinstance(arr, np.ndarray) and arr.dtype == object


def _ragged_spec(name: str, rows: Any, dtype: str | None, function: Any) -> ArraySpec:
    """The spec of a ragged output, every sample checked: 1-D, numeric."""
    where = f"view function {function!r}"
    lengths = np.zeros(len(rows), np.int64)
    kinds = set()
    for i, r in enumerate(rows):
        shape = getattr(r, "shape", None)
        a = r if shape is not None else np.asarray(r)
        if len(a.shape) != 1:
            raise ViewError(
                f"{where}: array {name!r} is variable-length (a list of per-sample arrays), but "
                f"sample {i} has shape {tuple(a.shape)}; each sample must be a 1-D array "
                "(flatten it, or return a fixed-shape array)"
            )
        lengths[i] = a.shape[0]
        kinds.add(np.dtype(a.dtype))
    if not len(rows):
        raise ViewError(f"{where}: variable-length array {name!r} has no samples")
    dt = np.dtype(dtype) if dtype else np.result_type(*kinds)
    for k in kinds:
        check_numeric(name, k, where=where)
    return ArraySpec(
        name, (len(rows),), dt, None, {}, ragged=True, mean_length=float(lengths.mean())
    )


class FunctionView:
    def __init__(
        self,
        ds: xr.Dataset,
        *,
        function: str | Callable[..., Any],
        sample_dims: Sequence[str] = (),
        kwargs: Mapping[str, Any] | None = None,
        dtype: str | None = None,
    ) -> None:
        fn = import_function(function, "view function") if isinstance(function, str) else function
        result = fn(ds, **dict(kwargs or {}))
        if not isinstance(result, Mapping) or not result:
            raise ViewError(
                f"view function {function!r} must return a non-empty mapping of name -> array, got {type(result).__name__}"
            )
        self._arrays: dict[str, tuple[Any, tuple[str, ...] | None]] = {}
        specs: dict[str, ArraySpec] = {}
        lengths: dict[str, int] = {}
        for name, arr in result.items():
            if _is_ragged(arr):
                specs[str(name)] = _ragged_spec(str(name), arr, dtype, function)
                lengths[name] = len(arr)
                self._arrays[str(name)] = (arr, None)
                continue
            if isinstance(arr, xr.DataArray):
                dims = tuple(d for d in sample_dims if d in arr.dims) or (str(arr.dims[0]),)
                arr = sample_major(arr.rename(arr.name or name), dims)
                n = int(np.prod([arr.sizes[d] for d in dims]))
                shape = (n, *arr.shape[len(dims) :])
                feats = feature_names(arr, dims) if arr.ndim - len(dims) == 1 else None
            else:
                if not hasattr(arr, "shape") or len(arr.shape) == 0:
                    raise ViewError(
                        f"view function output {name!r} is not an array with a sample axis"
                    )
                dims, shape, feats = (), tuple(int(s) for s in arr.shape), None
            check_numeric(name, arr.dtype, where=f"view function {function!r}")
            dt = np.dtype(dtype) if dtype else np.dtype(arr.dtype)
            lengths[name] = shape[0]
            specs[name] = ArraySpec(str(name), shape, dt, feats)
            self._arrays[str(name)] = (arr, dims)
        self._length = check_lengths(lengths)
        self._specs = specs

    @property
    def length(self) -> int:
        return self._length

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        return self._specs

    @property
    def static(self) -> Mapping[str, Any]:
        return {}

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        out: dict[str, Any] = {}
        for name, (arr, dims) in self._arrays.items():
            spec = self._specs[name]
            if spec.ragged:
                out[name] = as_ragged_block(arr[start:stop], name=name, dtype=spec.dtype)
                continue
            if dims:
                block = read_rows(arr, dims, start, stop)
            else:
                with synchronous():
                    block = np.asarray(arr[start:stop])
            out[name] = block.astype(self._specs[name].dtype, copy=False)
        return out
