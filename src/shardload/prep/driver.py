"""``prepare``: raw files -> a complete store. The only module that wires
source -> view -> plan -> format: it plans the store (:mod:`~shardload.prep.planning`, the write
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
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ConfigError, DiskFullError, ShardloadError, StoreError
from shardload.formats.base import FormatOptions
from shardload.formats.registry import get_writer
from shardload.manifest.core import ArraySpec
from shardload.plan.chunks import (
    RegularBounds,
)
from shardload.prep.codecs import choose_codecs
from shardload.prep.commit import BlockCommit
from shardload.prep.config import PrepareConfig, load_config
from shardload.prep.disk import disk_full_error, is_disk_full
from shardload.prep.origin import RowOrigin
from shardload.prep.planning import plan_store_rows
from shardload.prep.publish import publish_store
from shardload.prep.remote_commit import RemoteCommit, check_out_url
from shardload.prep.run import run_blocks, workers_share_disk_cache
from shardload.prep.sources.layout import ReadPlan
from shardload.prep.tasks import PrepareJob, build, build_source, share_view
from shardload.prep.views.base import View
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
    out = out_location(cfg.out)
    t0 = time.perf_counter() if t0 is None else t0
    plan = plan_store_rows(cfg, view, origin=origin, source=source, dataset=dataset)
    cfg, specs, length, row_bytes, bounds, reads = plan[:6]
    splits, split_rows = plan.splits, plan.split_rows
    fingerprint = _fingerprint(cfg, specs, bounds, dataset, origin)
    fmt = get_writer(cfg.format)
    options = FormatOptions(cfg.compression, cfg.compression_level, cfg.shard_chunks)
    commit = _block_commit(
        cfg,
        out,
        fingerprint=fingerprint,
        num_blocks=-(-bounds.num_chunks // (cfg.shard_chunks or 1)),
    )
    dated = _dated_stats(cfg, view, bounds, splits, split_rows)
    job = _plan_job(cfg, commit, specs, bounds, fingerprint, dataset, reads, view, origin, dated)
    _share_view(job, view)
    num_blocks = job.num_blocks
    _log_plan(job, len(specs), row_bytes)
    options = choose_codecs(job, options)  # compression auto: each array's, before create
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
    if isinstance(out, str):
        return open_store(out, storage_options=dict(cfg.out_storage_options) or None)
    return open_store(out)


def out_location(out: str) -> Path | str:
    """``out`` as a local path, or as the URL of an object store prepare writes to
    (``ConfigError`` for other URLs): ``Path('s3://b/x')`` would be the folder ``s3:/b/x``."""
    from shardload.prep.sources.paths import is_url

    if out.startswith("file://"):
        return Path(out[len("file://") :])
    if is_url(out):
        check_out_url(out)
        return out
    return Path(out)


def _block_commit(
    cfg: PrepareConfig, out: Path | str, *, fingerprint: str, num_blocks: int
) -> BlockCommit:
    """The commit of this run: into ``OUT.partial`` and renamed, or uploaded to a URL."""
    describe = {"config": cfg.to_dict()}
    if isinstance(out, str):
        return RemoteCommit(
            out,
            storage_options=cfg.out_storage_options,
            fingerprint=fingerprint,
            num_blocks=num_blocks,
            overwrite=cfg.overwrite,
            describe=describe,
        )
    return BlockCommit(
        out,
        fingerprint=fingerprint,
        num_blocks=num_blocks,
        overwrite=cfg.overwrite,
        describe=describe,
    )


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
        cfg.out,
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
    view: View,
    origin: RowOrigin | None = None,
    dated: Any = None,
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
        dated=dated,
        read_by_rows=bool(getattr(view, "read_by_rows", False)) and origin is None,
    )


def _dated_stats(
    cfg: PrepareConfig,
    view: View,
    bounds: RegularBounds,
    splits: Mapping[str, tuple[int, ...]],
    split_rows: Mapping[str, tuple[int, int]],
) -> Any:
    """A dated view's :class:`~shardload.prep.stats.dated.DatedStats` (None for others)."""
    from shardload.prep.stats.dated import DatedStats, plan_period
    from shardload.prep.views.dated import DatedView

    if not isinstance(view, DatedView):
        return None
    d = view.dated
    name, period = plan_period(
        cfg.dates.statistics, int(view.length), tuple(bounds), splits, split_rows
    )
    return DatedStats(d.axis, d.declared, period, name, cfg.dates.tendencies)


def _share_view(job: PrepareJob, view: View) -> None:
    """The view the write tasks in this process use: the driver's own, or (one sample dim,
    rows not read by the view itself) the source re-opened with dask chunks aligned to the
    store's chunks; threads here share it. A view whose row reader serves all it reads is
    the driver's own: it has no dask chunks (the source is opened once, without dask)."""
    cfg = job.config
    if job.read_by_rows:
        share_view(job.fingerprint, view)
    elif job.read_chunks:  # the source again, in dask chunks of whole source units
        share_view(job.fingerprint, build(cfg, read_chunks=job.read_chunks, rows_first=False))
    elif (
        job.dataset is None
        and job.origin is None
        and cfg.view != "window"
        and (len(cfg.sample_dims) == 1 or cfg.source.kind == "radiation")
        and getattr(view, "rows", None) is None
    ):
        share_view(job.fingerprint, build(cfg, job.chunk_rows, rows_first=False))
    else:
        share_view(job.fingerprint, view)


def _log_written(out: Path | str, total: int, length: int, dt: float) -> None:
    log.info(
        "wrote %s: %d samples, %.1f MiB in %.1f s (%.1f MiB/s)",
        out,
        length,
        total / 2**20,
        dt,
        total / 2**20 / max(dt, 1e-9),
    )


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
    for k in (
        "execution",
        "overwrite",
        "base_dir",
        "splits",
        "split_seed",
        "split_shuffle",
        "default_split_shuffle",
        "out_storage_options",
    ):
        d.pop(k, None)
    # of dates: only what changes the rows (never dated, the frequency); the rest changes
    # the statistics, checked against the saved ones instead; no key at all where nothing
    # changes the rows (the fingerprints of earlier runs)
    d.pop("dates", None)
    if cfg.dates.enabled is False or cfg.dates.frequency_s:
        d["dates"] = {"dated": cfg.dates.enabled is not False, "frequency_s": cfg.dates.frequency_s}
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
