"""The block-wise compute engine: ``shardload.compute(config)``.

Each task owns one slab of blocks along axis 0 (one chunk of the output store). For every block
of the slab it reads the block plus the widest halo from the source (one windowed read, two or
more only where a periodic boundary wraps around; the parts of source chunks that other blocks
read too come from a bounded cache of decoded chunks shared by the threads, so that each chunk
is decoded once: :mod:`shardload.blockwise.cache`), pads it locally exactly as dask's
``map_overlap`` pads the whole array, applies every attribute's function, trims the halo, and
writes one chunk per attribute through the commit protocol (:mod:`shardload.prep.commit`). Memory is
bounded by construction: nothing but the tasks in flight and the cache holds data (docs/compute.md).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.blockwise.config import ComputeConfig, load_compute_config
from shardload.blockwise.job import ComputeJob, estimate_memory, plan_job
from shardload.blockwise.publish import compute_manifest, fit_steps, merge_stats, plan_arrays
from shardload.blockwise.source import SourceArray
from shardload.blockwise.tasks import run_block, run_slab, shared_chunk_cache
from shardload.errors import ConfigError, ShardloadError, StoreError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import encode_checksums
from shardload.layout import CHECKSUMS_NAME
from shardload.manifest.core import Manifest
from shardload.prep.commit import BlockCommit
from shardload.prep.disk import disk_full_error, is_disk_full, partial_path
from shardload.prep.executor import (
    default_workers,
    open_executor,
    resolve_scheduler,
    run_windowed,
)
from shardload.prep.recorder import merge_checksums

log = logging.getLogger(__name__)


def compute(
    config: str | os.PathLike[str] | Mapping[str, Any] | ComputeConfig,
    overrides: Sequence[str] = (),
    *,
    progress: bool | None = None,
) -> Manifest:
    """Compute every attribute of ``config`` block by block into a store; see docs/compute.md."""
    from shardload.formats.zarr.write import WRITER as FORMAT

    cfg = load_compute_config(config, overrides)
    out = Path(cfg.out)
    t0 = time.perf_counter()
    info = SourceArray(cfg.source, cfg.variable).info
    job = plan_job(cfg, info, str(partial_path(out)))
    tasks = int(cfg.execution.num_workers or default_workers())
    job = _check_memory(job, tasks, out)
    commit = BlockCommit(
        out,
        fingerprint=job.fingerprint,
        num_blocks=job.num_blocks,
        overwrite=cfg.overwrite,
        describe={"compute": True},
    )
    bounds = job.bounds
    specs = plan_arrays(job)
    options = FormatOptions(cfg.compression)

    def create(root: Path) -> None:
        FORMAT.create(root, specs, bounds, options)

    with commit:
        try:
            done = commit.start(create)
            if done:
                log.info(
                    "resuming %s: %d of %d slab(s) already written",
                    commit.root,
                    len(done),
                    job.num_slabs,
                )
            job, stats, sums = _run_passes(job, commit, tasks, progress)
            commit.finish_format(FORMAT, create, [], list(specs), bounds=bounds)
            manifest = compute_manifest(job, stats, sums, options)
            files = manifest.to_files()
            if sums:  # before the manifest, which publish writes last
                files = {CHECKSUMS_NAME: encode_checksums(sums), **files}
            commit.publish(files)
        except OSError as exc:
            raise _write_failed(commit, specs, exc) from exc
        except ConfigError:  # refused (a dtype, a shape): the config must change first
            _drop_if_empty(commit)
            raise
    log.info(
        "computed %d attribute(s) into %s in %.1f s", len(specs), out, time.perf_counter() - t0
    )
    return manifest


def _drop_if_empty(commit: BlockCommit) -> None:
    """Remove ``OUT.partial`` when a refused run recorded no block: there is nothing to resume,
    and a folder left there reads as an interrupted run to ``open_store``."""
    if commit.root.exists() and not commit.recorded():
        shutil.rmtree(commit.root, ignore_errors=True)
        log.info("removed %s: the run was refused before any slab was written", commit.root)


def _write_failed(commit: BlockCommit, specs: Mapping[str, Any], exc: OSError) -> StoreError:
    """A full disk (DiskFullError, with the bytes of the slabs not recorded) or another OS
    error; either way the store stays incomplete in ``OUT.partial`` and a re-run resumes."""
    if is_disk_full(exc):
        total = sum(int(np.prod(s.shape)) * np.dtype(s.dtype).itemsize for s in specs.values())
        left = commit.num_blocks - len(commit.recorded())
        return disk_full_error(commit.out, total * left // max(1, commit.num_blocks), str(exc))
    return StoreError(
        f"writing {commit.out} failed: {exc}; the store stays incomplete in {commit.root}, "
        "re-run the same command to resume"
    )


def _check_memory(job: ComputeJob, tasks: int, out: Path) -> ComputeJob:
    """Log the run's memory bound; above ``memory_limit``, shrink the cache of decoded source
    chunks to fit (chunks are then decoded more than once) or, if that is not enough, refuse."""
    cfg = job.config
    est = estimate_memory(job, tasks)
    limit = cfg.memory_limit
    if limit is not None and est.total_bytes > limit and est.cache_bytes:
        slack = limit - (est.total_bytes - est.cache_bytes)
        if slack >= 0:
            shared = resolve_scheduler(cfg.execution) in ("threads", "sync")
            job = dataclasses.replace(job, cache_limit_bytes=slack if shared else slack // tasks)
            log.info(
                "compute %s: memory_limit %.1f MiB: decoded-chunk cache cut from %.1f to %.1f "
                "MiB (source chunks may be decoded more than once)",
                out,
                limit / 2**20,
                est.cache_bytes / 2**20,
                slack / 2**20,
            )
            est = estimate_memory(job, tasks)
    log.info("compute %s: memory bound %s", out, est.describe())
    if limit is not None and est.total_bytes > limit:
        raise ConfigError(
            f"memory_limit: {limit / 2**20:.1f} MiB is below the run's bound "
            f"{est.describe()}; use smaller blocks (option 'chunks'), fewer workers "
            "(execution.num_workers) or raise memory_limit"
        )
    return job


def _run_passes(
    job: ComputeJob, commit: BlockCommit, tasks: int, progress: bool | None
) -> tuple[ComputeJob, dict[str, Any], dict[str, Any]]:
    """Pass 1 (the attributes) and, with steps, pass 2 (the steps, after fitting their models
    on pass 1's output); the job with its fitted models, the statistics and the checksums."""
    todo = commit.todo()
    first = [i for i in todo if i < job.num_slabs]
    if resolve_scheduler(job.config.execution) in ("threads", "sync"):
        with shared_chunk_cache(job, first, tasks):  # one cache of decoded source chunks
            _run(job, commit, first, job.num_slabs - len(first), progress)
    else:  # each task keeps the chunks its own blocks read again
        _run(job, commit, first, job.num_slabs - len(first), progress)
    records = [commit.read_record(i) for i in range(job.num_slabs)]
    stats = merge_stats(records, [a.name for a in job.attributes])
    sums = merge_checksums(records, [a.name for a in job.attributes])
    if job.steps:
        job = dataclasses.replace(job, models=fit_steps(job, commit, stats, tasks))
        second = [i for i in todo if i >= job.num_slabs]
        _run(job, commit, second, job.num_slabs - len(second), progress)
        more = [commit.read_record(i) for i in range(job.num_slabs, job.num_blocks)]
        stats.update(merge_stats(more, [s.name for s in job.steps]))
        step_sums = merge_checksums(more, [s.name for s in job.steps])
        sums = {**sums, **step_sums} if sums and step_sums else {}
    return job, stats, sums


def _run(
    job: ComputeJob, commit: BlockCommit, todo: list[int], initial: int, progress: bool | None
) -> None:
    """At most ``parallelism`` slabs in flight (the memory bound); record each as it finishes."""
    from tqdm.auto import tqdm

    bar = tqdm(
        total=job.num_slabs,
        initial=initial,
        unit="slab",
        desc="compute",
        disable=(not progress) if progress is not None else None,
    )
    with open_executor(job.config.execution) as (ex, parallelism):

        def record(res: dict[str, Any]) -> None:
            commit.record(res["block"], res["record"])
            bar.update(1)

        try:
            run_windowed(ex, run_block, job, todo, window=parallelism, on_result=record)
        finally:
            bar.close()


__all__ = ["ComputeJob", "ShardloadError", "compute", "plan_job", "run_slab"]
