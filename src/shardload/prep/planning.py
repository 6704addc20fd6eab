"""Planning a prepare run before any file is written (pure but for opening nothing): the
layout (:func:`resolve_layout`), the rows and chunks (:func:`plan_rows`), how the tasks read
the source (:func:`plan_source_reads`), the splits (:func:`plan_splits_for`), and all of them
together for :func:`~shardload.prep.driver.write_store` (:func:`plan_store_rows`); shared with
``prepare --check``."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from typing import Any, NamedTuple

from shardload.errors import ShardloadError
from shardload.manifest.core import ArraySpec
from shardload.plan.chunks import (
    RegularBounds,
    describe_split_shortfall,
    plan_chunk_rows,
    plan_store_splits,
)
from shardload.plan.default_layout import plan_default_layout
from shardload.prep.config import PrepareConfig
from shardload.prep.origin import RowOrigin, kept_rows
from shardload.prep.sources.layout import ReadPlan
from shardload.prep.views.base import View
from shardload.prep.views.window_series import SeriesLayout

log = logging.getLogger("shardload.prep.driver")  # the name users' logs have always shown


class StorePlan(NamedTuple):
    """What a run writes: the config with its layout filled in, the arrays, rows, chunks, how
    the source is read, and the splits."""

    cfg: PrepareConfig
    specs: dict[str, ArraySpec]
    length: int
    row_bytes: int
    bounds: RegularBounds
    reads: ReadPlan
    splits: dict[str, tuple[int, ...]]
    split_rows: dict[str, tuple[int, int]]


def plan_store_rows(
    cfg: PrepareConfig,
    view: View,
    *,
    origin: RowOrigin | None = None,
    source: Any = None,
    dataset: Any = None,
) -> StorePlan:
    """The :class:`StorePlan` of writing ``view`` as ``cfg`` says (rows from ``origin`` for
    ``shardload copy``), before any file is written."""
    cfg = resolve_split_shuffle(resolve_layout(cfg, view), view)
    specs, length, row_bytes, chunk_rows = plan_rows(cfg, view)
    if origin is not None:
        cfg, chunk_rows = kept_rows(cfg, chunk_rows, origin.plan_chunk_rows(chunk_rows), length)
    reads = plan_source_reads(cfg, view, source, chunk_rows=chunk_rows, dataset=dataset)
    bounds = RegularBounds(length, reads.chunk_rows)
    if origin is None:
        splits, split_rows = plan_splits_for(cfg, view, bounds)
    else:  # windows cut at load time: the splits are over the window samples' chunks
        split_bounds: Sequence[int] = bounds
        if isinstance(view, SeriesLayout):
            split_bounds = view.sample_bounds(cfg.chunk_rows, cfg.target_chunk_bytes)
        splits, split_rows = origin.plan_splits(split_bounds)
    return StorePlan(cfg, specs, length, row_bytes, bounds, reads, splits, split_rows)


def resolve_layout(cfg: PrepareConfig, view: View) -> PrepareConfig:
    """``cfg`` with the default layout filled in when it gives no layout key
    (``cfg.default_layout``) and writes compressed Zarr of fixed-size rows (no windows cut at
    load): ``chunk_rows`` and ``shard_chunks`` from the row size, small inner chunks in big
    shards (:func:`~shardload.plan.chunks.plan_default_layout`, docs/design.md "The default
    layout"); any other ``cfg`` as it is (pure; prepare and ``prepare --check`` call it)."""
    specs = view.specs
    if (
        not cfg.default_layout
        or cfg.format != "zarr"
        or cfg.compression == "none"  # raw rows are read in place, in small pieces already
        or isinstance(view, SeriesLayout)
        or any(s.ragged for s in specs.values())
        or int(view.length) == 0
    ):
        return cfg
    row_bytes = sum(s.row_bytes for s in specs.values())
    chunk_rows, shard_chunks = plan_default_layout(row_bytes, length=int(view.length))
    return dataclasses.replace(cfg, chunk_rows=chunk_rows, shard_chunks=shard_chunks)


def resolve_split_shuffle(cfg: PrepareConfig, view: View) -> PrepareConfig:
    """``cfg`` with ``split_shuffle: false`` for a dated store whose config does not set it:
    its splits are then contiguous time ranges in the order given (train first, as
    anemoi-datasets leaves the last dates out of its statistics), so no val or test date lies
    between two train dates; any other ``cfg`` as it is (pure)."""
    from shardload.prep.views.dated import DatedView

    if isinstance(view, DatedView) and cfg.default_split_shuffle and cfg.split_shuffle:
        return dataclasses.replace(cfg, split_shuffle=False)
    return cfg


def plan_rows(cfg: PrepareConfig, view: View) -> tuple[dict[str, ArraySpec], int, int, int]:
    """``(specs, length, row_bytes, chunk_rows)`` of the store ``cfg`` writes from ``view``
    (pure; shared by prepare and ``prepare --check``)."""
    specs = dict(view.specs)
    length = int(view.length)
    if length == 0:
        raise ShardloadError("the view has no samples (length 0): check sample_dims and the source")
    row_bytes = sum(s.row_bytes for s in specs.values())
    if isinstance(view, SeriesLayout):  # series chunks of whole space points
        return specs, length, row_bytes, view.plan_series_chunk_rows(cfg.target_chunk_bytes)
    if cfg.chunk_rows:  # never more rows than the data has: the one chunk is what is written
        return specs, length, row_bytes, min(int(cfg.chunk_rows), length)
    chunk_rows = plan_chunk_rows(row_bytes, length=length, target_bytes=cfg.target_chunk_bytes)
    return specs, length, row_bytes, chunk_rows


def plan_source_reads(
    cfg: PrepareConfig, view: View, source: Any, *, chunk_rows: int, dataset: Any = None
) -> ReadPlan:
    """How the write tasks read ``source`` (:mod:`shardload.prep.sources.layout`): the store's
    default ``chunk_rows`` rounded to whole source units, the blocks one task reads at once and
    the dask chunks to open the source with. Sources with readers of their own (radiation,
    SEG-Y, a caller's dataset) and window views keep theirs."""
    from shardload.plan.reads import READ_BUDGET_BYTES
    from shardload.prep.executor import default_workers, resolve_scheduler
    from shardload.prep.sources.layout import plan_reads

    if dataset is not None or cfg.view == "window" or cfg.source.kind == "radiation":
        return ReadPlan(chunk_rows)
    if not cfg.sample_dims or source is None:
        return ReadPlan(chunk_rows)
    names = [str(n) for n in source.data_vars]
    budget = READ_BUDGET_BYTES  # threads share one process's read groups
    if resolve_scheduler(cfg.execution) not in ("threads", "sync"):  # one budget per process
        budget //= max(1, int(cfg.execution.num_workers or default_workers()))
    return plan_reads(
        source,
        names,
        cfg.sample_dims,
        chunk_rows=chunk_rows,
        chunks_per_block=cfg.shard_chunks or 1,
        row_bytes=sum(s.row_bytes for s in view.specs.values()),
        length=int(view.length),
        align=cfg.chunk_rows is None,
        budget_bytes=budget,
    )


def plan_splits_for(
    cfg: PrepareConfig, view: View, bounds: Sequence[int]
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]]]:
    """Splits are labels over the written rows, planned from the config at each publish (not
    part of the write fingerprint). Window views get contiguous time ranges with a gap so that
    no two splits share a time step: window ``w`` spans times ``[w*stride, w*stride +
    lookback + horizon)``, so consecutive splits keep ``ceil((lookback + horizon) / stride) - 1``
    windows apart."""
    group_rows, gap = None, 0
    if isinstance(view, SeriesLayout):  # windows at load time: split the samples
        bounds = view.sample_bounds(cfg.chunk_rows, cfg.target_chunk_bytes)
    if cfg.view == "window":
        span = int(view.lookback) + int(view.horizon)  # type: ignore[attr-defined]
        stride = int(view.stride)  # type: ignore[attr-defined]
        group_rows, gap = int(view.S), -(-span // stride) - 1  # type: ignore[attr-defined]
    chunks, rows, why = plan_store_splits(
        bounds,
        cfg.splits,
        seed=cfg.split_seed,
        shuffle=cfg.split_shuffle,
        group_rows=group_rows,
        gap_groups=gap,
    )
    if why:
        ranges = ", ".join(f"{k} rows {a}:{b}" for k, (a, b) in rows.items())
        (log.info if cfg.view == "window" else log.warning)("splits: %s (%s)", why, ranges)
    short = describe_split_shortfall(rows, cfg.splits, int(bounds[-1]))
    if short and cfg.view == "window":
        log.warning(
            "splits: on %d window(s) with %d window(s) left out between two splits (so that no "
            "two splits share a time step) the splits get %s; use more time steps, fewer "
            "splits, a smaller lookback + horizon or a larger stride",
            int(bounds[-1]) // max(1, group_rows or 1),
            gap,
            short,
        )
    elif short:
        log.warning("splits: the splits get %s; use more data or fewer splits", short)
    return chunks, rows
