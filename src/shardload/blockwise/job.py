"""Planning a compute run, no data read: the blocks, each attribute's halo and boundary, the
write fingerprint and the memory bound."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardload.blockwise.config import ComputeConfig
from shardload.blockwise.plan import (
    Boundary,
    MemoryEstimate,
    normalize_chunks,
    plan_memory,
    plan_overlap_chunks,
)
from shardload.blockwise.reuse import ReusePlan, plan_reuse
from shardload.blockwise.source import SourceInfo
from shardload.blockwise.steps import (
    FIT_ROWS,
    StepConfig,
    StepModel,
)
from shardload.errors import ConfigError
from shardload.util.imports import import_function

#: Bytes of working memory per window element a function allocates, when it does not say
#: (``func.work_bytes_per_element``): one float64 temporary.
DEFAULT_WORK_BYTES = 8


@dataclass(frozen=True)
class AttributePlan:
    name: str
    function: str
    kwargs: Mapping[str, Any]
    depth: tuple[int, ...]
    boundary: tuple[Boundary, ...]
    dtype: str  # the output dtype


@dataclass(frozen=True)
class ComputeJob:
    """Everything a task needs (picklable: shipped to processes and cluster workers)."""

    config: ComputeConfig
    root: str
    info: SourceInfo
    chunks: tuple[tuple[int, ...], ...]
    attributes: tuple[AttributePlan, ...]
    fingerprint: str
    #: standardisation / k-means steps (pass 2) and, once fitted, their models
    steps: tuple[StepConfig, ...] = ()
    models: Mapping[str, StepModel] = field(default_factory=dict)
    #: at most this many bytes per decoded-chunk cache (``memory_limit`` below the planned
    #: cache: chunks are then decoded more than once); None: the planned size
    cache_limit_bytes: int | None = None

    @property
    def num_blocks(self) -> int:
        """Commit blocks: one per slab, twice with steps (pass 2: ``num_slabs + slab``)."""
        return self.num_slabs * (2 if self.steps else 1)

    @property
    def bounds(self) -> tuple[int, ...]:
        return tuple(int(b) for b in np.concatenate([[0], np.cumsum(self.chunks[0])]))

    @property
    def num_slabs(self) -> int:
        return len(self.chunks[0])


def _dtype(name: str, att: Any, info: Any) -> str:
    """An attribute's output dtype when its config gives none: the source's, or for a
    built-in on integer input the float dtype it returns (``integer_output_dtype``)."""
    if np.dtype(info.dtype).kind in "fc":
        return str(info.dtype)
    fn = import_function(att.function, f"attributes.{name}.function")
    return str(getattr(fn, "integer_output_dtype", None) or info.dtype)


def plan_job(cfg: ComputeConfig, info: SourceInfo, root: str) -> ComputeJob:
    """Blocks, attributes and fingerprint; every config error surfaces here, before any read."""
    ndim = len(info.shape)
    if ndim == 0 or 0 in info.shape:
        raise ConfigError(
            f"source.variable {cfg.variable!r} has shape {info.shape}: nothing to compute"
        )
    if cfg.chunks is None:
        chunks = normalize_chunks(info.chunks, info.shape, where="chunks (the source's own)")
    else:
        chunks = normalize_chunks(cfg.chunks, info.shape)
    rows = chunks[0]
    if len(set(rows[:-1])) > 1 or rows[-1] > rows[0]:
        raise ConfigError(
            f"chunks: the source's blocks along axis 0 are irregular {rows}; the output store needs "
            "equal blocks along axis 0 (give chunks: {0: N, ...})"
        )
    attrs = []
    for name, a in cfg.attributes.items():
        depth, boundary = a.resolved(ndim)
        attrs.append(
            AttributePlan(
                name, a.function, dict(a.kwargs), depth, boundary, a.dtype or _dtype(name, a, info)
            )
        )
    chunks = plan_overlap_chunks(chunks, {a.name: a.depth for a in attrs})
    return ComputeJob(
        cfg,
        root,
        info,
        chunks,
        tuple(attrs),
        _fingerprint(cfg, info, chunks),
        steps=tuple(cfg.steps.values()),
    )


def estimate_memory(job: ComputeJob, tasks: int) -> MemoryEstimate:
    works = []
    for a in job.attributes:
        func = import_function(a.function, f"attributes.{a.name}.function")
        works.append(float(getattr(func, "work_bytes_per_element", DEFAULT_WORK_BYTES)))
    from shardload.prep.executor import resolve_scheduler

    shared = resolve_scheduler(job.config.execution) in ("threads", "sync")
    cache = job_cache_bytes(job, tasks, shared=shared) * (1 if shared else tasks)
    # decoding holds each chunk's encoded bytes and a decoded copy besides the result: one
    # chunk at a time through the cache, every chunk of the window in a direct read
    decode = 0
    if job.info.decodes_chunks:
        largest = int(np.prod([max(c) for c in job.info.chunks], dtype=np.int64))
        direct = plan_job_reuse(job).direct_read_bytes(itemsize=job_itemsize(job))
        decode = 2 * max(largest * job_itemsize(job), direct)
    est = plan_memory(
        job.chunks,
        [a.depth for a in job.attributes],
        itemsize=np.dtype(job.info.dtype).itemsize,
        out_itemsizes=[np.dtype(a.dtype).itemsize for a in job.attributes],
        work_bytes_per_element=works,
        tasks=tasks,
        cache_bytes=cache,
        decode_bytes=decode,
    )
    if job.steps:  # pass 2: a slab of each input and output, one batch of vectors + distances
        dtypes = {a.name: np.dtype(a.dtype).itemsize for a in job.attributes}
        inputs = {i for s in job.steps for i in s.inputs}
        slab = max(job.chunks[0]) * int(np.prod(job.info.shape[1:], dtype=np.int64))
        batch = max(
            FIT_ROWS * 8 * (2 * len(s.inputs) + (s.n_clusters if s.kind == "kmeans" else 0))
            for s in job.steps
        )
        per_task = (
            slab
            * (sum(dtypes[i] for i in inputs) + sum(np.dtype(s.dtype).itemsize for s in job.steps))
            + batch
        )
        if per_task > est.per_task_bytes:
            est = dataclasses.replace(
                est,
                per_task_bytes=per_task,
                total_bytes=est.total_bytes + (tasks + 1) * (per_task - est.per_task_bytes),
            )
    return est


def job_itemsize(job: ComputeJob) -> int:
    return int(np.dtype(job.info.dtype).itemsize)


def plan_job_reuse(job: ComputeJob, order: Sequence[int] | None = None) -> ReusePlan:
    """The reuse plan of the job's blocks over the source's chunks (slabs ``order``)."""
    return plan_reuse(
        job.info.chunks,
        job.chunks,
        [a.depth for a in job.attributes],
        [a.boundary for a in job.attributes],
        order,
    )


def job_cache_bytes(job: ComputeJob, tasks: int, *, shared: bool) -> int:
    """Bytes of decoded source chunks one cache holds: shared by ``tasks`` threads, the chunks
    any ``tasks`` consecutive slabs read twice or more; one slab's otherwise (a process's)."""
    if not job.info.decodes_chunks:
        return 0
    planned = plan_job_reuse(job).cache_bytes(
        itemsize=job_itemsize(job), tasks=tasks if shared else 1
    )
    return planned if job.cache_limit_bytes is None else min(planned, job.cache_limit_bytes)


def _fingerprint(cfg: ComputeConfig, info: SourceInfo, chunks: Sequence[Sequence[int]]) -> str:
    """What the written arrays depend on: attributes, blocks, source identity (size, mtime)."""
    stat = []
    for p in cfg.source.paths:
        try:
            st = os.stat(p)
            stat.append([p, st.st_size, st.st_mtime_ns])
        except OSError:
            stat.append([p])
    doc = {
        "attributes": {
            k: [a.function, a.depth, a.boundary, a.dtype, dict(a.kwargs)]
            for k, a in cfg.attributes.items()
        },
        "variable": cfg.variable,
        "steps": {k: dataclasses.asdict(v) for k, v in cfg.steps.items()},
        "chunks": chunks,
        "shape": info.shape,
        "dtype": info.dtype,
        "compression": cfg.compression,
        "sources": stat,
    }
    return hashlib.sha256(json.dumps(doc, default=str, sort_keys=True).encode()).hexdigest()[:32]
