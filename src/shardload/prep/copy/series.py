"""An opened store whose windows are cut at load time (``at_load: true``) as the origin of a
copy's rows: its *series* arrays, read as they are stored, re-chunked as ``prepare`` chunks
them (series chunks of whole space points, window samples in chunks that keep every split).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.manifest.core import ArraySpec
from shardload.plan.chunks import RegularBounds
from shardload.plan.rechunk import plan_kept_chunk_rows, split_boundaries
from shardload.plan.windows import WindowGeometry, window_geometry
from shardload.prep.views.window_series import SeriesLayout
from shardload.store.core import Store


class StoreSeriesView(SeriesLayout):
    """The series arrays of the ``at_load`` window store ``store`` as a view: rows of
    ``space * steps``, the same names, dtypes, attrs and window geometry; the window arrays
    (``window_specs``) and static data as the store shows them."""

    def __init__(self, store: Store) -> None:
        self.store = store
        m = store.manifest
        g = window_geometry(m.static)
        if g is None or not g.columns:
            raise StoreError(f"{store.url}: not a store whose windows are cut at load time")
        self.g: WindowGeometry = g
        self.lookback, self.stride, self.horizon = g.lookback, g.stride, g.horizon
        self.S, self.steps = g.space, g.steps
        self.columns = dict(g.columns)
        feats: dict[str, tuple[str, ...]] = {}  # each series' features, from the window arrays
        for name, (_, cols) in self.columns.items():
            names = m.arrays[name].features
            for c in cols:
                if names is not None:
                    feats.setdefault(c.series, tuple(names[c.col0 : c.col1]))
        series = m.static["window"]["series"]["arrays"]
        self._specs = {}
        for k, info in series.items():
            shape = tuple(int(n) for n in info["shape"])
            if shape[0] != g.series_length:
                raise StoreError(
                    f"{store.url}: series array {k!r} has {shape[0]} rows, the window geometry "
                    f"says {g.series_length} ({g.space} space points x {g.steps} steps)"
                )
            self._specs[k] = ArraySpec(
                k, shape, np.dtype(info["dtype"]), feats.get(k), dict(info.get("attrs") or {})
            )
        self._window_specs = {
            k: ArraySpec(k, tuple(a.shape), np.dtype(a.dtype), a.features, dict(a.attrs))
            for k, a in m.arrays.items()
        }

    @property
    def num_windows(self) -> int:
        return self.g.num_windows

    @property
    def window_specs(self) -> Mapping[str, ArraySpec]:
        return self._window_specs

    @property
    def static(self) -> Mapping[str, Any]:
        return dict(self.store.manifest.static)

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Series rows ``[start, stop)`` of every series array, as stored."""
        series = self.store.reader.series  # type: ignore[attr-defined]
        return {k: np.asarray(series.read(k, start, stop)) for k in self._specs}

    def sample_bounds(self, chunk_rows: int | None, target_bytes: int) -> RegularBounds:
        """The window samples' chunks: ``prepare``'s, shrunk (when planned) to keep every
        split boundary of the source; given ``chunk_rows`` that would cut one are refused."""
        planned = super().sample_bounds(chunk_rows, target_bytes)
        m = self.store.manifest
        kept = plan_kept_chunk_rows(
            planned.chunk_rows,
            split_boundaries(m.chunk_bounds, m.splits, m.split_rows),
            given=chunk_rows is not None,
        )
        return RegularBounds(self.num_samples, kept)
