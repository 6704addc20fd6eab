"""Views: how a lazy dataset becomes named sample-major arrays. ``build_view`` picks one by name."""

from __future__ import annotations

from typing import TYPE_CHECKING

import xarray as xr

from shardload.errors import ConfigError
from shardload.manifest.core import ArraySpec
from shardload.prep.views.base import View, check_rows_not_empty
from shardload.prep.views.rows import RowReader

if TYPE_CHECKING:
    from shardload.prep.config import PrepareConfig

VIEWS = ("flat", "graph", "window", "function")

__all__ = ["VIEWS", "ArraySpec", "View", "build_view", "row_dims"]


def build_view(ds: xr.Dataset, cfg: PrepareConfig, *, rows: RowReader | None = None) -> View:
    """The configured view of ``ds``; ``rows`` (optional) reads its rows faster than dask. A
    flat view over one time dim is dated (:mod:`shardload.prep.dated`): one row per date."""
    view = _build_view(ds, cfg, rows=rows)
    check_rows_not_empty(view.specs)
    from shardload.prep.dated import plan_dated_rows

    dated = plan_dated_rows(ds, cfg)
    if dated is not None:
        from shardload.prep.views.dated import DatedView

        return DatedView(view, dated)
    return view


def row_dims(cfg: PrepareConfig) -> tuple[str, ...]:
    """The dims over which the rows of the ``rows`` reader ``build_view`` takes are numbered:
    ``sample_dims``, but ``(time_dim, *sample_dims)`` for written windows (``at_load: false``:
    a block of windows reads one time span over all space points)."""
    opts = cfg.view_options
    if cfg.view == "window" and not opts.get("at_load", False):
        return (str(opts.get("time_dim", "time")), *cfg.sample_dims)
    return tuple(cfg.sample_dims)


def _build_view(ds: xr.Dataset, cfg: PrepareConfig, *, rows: RowReader | None = None) -> View:
    opts = dict(cfg.view_options)
    if cfg.view == "flat":
        from shardload.prep.views.flat import FlatView

        if opts:
            raise ConfigError(f"view options {sorted(opts)} are not used by the flat view")
        return FlatView(ds, cfg.arrays, sample_dims=cfg.sample_dims, dtype=cfg.dtype, rows=rows)
    if cfg.view == "graph":
        from shardload.prep.views.graph import GraphView

        return GraphView(
            ds,
            sample_dims=cfg.sample_dims or ("column",),
            dtype=cfg.dtype or "float32",
            rows=rows,
            **opts,
        )
    if cfg.view == "window":
        from shardload.prep.views.window import WindowView

        if opts.pop("at_load", False):  # the series once; the loader cuts the windows
            from shardload.prep.views.window_series import WindowSeriesView

            return WindowSeriesView(
                ds, cfg.arrays, sample_dims=cfg.sample_dims, dtype=cfg.dtype, rows=rows, **opts
            )
        return WindowView(
            ds, cfg.arrays, sample_dims=cfg.sample_dims, dtype=cfg.dtype, rows=rows, **opts
        )
    if cfg.view == "function":
        from shardload.prep.views.user import FunctionView

        return FunctionView(ds, sample_dims=cfg.sample_dims, dtype=cfg.dtype, **opts)
    raise ConfigError(
        f"view: unknown view {cfg.view!r}; choose one of {list(VIEWS)} or 'package.module:function'"
    )
