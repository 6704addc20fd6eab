"""``prepare``: raw files -> a complete store. The only module that wires
source -> view -> plan -> format: it plans the store (:func:`plan_rows`, splits, the write
fingerprint), runs the write tasks (:mod:`~shardload.prep.tasks`, :mod:`~shardload.prep.run`)
and publishes the store (:mod:`~shardload.prep.publish`). See docs/design.md ("Writing a store").
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ConfigError, DiskFullError, ShardloadError, StoreError
from shardload.formats.base import FormatOptions
from shardload.formats.registry import get_writer
from shardload.manifest.core import ArraySpec
from shardload.plan.chunks import (
    RegularBounds,
    describe_split_shortfall,
    plan_chunk_rows,
    plan_default_layout,
    plan_store_splits,
)
from shardload.prep.commit import BlockCommit
from shardload.prep.config import PrepareConfig, load_config
from shardload.prep.disk import disk_full_error, is_disk_full
from shardload.prep.origin import RowOrigin, kept_rows
from shardload.prep.publish import publish_store
from shardload.prep.run import run_blocks, workers_share_disk_cache
from shardload.prep.sources.layout import ReadPlan
from shardload.prep.tasks import PrepareJob, build, build_source, share_view
from shardload.prep.views.base import View
from shardload.prep.views.window_series import SeriesLayout
from shardload.store.core import Store, open_store

log = logging.getLogger(__name__)


def prepare(
    config: PrepareConfig | Mapping[str, Any] | str | os.PathLike[str],
    *,
    overrides: tuple[str, ...] | list[str] = (),
    progress: bool | None = None,
    dataset: Any = None,
) -> Store:
    """Prepare a store from a config (a :class:`PrepareConfig`, a dict, or a YAML path).

    ``dataset``: a (lazy, e.g. dask-backed) ``xarray.Dataset`` to prepare instead of opening
    ``source`` (which the config then leaves out); its dask chunks are read as they are.

    Returns the opened, complete store. Raises :class:`StoreExistsError` when ``out`` exists and
    ``overwrite`` is false, :class:`StoreLockedError` when another run is writing ``out``,
    :class:`DiskFullError` when the disk fills up. An interrupted run leaves ``OUT.partial``;
    running again with the same config (and the same dataset, by dask's token) resumes it
    (splits may differ: they are not written into the arrays).
    """
    if dataset is not None:
        config = _with_dataset_source(config, dataset)
    cfg = config if isinstance(config, PrepareConfig) else load_config(config, overrides)
    t0 = time.perf_counter()
    view, source = build_source(cfg, dataset=dataset)
    # the layout (chunks, shards, compression) is planned in write_store and the config's
    # defaults, never here: ``shardload copy`` shares them by calling write_store
    return write_store(cfg, view, progress=progress, dataset=dataset, t0=t0, source=source)


def write_store(
    cfg: PrepareConfig,
    view: View,
    *,
    progress: bool | None = None,
    dataset: Any = None,
    origin: RowOrigin | None = None,
    t0: float | None = None,
    source: Any = None,
) -> Store:
    """Write the rows of ``view`` as the store ``cfg`` describes (its layout, out, overwrite,
    execution) and open it: the run behind :func:`prepare`, and behind ``shardload copy`` with
    an ``origin`` (:class:`~shardload.prep.origin.RowOrigin`) in place of the config's source.
    ``source``: the opened source dataset (``build_source``), to plan reads in its own units."""
    out = Path(cfg.out)
    t0 = time.perf_counter() if t0 is None else t0
    cfg = resolve_layout(cfg, view)
    specs, length, row_bytes, chunk_rows = plan_rows(cfg, view)
    if origin is not None:
        cfg, chunk_rows = kept_rows(cfg, chunk_rows, origin.plan_chunk_rows(chunk_rows), length)
    reads = plan_source_reads(cfg, view, source, chunk_rows=chunk_rows, dataset=dataset)
    chunk_rows = reads.chunk_rows
    bounds = RegularBounds(length, chunk_rows)
    if origin is None:  # before any file is written
        splits, split_rows = plan_splits_for(cfg, view, bounds)
    else:  # windows cut at load time: the splits are over the window samples' chunks
        split_bounds: Sequence[int] = bounds
        if isinstance(view, SeriesLayout):
            split_bounds = view.sample_bounds(cfg.chunk_rows, cfg.target_chunk_bytes)
        splits, split_rows = origin.plan_splits(split_bounds)
    fingerprint = _fingerprint(cfg, specs, bounds, dataset, origin)
    fmt = get_writer(cfg.format)
    options = FormatOptions(cfg.compression, cfg.compression_level, cfg.shard_chunks)
    commit = BlockCommit(
        out,
        fingerprint=fingerprint,
        num_blocks=-(-bounds.num_chunks // (cfg.shard_chunks or 1)),
        overwrite=cfg.overwrite,
        describe={"config": cfg.to_dict()},
    )
    job = _plan_job(cfg, commit, specs, bounds, fingerprint, dataset, reads, origin)
    _share_view(job, view)
    num_blocks = job.num_blocks
    _log_plan(job, len(specs), row_bytes)
    create = _create_store(cfg, fmt, specs, bounds, options)

    with commit:
        try:
            done = commit.start(create)
            if done:
                log.info(
                    "resuming %s: %d of %d block(s) already written",
                    commit.root,
                    len(done),
                    num_blocks,
                )
            merged = run_blocks(job, commit, done, row_bytes, progress)
            publish_store(
                commit,
                job,
                merged,
                fmt=fmt,
                create=create,
                view=view,
                specs=specs,
                options=options,
                splits=splits,
                split_rows=split_rows,
                origin=origin,
            )
        except DiskFullError as exc:
            raise _disk_full(commit, job, fmt, row_bytes, exc) from exc
        except ShardloadError:
            raise
        except OSError as exc:
            if is_disk_full(exc):
                raise _disk_full(commit, job, fmt, row_bytes, exc) from exc
            raise StoreError(
                f"writing {out} failed: {exc}; the store stays incomplete in {commit.root}, "
                "re-run to resume"
            ) from exc
    _log_written(out, length * row_bytes, length, time.perf_counter() - t0)
    return open_store(out)


def _create_store(
    cfg: PrepareConfig,
    fmt: Any,
    specs: Mapping[str, ArraySpec],
    bounds: RegularBounds,
    options: FormatOptions,
) -> Callable[[Path], None]:
    """What creates the empty store in ``OUT.partial`` (again before a staging format's merge)."""
    fixed = {n: s for n, s in specs.items() if not s.ragged}
    ragged = [n for n, s in specs.items() if s.ragged]

    def create(root: Path) -> None:
        fmt.create(root, fixed, bounds, options)
        if ragged:
            from shardload.formats.ragged.write import create_ragged

            create_ragged(cfg.format, root, ragged)

    return create


def _disk_full(
    commit: BlockCommit, job: PrepareJob, fmt: Any, row_bytes: int, exc: Exception
) -> DiskFullError:
    """The error for a full disk, with the uncompressed bytes of the blocks not recorded
    (staging formats: plus the final file)."""
    done = commit.recorded()
    blocks = (job.block(i) for i in range(job.num_blocks) if i not in done)
    left = sum(b - a for _, a, b in blocks)
    needed_bytes = (left + (0 if fmt.parallel_write else job.length)) * row_bytes
    return disk_full_error(commit.out, needed_bytes, str(exc))


def _log_plan(job: PrepareJob, num_arrays: int, row_bytes: int) -> None:
    cfg, bounds = job.config, job.bounds
    log.info(
        "preparing %s: %d samples, %d array(s), %d chunk(s) of %d rows (%.1f MiB/chunk), format=%s compression=%s",
        Path(cfg.out),
        job.length,
        num_arrays,
        bounds.num_chunks,
        job.chunk_rows,
        job.chunk_rows * row_bytes / 2**20,
        cfg.format,
        cfg.compression,
    )


def _plan_job(
    cfg: PrepareConfig,
    commit: BlockCommit,
    specs: Mapping[str, ArraySpec],
    bounds: RegularBounds,
    fingerprint: str,
    dataset: Any,
    reads: ReadPlan,
    origin: RowOrigin | None = None,
) -> PrepareJob:
    # feature names stay out of the task (millions of names for wide arrays, shipped per task);
    # a worker reads them from its own view when an error needs one
    slim = {n: dataclasses.replace(s, features=None) for n, s in specs.items()}
    return PrepareJob(
        cfg,
        str(commit.root),
        bounds.length,
        bounds.chunk_rows,
        cfg.shard_chunks or 1,
        slim,
        fingerprint,
        dataset,
        defer_fsync=workers_share_disk_cache(cfg),
        origin=origin,
        blocks_per_read=reads.blocks_per_read,
        read_chunks=reads.chunks,
    )


def _share_view(job: PrepareJob, view: View) -> None:
    """The view the write tasks in this process use: the driver's own, or (one sample dim,
    rows not read by the view itself) the source re-opened with dask chunks aligned to the
    store's chunks; threads here share it."""
    cfg = job.config
    if job.read_chunks:  # the source again, in dask chunks of whole source units
        share_view(job.fingerprint, build(cfg, read_chunks=job.read_chunks))
    elif (
        job.dataset is None
        and job.origin is None
        and cfg.view != "window"
        and (len(cfg.sample_dims) == 1 or cfg.source.kind == "radiation")
        and getattr(view, "rows", None) is None
    ):
        share_view(job.fingerprint, build(cfg, job.chunk_rows))
    else:
        share_view(job.fingerprint, view)


def _log_written(out: Path, total: int, length: int, dt: float) -> None:
    log.info(
        "wrote %s: %d samples, %.1f MiB in %.1f s (%.1f MiB/s)",
        out,
        length,
        total / 2**20,
        dt,
        total / 2**20 / max(dt, 1e-9),
    )


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
    chunk_rows = cfg.chunk_rows or plan_chunk_rows(
        row_bytes, length=length, target_bytes=cfg.target_chunk_bytes
    )
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


#: the source of a config prepared with ``prepare(config, dataset=ds)``
DATASET_SOURCE = "dataset://in-memory"


def _with_dataset_source(config: Any, dataset: Any) -> Any:
    import xarray as xr

    if not isinstance(dataset, xr.Dataset):
        raise ConfigError(
            f"prepare(dataset=...): expected an xarray.Dataset, got {type(dataset).__name__}"
        )
    if isinstance(config, Mapping):
        if "source" in config:
            raise ConfigError(
                "prepare(dataset=...) replaces the config's source: remove 'source' from the config"
            )
        return {**config, "source": {"paths": [DATASET_SOURCE]}}
    return config


def _fingerprint(
    cfg: PrepareConfig,
    specs: Mapping[str, ArraySpec],
    bounds: RegularBounds,
    dataset: Any = None,
    origin: RowOrigin | None = None,
) -> str:
    """What the written arrays depend on: config (less what only runs or labels them: execution,
    overwrite, splits), source files (size, mtime) or the origin's identity, array specs,
    chunking."""
    from shardload.prep.sources.paths import expand_paths, is_url

    d = cfg.to_dict()
    for k in ("execution", "overwrite", "base_dir", "splits", "split_seed", "split_shuffle"):
        d.pop(k, None)
    files: list[list[Any]] = []
    if origin is not None:
        files.append(["origin", *origin.identity()])
    elif dataset is not None:
        from dask.base import tokenize

        # dask's token: deterministic for dask-backed and in-memory data (a resume), random
        # where it cannot tell (a restart, never a wrong resume)
        files.append(["dataset", tokenize(dataset)])
    else:
        for p in expand_paths(
            list(cfg.source.paths) + list(cfg.source.outputs), dict(cfg.source.storage_options)
        ):
            if not is_url(p):
                st = os.stat(p)
                files.append([p, st.st_size, st.st_mtime_ns])
            else:
                files.append([p])
    d["_files"] = files
    d["_specs"] = {
        k: [list(s.shape), np.dtype(s.dtype).name, *(["ragged"] if s.ragged else [])]
        for k, s in specs.items()
    }
    d["_bounds"] = [bounds.length, bounds.chunk_rows]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]
