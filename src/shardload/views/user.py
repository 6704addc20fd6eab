"""A user function as a view: ``"pkg.module:function"`` maps the lazy dataset to named arrays.

The function gets the lazy ``xarray.Dataset`` (and ``kwargs``) and returns a mapping of names to
sample-major ``xarray.DataArray`` (sample dims first, or those in ``sample_dims`` are stacked),
dask arrays or numpy arrays. Keep it lazy: it runs once per worker process, and each write
task then reads only its rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import dask
import numpy as np
import xarray as xr

from ..errors import ConfigError, ViewError
from .base import ArraySpec, check_lengths, check_numeric
from .flat import feature_names
from .rows import read_rows, sample_major


def import_function(path: str) -> Callable[..., Any]:
    mod, sep, attr = path.partition(":")
    if not sep or not mod or not attr:
        raise ConfigError(f"view function {path!r}: expected 'package.module:function'")
    try:
        fn = getattr(importlib.import_module(mod), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"view function {path!r} cannot be imported: {exc}") from exc
    if not callable(fn):
        raise ConfigError(f"view function {path!r} is not callable")
    return fn  # type: ignore[no-any-return]


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
        fn = import_function(function) if isinstance(function, str) else function
        result = fn(ds, **dict(kwargs or {}))
        if not isinstance(result, Mapping) or not result:
            raise ViewError(
                f"view function {function!r} must return a non-empty mapping of name -> array, got {type(result).__name__}"
            )
        self._arrays: dict[str, tuple[Any, tuple[str, ...]]] = {}
        specs: dict[str, ArraySpec] = {}
        lengths: dict[str, int] = {}
        for name, arr in result.items():
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
        out = {}
        for name, (arr, dims) in self._arrays.items():
            if dims:
                block = read_rows(arr, dims, start, stop)
            else:
                with dask.config.set(scheduler="synchronous"):
                    block = np.asarray(arr[start:stop])
            out[name] = block.astype(self._specs[name].dtype, copy=False)
        return out
