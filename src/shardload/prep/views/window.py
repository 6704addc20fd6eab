"""The window view (LSTM / sequence input): look-back windows over time, space stacked into
samples.

From variables on ``(time, *sample_dims, *feature_dims)``, sample ``r`` is window ``w = r // S``
at space point ``s = r % S`` (``S`` = product of ``sample_dims``; window-major order). Window
``w`` covers times ``[w*stride, w*stride + lookback)``; arrays have shape
``(samples, lookback, features)``. ``targets`` (optional) are taken ``horizon`` steps after the
window's last time, shape ``(samples, features)``.

A block of samples needs one time span ``[t0, t1)`` of every variable over all space points:
each variable is read once per block (through xarray and dask, or with ``rows``, a
:class:`~shardload.prep.views.rows.RowReader` whose rows are numbered over
``(time_dim, *sample_dims)``, so the span is rows ``[t0 * S, t1 * S)``) and the windows are
cut from it in numpy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr
from numpy.lib.stride_tricks import sliding_window_view

from shardload.errors import ViewError
from shardload.manifest.core import ArraySpec
from shardload.prep.views.base import check_features, check_numeric
from shardload.prep.views.flat import feature_names
from shardload.prep.views.rows import RowReader, load_values


class WindowView:
    def __init__(
        self,
        ds: xr.Dataset,
        arrays: Mapping[str, Sequence[str]],
        *,
        sample_dims: Sequence[str],
        time_dim: str = "time",
        lookback: int = 2,
        stride: int = 1,
        horizon: int = 0,
        targets: Mapping[str, Sequence[str]] | None = None,
        dtype: str | None = None,
        rows: RowReader | None = None,
    ) -> None:
        if lookback < 1 or stride < 1 or horizon < 0:
            raise ViewError(
                f"window: need lookback >= 1, stride >= 1, horizon >= 0; got {lookback}, {stride}, {horizon}"
            )
        self.time_dim, self.lookback, self.stride, self.horizon = (
            time_dim,
            lookback,
            stride,
            horizon,
        )
        self.sample_dims = tuple(sample_dims)
        if time_dim in self.sample_dims:  # the config checks this too; a view built directly
            raise ViewError(
                f"window: time_dim {time_dim!r} is also in sample_dims {list(self.sample_dims)}; "
                "windows run along time_dim, so remove it from sample_dims"
            )
        groups = {
            **{k: (v, False) for k, v in arrays.items()},
            **{k: (v, True) for k, v in (targets or {}).items()},
        }
        self._vars: dict[str, tuple[list[xr.DataArray], bool]] = {}
        self._specs: dict[str, ArraySpec] = {}
        T = None
        for out, (names, is_target) in groups.items():
            das = [self._variable(ds, v, out) for v in names]
            T = das[-1].sizes[time_dim] if das else T
            self._vars[out] = (das, is_target)
            dt = np.dtype(dtype) if dtype else np.result_type(*[d.dtype for d in das])
            feats = sum((feature_names(d, (time_dim, *self.sample_dims)) for d in das), ())
            self._specs[out] = ArraySpec(
                out, (0, len(feats)), dt, feats, {"variables": list(names), "target": is_target}
            )
        assert T is not None
        self.rows = rows
        #: variables ``rows`` reads (h5py, no dask; packed ones decoded as xarray does,
        #: ``prep/sources/cf_decode.py``); the others stay on the lazy path
        self._served = {
            str(d.name)
            for das, _ in self._vars.values()
            for d in das
            if rows is not None and d.name in rows.names
        }
        self.S = (
            int(np.prod([ds.sizes[d] for d in self.sample_dims], dtype=np.int64))
            if self.sample_dims
            else 1
        )
        self.num_windows = max(0, (T - lookback - horizon) // stride + 1)
        if self.num_windows == 0:
            raise ViewError(
                f"window: {time_dim}={T} steps are too few for lookback={lookback}, horizon={horizon}"
            )
        n = self.num_windows * self.S
        self._specs = {
            k: ArraySpec(
                k,
                (n, s.shape[1]) if s.attrs["target"] else (n, lookback, s.shape[1]),
                s.dtype,
                s.features,
                s.attrs,
            )
            for k, s in self._specs.items()
        }

    def _variable(self, ds: xr.Dataset, v: str, out: str) -> xr.DataArray:
        """Variable ``v`` of window array ``out``, checked, as (time, *sample dims, *rest)."""
        time_dim = self.time_dim
        if v not in ds.variables:
            raise ViewError(
                f"window array {out!r}: variable {v!r} not found; the source has {sorted(map(str, ds.data_vars))}"
            )
        da = ds[v]
        check_numeric(v, da.dtype, where=f"window array {out!r}")
        check_features(v, da.sizes, (time_dim, *self.sample_dims), where=f"arrays.{out}")
        missing = [d for d in (time_dim, *self.sample_dims) if d not in da.dims]
        if missing:
            raise ViewError(
                f"variable {v!r} lacks dim(s) {missing} (dims: {list(da.dims)}); window needs time_dim and sample_dims"
            )
        rest = [d for d in da.dims if d not in (time_dim, *self.sample_dims)]
        return da.transpose(time_dim, *self.sample_dims, *rest)

    @property
    def length(self) -> int:
        return self.num_windows * self.S

    @property
    def read_by_rows(self) -> bool:
        """Whether its row reader serves every variable it reads (no read through the lazy
        dataset)."""
        names = {str(d.name) for das, _ in self._vars.values() for d in das}
        return self.rows is not None and names <= self._served

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        return self._specs

    @property
    def static(self) -> Mapping[str, Any]:
        return {
            "window": {
                "time_dim": self.time_dim,
                "lookback": self.lookback,
                "stride": self.stride,
                "horizon": self.horizon,
                "sample_dims": list(self.sample_dims),
                "order": "window-major",
            }
        }

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        n = max(0, stop - start)
        out = {k: np.empty((n, *s.shape[1:]), s.dtype) for k, s in self._specs.items()}
        if n == 0:
            return out
        w0, w1 = start // self.S, (stop - 1) // self.S
        t0 = w0 * self.stride
        t1 = w1 * self.stride + self.lookback + self.horizon  # exclusive
        slabs = self._slabs(t0, t1)  # (time, space, features)
        for name, (das, is_target) in self._vars.items():
            parts = [slabs[str(d.name)] for d in das]
            # as np.concatenate of the parts, then a cast: each part to their common dtype
            common = np.result_type(*[p.dtype for p in parts])
            at = 0
            for part in parts:
                f = part.shape[-1]
                res = out[name][..., at : at + f]
                self._cut(part.astype(common, copy=False), res, is_target, start, stop)
                at += f
        return out

    def _cut(
        self, slab: np.ndarray, res: np.ndarray, is_target: bool, start: int, stop: int
    ) -> None:
        """Samples ``[start, stop)`` of one variable into ``res``, from ``slab`` (times from
        the first window's first, ``(time, space, features)``): window by window, a strided
        copy of a sliding view (no index arrays, no concatenation)."""
        S, w0 = self.S, start // self.S
        last = self.lookback - 1 + self.horizon
        wins = None if is_target else sliding_window_view(slab, self.lookback, axis=0)
        for w in range(w0, (stop - 1) // S + 1):
            a, b = max(start, w * S), min(stop, (w + 1) * S)  # samples of window w
            t = (w - w0) * self.stride
            sa, sb = a - w * S, b - w * S
            if wins is None:
                res[a - start : b - start] = slab[t + last, sa:sb]
            else:  # (space, features, lookback) -> (space, lookback, features)
                res[a - start : b - start] = wins[t, sa:sb].transpose(0, 2, 1)

    def _slabs(self, t0: int, t1: int) -> dict[str, np.ndarray]:
        """Times ``[t0, t1)`` of every variable as ``(time, space, features)``, each read once:
        those ``rows`` serves in one call, the others through the lazy dataset."""
        das = {str(d.name): d for group, _ in self._vars.values() for d in group}
        served = [n for n in das if n in self._served]
        got: dict[str, np.ndarray] = {}
        if served and self.rows is not None:
            read = self.rows.read_rows(served, t0 * self.S, t1 * self.S)
            got = {n: read[n].reshape(t1 - t0, self.S, -1) for n in served}
        for n, da in das.items():
            if n not in got:
                slab = load_values(da.isel({self.time_dim: slice(t0, t1)}))
                got[n] = slab.reshape(slab.shape[0], self.S, -1)
        return got
