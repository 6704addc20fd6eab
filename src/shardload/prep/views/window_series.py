"""The window view with ``at_load: true``: the store holds the series once, windows are cut by
the loader (see :mod:`shardload.plan.windows` for the layout).

What this view writes are the *series* arrays: one per source variable (and dtype), of
``space * steps`` rows in space-major order, so that a window is a run of consecutive rows.
What the store's manifest shows are the *window* arrays, as a written window store would have
them (``x`` of shape ``(samples, lookback, features)``, the targets ``(samples, features)``,
the same sample numbering, chunks and splits); :func:`window_manifest` turns the manifest of
the written series into that one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from shardload.errors import ViewError
from shardload.manifest.core import ArrayInfo, ArraySpec, Manifest
from shardload.manifest.features import STATS_FIELDS, FeatureStats
from shardload.plan.chunks import RegularBounds, plan_chunk_rows
from shardload.plan.windows import SeriesColumns, WindowGeometry, geometry_dict
from shardload.prep.views.flat import feature_names
from shardload.prep.views.rows import RowReader, read_many
from shardload.prep.views.window import WindowView

#: name of the ``i``-th series array (file-safe whatever the variable is called)
SERIES_NAME = "series-{:02d}"


class SeriesLayout:
    """What a run plans for a view that writes window series (see the module docstring): the
    series chunks (whole space points), the window samples' chunks and the geometry.
    Subclasses set the window options, ``S`` (space points), ``steps``, ``columns``, the
    series specs (``_specs``) and the window arrays (``window_specs``, ``num_windows``,
    ``static``)."""

    lookback: int
    stride: int
    horizon: int
    S: int
    steps: int
    columns: dict[str, tuple[bool, tuple[SeriesColumns, ...]]]
    _specs: dict[str, ArraySpec]

    @property
    def num_windows(self) -> int:
        raise NotImplementedError

    @property
    def window_specs(self) -> Mapping[str, ArraySpec]:
        raise NotImplementedError

    @property
    def static(self) -> Mapping[str, Any]:
        raise NotImplementedError

    @property
    def num_samples(self) -> int:
        return self.num_windows * self.S

    @property
    def length(self) -> int:
        return self.S * self.steps

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        return self._specs

    def plan_series_chunk_rows(self, target_bytes: int) -> int:
        """Series rows per chunk: whole space points, about ``target_bytes`` of all series
        arrays (at least one space point)."""
        point_bytes = self.steps * sum(s.row_bytes for s in self._specs.values())
        return self.steps * plan_chunk_rows(point_bytes, length=self.S, target_bytes=target_bytes)

    def sample_bounds(self, chunk_rows: int | None, target_bytes: int) -> RegularBounds:
        """Chunks of the window samples: those a written window store of the same config
        would have (so its splits are the same)."""
        row_bytes = sum(s.row_bytes for s in self.window_specs.values())
        rows = chunk_rows or plan_chunk_rows(
            row_bytes, length=self.num_samples, target_bytes=target_bytes
        )
        return RegularBounds(self.num_samples, rows)

    def geometry(self, series_chunk_rows: int) -> WindowGeometry:
        return WindowGeometry(
            lookback=self.lookback,
            stride=self.stride,
            horizon=self.horizon,
            space=self.S,
            steps=self.steps,
            num_windows=self.num_windows,
            chunk_rows=series_chunk_rows,
            columns=self.columns,
        )


class WindowSeriesView(SeriesLayout):
    """Writes the series of a window view once; see the module docstring."""

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
        self.windows = WindowView(
            ds,
            arrays,
            sample_dims=sample_dims,
            time_dim=time_dim,
            lookback=lookback,
            stride=stride,
            horizon=horizon,
            targets=targets,
            dtype=dtype,
        )
        w = self.windows
        self.lookback, self.stride, self.horizon, self.S = w.lookback, w.stride, w.horizon, w.S
        self.time_dim, self.sample_dims = time_dim, tuple(sample_dims)
        self.steps = int(ds.sizes[time_dim])
        self._series: dict[str, xr.DataArray] = {}  # series name -> (space..., time, rest)
        #: series names ``rows`` reads (h5py, no dask): its rows are the space points, each in
        #: storage order, which is (time, rest) where time is the first dim after the space ones
        self._served: dict[str, str] = {}
        self.rows = rows
        self._specs: dict[str, ArraySpec] = {}
        keys: dict[tuple[str, str], str] = {}
        self.columns: dict[str, tuple[bool, tuple[SeriesColumns, ...]]] = {}
        for out, (das, is_target) in w._vars.items():
            dt = np.dtype(w.specs[out].dtype)
            cols, at = [], 0
            for da in das:
                key = (str(da.name), dt.str)
                if key not in keys:
                    name = keys[key] = SERIES_NAME.format(len(keys))
                    feats = feature_names(da, (time_dim, *self.sample_dims))
                    rest = [d for d in da.dims if d not in (time_dim, *self.sample_dims)]
                    self._series[name] = da.transpose(*self.sample_dims, time_dim, *rest)
                    # in the source's order (``da`` is the window view's, time first)
                    after = [d for d in ds[da.name].dims if d not in self.sample_dims]
                    if rows is not None and da.name in rows.names and after == [time_dim, *rest]:
                        self._served[name] = str(da.name)
                    self._specs[name] = ArraySpec(
                        name,
                        (self.S * self.steps, len(feats)),
                        dt,
                        feats,
                        {"variable": str(da.name)},
                    )
                name = keys[key]
                n = self._specs[name].shape[1]
                cols.append(SeriesColumns(name, at, at + n))
                at += n
            if at != w.specs[out].shape[-1]:  # cannot happen: the same variables, in order
                raise ViewError(f"window array {out!r}: {at} series columns for {w.specs[out]}")
            self.columns[out] = (is_target, tuple(cols))

    @property
    def num_windows(self) -> int:
        return self.windows.num_windows

    @property
    def read_by_rows(self) -> bool:
        """Whether its row reader serves every series it reads (no read through the lazy
        dataset)."""
        served = bool(self.sample_dims) and self.rows is not None
        return served and set(self._served) == set(self._series)

    @property
    def window_specs(self) -> Mapping[str, ArraySpec]:
        return self.windows.specs

    @property
    def static(self) -> Mapping[str, Any]:
        return self.windows.static

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Series rows ``[start, stop)`` (row ``s * steps + t``) of every series array."""
        T = self.steps
        if stop <= start:
            return {k: np.empty((0, s.shape[1]), s.dtype) for k, s in self._specs.items()}
        s0, s1 = start // T, (stop - 1) // T + 1
        names = list(self._series)
        lazy = [k for k in names if k not in self._served]
        if not self.sample_dims:  # one space point: the whole series
            got = {k: np.asarray(self._series[k].values)[None] for k in names}
        else:
            got = (
                dict(
                    zip(
                        lazy,
                        read_many([self._series[k] for k in lazy], self.sample_dims, s0, s1),
                        strict=True,
                    )
                )
                if lazy
                else {}
            )
            if self._served and self.rows is not None:
                read = self.rows.read_rows(list(self._served.values()), s0, s1)
                got |= {k: read[v] for k, v in self._served.items()}
        blocks = [got[k] for k in names]
        out = {}
        for k, block in zip(names, blocks, strict=True):
            rows = block.reshape((s1 - s0) * T, -1)[start - s0 * T : stop - s0 * T]
            out[k] = np.ascontiguousarray(rows, dtype=self._specs[k].dtype)
        return out


def window_manifest(series: Manifest, view: SeriesLayout, sample_bounds: RegularBounds) -> Manifest:
    """The manifest of an ``at_load`` store: the window arrays over the samples (chunks
    ``sample_bounds``; the splits ``series`` carries were planned on them), the series arrays
    and the geometry in ``static["window"]``.

    Statistics of a window array are those of its series columns: every time step of every
    space point counted once (a written window store counts a step once per window holding it).
    """
    g = view.geometry(series.chunk_rows)
    infos = {
        k: {**dataclasses.asdict(dataclasses.replace(a, features=None)), "shape": list(a.shape)}
        for k, a in series.arrays.items()
    }
    arrays, stats = {}, {}
    for name, spec in view.window_specs.items():
        _, cols = view.columns[name]
        arrays[name] = ArrayInfo(
            name,
            tuple(int(n) for n in spec.shape),
            np.dtype(spec.dtype).name,
            sample_bounds.chunk_rows,
            path=",".join(c.series for c in cols),
            features=spec.features,
            attrs={**dict(spec.attrs), "at_load": True},
        )
        parts = [series.stats[c.series] for c in cols if c.series in series.stats]
        if len(parts) == len(cols):
            cat = {f: np.concatenate([getattr(p, f) for p in parts]) for f in STATS_FIELDS}
            stats[name] = FeatureStats(
                parts[0].count, cat["mean"], cat["std"], cat["min"], cat["max"], cat["nan_count"]
            )
    static = {"window": {**dict(view.static["window"]), **geometry_dict(g, infos)}}
    return dataclasses.replace(
        series,
        length=view.num_samples,
        chunk_bounds=tuple(sample_bounds),
        arrays=arrays,
        stats=stats,
        static=static,
    )
