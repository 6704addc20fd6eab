"""Windows cut at load time (``view: {name: window, at_load: true}``): where a window sample's
rows lie in the stored series (pure numpy, no I/O).

A window store written with ``at_load: true`` holds each source variable once, as a *series*
array of ``space * steps`` rows in space-major order: row ``s * steps + t`` is time step ``t``
at space point ``s``. Samples keep the numbering of written windows (window-major, sample
``r`` is window ``w = r // space`` at space point ``s = r % space``), so a sample's look-back
window is the run of ``lookback`` consecutive series rows from ``s * steps + w * stride``, and
its target the one row ``horizon`` steps after the run's last. Series chunks hold whole space
points (``chunk_rows`` is a multiple of ``steps``), so a run never crosses a chunk.

The manifest records this geometry in ``static["window"]`` (``at_load: true``): the window
options, ``space``, ``steps``, ``num_windows``, and ``series``: the stored arrays (as
:class:`~shardload.manifest.core.ArrayInfo` dicts), their chunk rows, and which columns of the
logical arrays (``x``, the targets) each one fills.

>>> g = WindowGeometry(lookback=3, stride=2, horizon=1, space=2, steps=9, num_windows=3,
...                    chunk_rows=9)
>>> samples = np.array([0, 1, 5])            # windows 0, 0, 2 at space points 0, 1, 1
>>> g.start_rows(samples).tolist(), g.target_rows(samples).tolist()
([0, 9, 13], [3, 12, 16])
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.errors import StoreError


@dataclass(frozen=True)
class SeriesColumns:
    """Columns ``[col0, col1)`` of a logical array's last axis come from series array
    ``series`` (all of its features)."""

    series: str
    col0: int
    col1: int


@dataclass(frozen=True)
class WindowGeometry:
    """The window geometry of an ``at_load`` store (see the module docstring)."""

    lookback: int
    stride: int
    horizon: int
    space: int
    steps: int
    num_windows: int
    chunk_rows: int  # series rows per series chunk: whole space points
    #: logical array -> (is target, its columns by series array)
    columns: Mapping[str, tuple[bool, tuple[SeriesColumns, ...]]] | None = None

    @property
    def num_samples(self) -> int:
        return self.num_windows * self.space

    @property
    def series_length(self) -> int:
        return self.space * self.steps

    def start_rows(self, samples: np.ndarray) -> np.ndarray:
        """Series row of the first step of each sample's window."""
        s = np.asarray(samples, dtype=np.int64)
        w, sp = np.divmod(s, self.space)
        return sp * self.steps + w * self.stride

    def target_rows(self, samples: np.ndarray) -> np.ndarray:
        """Series row of each sample's target (``horizon`` steps after the window's last)."""
        return self.start_rows(samples) + (self.lookback - 1 + self.horizon)

    def rows_of(self, name: str, samples: np.ndarray) -> tuple[np.ndarray, int]:
        """``(first series row of each sample, rows per sample)`` of logical array ``name``."""
        target, _ = self.array_columns(name)
        if target:
            return self.target_rows(samples), 1
        return self.start_rows(samples), self.lookback

    def array_columns(self, name: str) -> tuple[bool, tuple[SeriesColumns, ...]]:
        if not self.columns or name not in self.columns:
            raise StoreError(f"array {name!r} is not a window array of this store")
        return self.columns[name]


def plan_window_runs(
    geometry: WindowGeometry, name: str, samples: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Where each sample's rows of logical array ``name`` lie: ``(chunk, file row, position,
    rows per sample)`` with one entry per sample, sorted by (chunk, file row) so that a reader
    walks each chunk file forwards; ``position`` is the sample's place in ``samples`` (pure).

    >>> g = WindowGeometry(3, 1, 0, 2, 5, 3, 5, {"x": (False, (SeriesColumns("s0", 0, 1),))})
    >>> [a.tolist() if hasattr(a, "tolist") else a for a in plan_window_runs(g, "x", np.array([5, 0]))]
    [[0, 1], [0, 2], [1, 0], 3]
    """
    first, per = geometry.rows_of(name, samples)
    order = np.argsort(first, kind="stable")  # series rows: (chunk, file row) order
    chunk, file_row = np.divmod(first[order], geometry.chunk_rows)
    return chunk, file_row, order.astype(np.int64), per


def window_geometry(static: Mapping[str, Any]) -> WindowGeometry | None:
    """The geometry of an ``at_load`` window store from its manifest's ``static`` (None for
    any other store)."""
    w = static.get("window") if isinstance(static, Mapping) else None
    if not isinstance(w, Mapping) or not w.get("at_load"):
        return None
    try:
        series = w["series"]
        columns = {
            str(name): (
                bool(spec["target"]),
                tuple(SeriesColumns(str(s), int(a), int(b)) for s, a, b in spec["columns"]),
            )
            for name, spec in series["columns"].items()
        }
        g = WindowGeometry(
            lookback=int(w["lookback"]),
            stride=int(w["stride"]),
            horizon=int(w["horizon"]),
            space=int(w["space"]),
            steps=int(w["steps"]),
            num_windows=int(w["num_windows"]),
            chunk_rows=int(series["chunk_rows"]),
            columns=columns,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise StoreError(
            f"malformed window geometry in the manifest (static.window): {exc!r}"
        ) from exc
    if g.chunk_rows % g.steps or g.chunk_rows <= 0:
        raise StoreError(
            f"malformed window geometry: series chunks of {g.chunk_rows} rows do not hold whole "
            f"space points of {g.steps} steps"
        )
    return g


def geometry_dict(
    geometry: WindowGeometry, series_arrays: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """The ``at_load`` part of ``static["window"]`` (JSON-able) for a geometry and the stored
    series arrays (ArrayInfo dicts by name)."""
    g = geometry
    return {
        "at_load": True,
        "space": g.space,
        "steps": g.steps,
        "num_windows": g.num_windows,
        "series": {
            "order": "space-major",
            "length": g.series_length,
            "chunk_rows": g.chunk_rows,
            "arrays": {k: dict(v) for k, v in series_arrays.items()},
            "columns": {
                name: {"target": t, "columns": [[c.series, c.col0, c.col1] for c in cols]}
                for name, (t, cols) in (g.columns or {}).items()
            },
        },
    }
