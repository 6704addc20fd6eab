"""One compute task: a slab of every attribute (pass 1) or of every step (pass 2), computed
and written durably; it returns the slab's progress record."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import product
from typing import Any

import numpy as np

from shardload.blockwise.cache import ChunkCache, read_box
from shardload.blockwise.job import (
    AttributePlan,
    ComputeJob,
    job_cache_bytes,
    job_itemsize,
    plan_job_reuse,
)
from shardload.blockwise.plan import (
    AxisWindow,
    block_grid,
)
from shardload.blockwise.source import SourceArray
from shardload.blockwise.steps import (
    apply_step,
)
from shardload.blockwise.window import pad_window, read_window
from shardload.errors import ConfigError, NaNError
from shardload.prep.commit import write_block_durably
from shardload.prep.recorder import record_checksums
from shardload.prep.stats import STAT_FIELDS, partial
from shardload.util.imports import import_function

_SOURCES: dict[str, SourceArray] = {}
#: The decoded-chunk cache the threads of this process share, per run (the engine registers it
#: for the threads and sync schedulers: :func:`shared_chunk_cache`).
_CACHES: dict[str, ChunkCache] = {}


def _source(job: ComputeJob) -> SourceArray:
    src = _SOURCES.get(job.fingerprint)
    if src is None:
        src = _SOURCES[job.fingerprint] = SourceArray(job.config.source, job.config.variable)
    return src


@contextmanager
def shared_chunk_cache(job: ComputeJob, order: Sequence[int], tasks: int) -> Iterator[None]:
    """Register, for the slabs ``order`` run by ``tasks`` threads of this process, one cache
    of decoded source chunks holding at most the job's stated cache bytes; dropped on exit."""
    if not _source(job).decodes_chunks:
        yield
        return
    capacity = job_cache_bytes(job, tasks, shared=True)  # counted in the memory bound
    _CACHES[job.fingerprint] = ChunkCache(plan_job_reuse(job, order), capacity, _source(job).read)
    try:
        yield
    finally:
        _CACHES.pop(job.fingerprint, None)


def _chunk_cache(job: ComputeJob, slab: int) -> ChunkCache | None:
    """The shared cache, or (other processes) one for this slab alone; None for a source that
    reads exactly what it is asked (SEG-Y)."""
    cache = _CACHES.get(job.fingerprint)
    if cache is not None:
        return cache
    src = _source(job)
    if not src.decodes_chunks:
        return None
    plan = plan_job_reuse(job, (slab,))
    capacity = plan.cache_bytes(itemsize=job_itemsize(job), tasks=1)
    if job.cache_limit_bytes is not None:
        capacity = min(capacity, job.cache_limit_bytes)
    return ChunkCache(plan, capacity, src.read)


def apply_attribute(
    att: AttributePlan, padded: np.ndarray, windows: Sequence[AxisWindow]
) -> np.ndarray:
    """``function(padded, **kwargs)`` checked for shape and dtype, then trimmed to the block."""
    func = import_function(att.function, f"attributes.{att.name}.function")
    try:
        out = func(padded, **att.kwargs)
    except ValueError as exc:
        if "read-only" in str(exc):
            raise ConfigError(
                f"attributes.{att.name}: the function {att.function} writes into its input "
                "window, which is shared between attributes; copy it first"
            ) from exc
        raise
    out = np.asarray(out)
    if out.shape != padded.shape:
        raise ConfigError(
            f"attributes.{att.name}: the function {att.function} returned shape {out.shape} for "
            f"a window of shape {padded.shape}; a function must keep the window's shape"
        )
    if out.dtype != np.dtype(att.dtype):
        raise ConfigError(
            f"attributes.{att.name}: the function {att.function} returned dtype {out.dtype} but "
            f"the attribute's dtype is {att.dtype} (declare it with option 'dtype: {out.dtype}')"
        )
    return out[tuple(slice(w.trim_left, w.trim_left + w.stop - w.start) for w in windows)]


def partial_read(
    cache: ChunkCache, dtype: np.dtype[Any], read: Callable[[Sequence[tuple[int, int]]], np.ndarray]
) -> Callable[[Sequence[tuple[int, int]]], np.ndarray]:
    def read_cached(box: Sequence[tuple[int, int]]) -> np.ndarray:
        return read_box(cache, box, dtype, read)

    return read_cached


def run_slab(job: ComputeJob, slab: int) -> dict[str, Any]:
    """Compute and durably write slab ``slab`` of every attribute; return its progress record."""

    src = _source(job)
    shape = job.info.shape
    dtype = np.dtype(job.info.dtype)
    a0, b0 = job.bounds[slab], job.bounds[slab + 1]
    outs = {att.name: np.empty((b0 - a0, *shape[1:]), dtype=att.dtype) for att in job.attributes}
    inner = block_grid([(b0 - a0,), *job.chunks[1:]])
    cache = _chunk_cache(job, slab)
    read: Callable[[Sequence[tuple[int, int]]], np.ndarray] = src.read
    if cache is not None:
        read = partial_read(cache, dtype, src.read)
    positions = product(*[range(len(c)) for c in job.chunks[1:]])  # C order, as block_grid
    for rel, pos in zip(inner, positions, strict=True):
        box = [(a0, b0), *rel[1:]]
        buf, coords, windows = read_window(read, box, shape, job.attributes, dtype=dtype)
        if cache is not None:  # this block's window is read: chunks no block needs are dropped
            cache.release(cache.plan.block_chunks(slab, pos))
        if not job.config.allow_nan and buf.dtype.kind in "fc" and np.isnan(buf).any():
            raise NaNError(
                f"source variable {job.config.variable!r} has NaN values in the window "
                f"{[tuple(b) for b in box]} (block with halo); set 'allow_nan: true' to compute "
                "anyway (NaNs then spread through each function's support)"
            )
        where = (slice(None), *tuple(slice(a, b) for a, b in rel[1:]))
        for att, wins in zip(job.attributes, windows, strict=True):
            # one attribute's padded copy and output at a time (the memory bound)
            outs[att.name][where] = apply_attribute(att, pad_window(buf, coords, wins, att), wins)
        del buf
    if cache is not None:
        cache.finish_slab(slab)
    return {"block": slab, "record": _write_slab(job, slab, outs)}


def _write_slab(job: ComputeJob, slab: int, outs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Write slab ``slab`` of each array durably; its progress record (statistics partials and
    the chunk files' checksums, as prepare records them)."""
    from shardload.formats.zarr.write import WRITER as FORMAT

    a0 = job.bounds[slab]
    record: dict[str, np.ndarray] = {}
    for name, data in outs.items():
        sums = write_block_durably(FORMAT, job.root, slab, name, slab, a0, data, bounds=job.bounds)
        p = partial(data.reshape(-1))
        record.update({f"{name}/{k}": getattr(p, k) for k in STAT_FIELDS})
        if sums is not None:
            record_checksums(record, name, sums)
    return record


def run_step_slab(job: ComputeJob, slab: int) -> dict[str, Any]:
    """Pass 2: every step's output for slab ``slab``, from the attributes written in pass 1."""
    import zarr

    a0, b0 = job.bounds[slab], job.bounds[slab + 1]
    cache: dict[str, np.ndarray] = {}

    def column(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = np.asarray(zarr.open_array(store=job.root, path=name, mode="r")[a0:b0])
        return cache[name]

    outs = {
        s.name: apply_step(s, job.models[s.name], [column(i) for i in s.inputs]) for s in job.steps
    }
    return {"block": job.num_slabs + slab, "record": _write_slab(job, slab, outs)}


def run_block(job: ComputeJob, block: int) -> dict[str, Any]:
    """One commit block: a slab of the attributes (pass 1) or of the steps (pass 2)."""
    if block < job.num_slabs:
        return run_slab(job, block)
    return run_step_slab(job, block - job.num_slabs)
