"""The block-wise compute engine: ``shardload.compute(config)``.

Each task owns one slab of blocks along axis 0 (one chunk of the output store). For every block
of the slab it reads the block plus the widest halo straight from the source (one windowed read;
two or more only where a periodic boundary wraps around), pads it locally exactly as dask's
``map_overlap`` pads the whole array, applies every attribute's function, trims the halo, and
writes one chunk per attribute through the commit protocol (:mod:`shardload.prep.commit`). Memory is
bounded by construction: nothing but the tasks in flight holds data (docs/compute.md).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import product
from pathlib import Path
from typing import Any

import numpy as np

from shardload.blockwise.config import ComputeConfig, load_compute_config
from shardload.blockwise.plan import (
    CONSTANT,
    AxisWindow,
    Boundary,
    MemoryEstimate,
    block_grid,
    normalize_chunks,
    plan_axis,
    plan_memory,
    plan_overlap_chunks,
    runs,
)
from shardload.blockwise.source import SourceArray, SourceInfo
from shardload.blockwise.steps import (
    FIT_ROWS,
    StepConfig,
    StepModel,
    apply_step,
    fit_kmeans,
    save_centers,
)
from shardload.errors import ConfigError, NaNError, ShardloadError
from shardload.formats.base import FormatOptions
from shardload.formats.checksums import ALGORITHM, encode_checksums
from shardload.layout import CHECKSUMS_NAME
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.prep.commit import BlockCommit, write_block_durably
from shardload.prep.disk import partial_path
from shardload.prep.executor import default_workers, open_executor, run_windowed
from shardload.prep.recorder import merge_checksums, record_checksums
from shardload.prep.stats import STAT_FIELDS, finalize, merge_all, partial
from shardload.prep.stats import Partial as StatPartial
from shardload.util.imports import import_function
from shardload.version import __version__

log = logging.getLogger(__name__)
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


# -- planning (no data read) --------------------------------------------------------------------
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
            AttributePlan(name, a.function, dict(a.kwargs), depth, boundary, a.dtype or info.dtype)
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
    est = plan_memory(
        job.chunks,
        [a.depth for a in job.attributes],
        itemsize=np.dtype(job.info.dtype).itemsize,
        out_itemsizes=[np.dtype(a.dtype).itemsize for a in job.attributes],
        work_bytes_per_element=works,
        tasks=tasks,
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


# -- one task -----------------------------------------------------------------------------------
_SOURCES: dict[str, SourceArray] = {}


def _source(job: ComputeJob) -> SourceArray:
    src = _SOURCES.get(job.fingerprint)
    if src is None:
        src = _SOURCES[job.fingerprint] = SourceArray(job.config.source, job.config.variable)
    return src


def read_window(
    read: Callable[[Sequence[tuple[int, int]]], np.ndarray],
    box: Sequence[tuple[int, int]],
    shape: Sequence[int],
    attributes: Sequence[AttributePlan],
    *,
    dtype: np.dtype[Any],
) -> tuple[np.ndarray, list[np.ndarray], list[list[AxisWindow]]]:
    """Read the window of block ``box`` (the block with every attribute's halo) once: one read,
    or one per piece where a periodic boundary wraps around. Returns the window (read-only),
    the source index of each of its elements per axis, and each attribute's axis windows."""
    axes = [
        [plan_axis(a, b, n, att.depth[k], att.boundary[k]) for att in attributes]
        for k, ((a, b), n) in enumerate(zip(box, shape, strict=True))
    ]
    axis_runs = [runs([i for w in ws for i in w.index]) for ws in axes]
    if all(len(r) == 1 for r in axis_runs):
        buf = read([r[0] for r in axis_runs])
    else:
        buf = np.empty([sum(b - a for a, b in r) for r in axis_runs], dtype=dtype)
        offsets = [np.cumsum([0] + [b - a for a, b in r]) for r in axis_runs]
        for pick in product(*[range(len(r)) for r in axis_runs]):
            where = tuple(
                slice(int(offsets[k][j]), int(offsets[k][j + 1])) for k, j in enumerate(pick)
            )
            buf[where] = read([axis_runs[k][j] for k, j in enumerate(pick)])
    buf.flags.writeable = False
    coords = [np.concatenate([np.arange(a, b) for a, b in r]) for r in axis_runs]
    per_attribute = [[axes[k][j] for k in range(len(shape))] for j in range(len(attributes))]
    return buf, coords, per_attribute


def pad_window(
    buf: np.ndarray, coords: Sequence[np.ndarray], windows: Sequence[AxisWindow], att: AttributePlan
) -> np.ndarray:
    """The attribute's padded block, as dask pads it: a view of the window where no padding is
    needed, else one copy (slice copies per run of the index maps; constants filled).
    Read-only either way."""
    idx, const = [], []
    for k, w in enumerate(windows):
        index = np.asarray(w.index)
        idx.append(np.searchsorted(coords[k], np.maximum(index, 0)))
        const.append(index == CONSTANT)
    if all(not c.any() and (np.diff(i) == 1).all() for i, c in zip(idx, const, strict=True)):
        return buf[tuple(slice(int(i[0]), int(i[-1]) + 1) for i in idx)]
    # one allocation filled by a few slice copies per axis piece, not a fancy index on every axis
    padded = np.empty(tuple(len(i) for i in idx), dtype=buf.dtype)
    axis_pieces = [_pieces(i, c) for i, c in zip(idx, const, strict=True)]
    for combo in product(*axis_pieces):
        dst = tuple(d for d, _ in combo)
        if any(src is None for _, src in combo):
            continue  # a constant piece: filled below
        padded[dst] = buf[tuple(src for _, src in combo if src is not None)]
    for k, c in enumerate(const):
        if c.any():
            padded[(slice(None),) * k + (c,)] = att.boundary[k]
    padded.flags.writeable = False
    return padded


def _pieces(idx: np.ndarray, const: np.ndarray) -> list[tuple[slice, slice | None]]:
    """Split an index map into runs copyable by one slice: ascending, descending (reflect),
    repeated (nearest), or constant (``None``); as ``(destination, source)`` slices.

    >>> [(d.start, d.stop, s.start, s.stop, s.step) for d, s in
    ...  _pieces(np.array([1, 0, 0, 1, 2, 2, 2]), np.zeros(7, bool))]
    [(0, 2, 1, None, -1), (2, 5, 0, 3, None), (5, 7, 2, 3, None)]
    """
    out: list[tuple[slice, slice | None]] = []
    n = len(idx)
    a = 0
    while a < n:
        if const[a]:
            b = a + 1
            while b < n and const[b]:
                b += 1
            out.append((slice(a, b), None))
            a = b
            continue
        b = a + 1
        step = None
        while b < n and not const[b]:
            d = int(idx[b]) - int(idx[b - 1])
            if d not in (-1, 0, 1) or (step is not None and d != step):
                break
            step = d
            b += 1
        first, last = int(idx[a]), int(idx[b - 1])
        if step == -1:
            out.append((slice(a, b), slice(first, last - 1 if last > 0 else None, -1)))
        elif step == 0:  # a repeated index (nearest): one source element, broadcast
            out.append((slice(a, b), slice(first, first + 1)))
        else:  # ascending, or a single element
            out.append((slice(a, b), slice(first, last + 1)))
        a = b
    return out


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


def run_slab(job: ComputeJob, slab: int) -> dict[str, Any]:
    """Compute and durably write slab ``slab`` of every attribute; return its progress record."""

    src = _source(job)
    shape = job.info.shape
    a0, b0 = job.bounds[slab], job.bounds[slab + 1]
    outs = {att.name: np.empty((b0 - a0, *shape[1:]), dtype=att.dtype) for att in job.attributes}
    inner = block_grid([(b0 - a0,), *job.chunks[1:]])
    for rel in inner:
        box = [(a0, b0), *rel[1:]]
        buf, coords, windows = read_window(
            src.read, box, shape, job.attributes, dtype=np.dtype(job.info.dtype)
        )
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
    return {"block": slab, "record": _write_slab(job, slab, outs)}


def _write_slab(job: ComputeJob, slab: int, outs: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Write slab ``slab`` of each array durably; its progress record (statistics partials and
    the chunk files' checksums, as prepare records them)."""
    from shardload.formats.zarr.format import FORMAT

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


# -- the run ------------------------------------------------------------------------------------
def compute(
    config: str | os.PathLike[str] | Mapping[str, Any] | ComputeConfig,
    overrides: Sequence[str] = (),
    *,
    progress: bool | None = None,
) -> Manifest:
    """Compute every attribute of ``config`` block by block into a store; see docs/compute.md."""
    from shardload.formats.zarr.format import FORMAT

    cfg = load_compute_config(config, overrides)
    out = Path(cfg.out)
    t0 = time.perf_counter()
    info = SourceArray(cfg.source, cfg.variable).info
    job = plan_job(cfg, info, str(partial_path(out)))
    tasks = int(cfg.execution.num_workers or default_workers())
    est = estimate_memory(job, tasks)
    log.info("compute %s: memory bound %s", out, est.describe())
    if cfg.memory_limit is not None and est.total_bytes > cfg.memory_limit:
        raise ConfigError(
            f"memory_limit: {cfg.memory_limit / 2**20:.1f} MiB is below the run's bound "
            f"{est.describe()}; use smaller blocks (option 'chunks'), fewer workers "
            "(execution.num_workers) or raise memory_limit"
        )
    commit = BlockCommit(
        out,
        fingerprint=job.fingerprint,
        num_blocks=job.num_blocks,
        overwrite=cfg.overwrite,
        describe={"compute": True},
    )
    bounds = job.bounds
    specs = {  # the source's dimension names become the arrays' (Zarr dimension_names)
        a.name: ArrayInfo(
            a.name,
            info.shape,
            a.dtype,
            bounds[1] - bounds[0],
            path=a.name,
            attrs={"dims": list(info.dims)},
        )
        for a in job.attributes
    }
    for st in job.steps:
        specs[st.name] = ArrayInfo(
            st.name,
            info.shape,
            st.dtype,
            bounds[1] - bounds[0],
            path=st.name,
            attrs={"dims": list(info.dims)},
        )
    options = FormatOptions(cfg.compression)

    def create(root: Path) -> None:
        FORMAT.create(root, specs, bounds, options)

    with commit:
        done = commit.start(create)
        if done:
            log.info(
                "resuming %s: %d of %d slab(s) already written",
                commit.root,
                len(done),
                job.num_slabs,
            )
        todo = commit.todo()
        first = [i for i in todo if i < job.num_slabs]
        _run(job, commit, first, job.num_slabs - len(first), progress)
        records = [commit.read_record(i) for i in range(job.num_slabs)]
        stats = _merge_stats(records, [a.name for a in job.attributes])
        sums = merge_checksums(records, [a.name for a in job.attributes])
        if job.steps:
            job = dataclasses.replace(job, models=_fit_steps(job, commit, stats, tasks))
            second = [i for i in todo if i >= job.num_slabs]
            _run(job, commit, second, job.num_slabs - len(second), progress)
            more = [commit.read_record(i) for i in range(job.num_slabs, job.num_blocks)]
            stats.update(_merge_stats(more, [s.name for s in job.steps]))
            step_sums = merge_checksums(more, [s.name for s in job.steps])
            sums = {**sums, **step_sums} if sums and step_sums else {}
        commit.finish_format(FORMAT, create, [], list(specs), bounds=bounds)

        def array_info(name: str, dtype: Any, **attrs: Any) -> ArrayInfo:
            """One output array on the source's grid and dims, with what made it."""
            return ArrayInfo(
                name,
                info.shape,
                dtype,
                bounds[1] - bounds[0],
                path=name,
                attrs={**attrs, "dims": list(info.dims)},
            )

        manifest = Manifest(
            format="zarr",
            length=info.shape[0],
            chunk_bounds=bounds,
            arrays={
                a.name: array_info(
                    a.name,
                    a.dtype,
                    function=a.function,
                    kwargs=dict(a.kwargs),
                    depth=list(a.depth),
                    boundary=list(a.boundary),
                )
                for a in job.attributes
            }
            | {
                s.name: array_info(
                    s.name, s.dtype, step=s.kind, **_step_attrs(s, job.models[s.name])
                )
                for s in job.steps
            },
            splits={"all": tuple(range(job.num_slabs))},
            stats=stats,
            options={
                **options.to_dict(),
                "compute": {"chunks": [list(c) for c in job.chunks], "variable": cfg.variable},
            },
            provenance={"source": list(cfg.source.paths), "variable": cfg.variable},
            complete=True,
            shardload_version=__version__,
            checksums=ALGORITHM if sums else "",
        )
        files = manifest.to_files()
        if sums:  # before the manifest, which publish writes last
            files = {CHECKSUMS_NAME: encode_checksums(sums), **files}
        commit.publish(files)
    log.info(
        "computed %d attribute(s) into %s in %.1f s", len(specs), out, time.perf_counter() - t0
    )
    return manifest


def _merge_stats(records: list[dict[str, np.ndarray]], names: Sequence[str]) -> dict[str, Any]:
    stats = {}
    for name in names:
        parts = [StatPartial.from_dict({k: r[f"{name}/{k}"] for k in STAT_FIELDS}) for r in records]
        merged = merge_all(parts)
        assert merged is not None
        stats[name] = finalize(merged)
    return stats


def _fit_steps(
    job: ComputeJob, commit: BlockCommit, stats: Mapping[str, Any], tasks: int
) -> dict[str, StepModel]:
    """Each step's model: the inputs' mean and std (the first pass's statistics) and, for
    k-means, the centres fitted by dask-ml on the written attributes; centres are kept in the
    progress folder, so a resumed run labels with the same ones."""
    from shardload.util.durable import write_atomic

    models = {}
    for s in job.steps:
        means = tuple(float(np.asarray(stats[i].mean).reshape(-1)[0]) for i in s.inputs)
        stds = tuple(float(np.asarray(stats[i].std).reshape(-1)[0]) for i in s.inputs)
        if s.kind == "standardize" or s.standardize:
            for i, sd in zip(s.inputs, stds, strict=True):
                if not np.isfinite(sd) or sd == 0:
                    raise ConfigError(
                        f"attributes.{s.name}.{s.kind}: attribute {i!r} has standard deviation "
                        f"{sd} (constant or all NaN): it cannot be standardised"
                        + (" (set kmeans.standardize: false)" if s.kind == "kmeans" else "")
                    )
        model = StepModel(means, stds)
        if s.kind == "kmeans":
            for i in s.inputs:
                nans = int(np.sum(stats[i].nan_count))
                if nans:
                    raise NaNError(
                        f"attributes.{s.name}.kmeans.inputs: attribute {i!r} has {nans} NaN "
                        "value(s) (allow_nan: true let them through); k-means needs finite "
                        "vectors: drop it from the inputs or fill the NaNs in the source"
                    )
            saved = commit.progress / f"step-{s.name}.npy"
            if saved.exists():
                centers = np.load(saved, allow_pickle=False)
            else:
                log.info("fitting k-means %s on %s (dask-ml)", s.name, list(s.inputs))
                centers = fit_kmeans(job.root, s, model, job.info.shape, tasks)
                write_atomic(saved, save_centers(saved, centers))
            model = dataclasses.replace(model, centers=centers)
        models[s.name] = model
    return models


def _step_attrs(s: StepConfig, model: StepModel) -> dict[str, Any]:
    out: dict[str, Any] = {
        "inputs": list(s.inputs),
        "means": list(model.means),
        "stds": list(model.stds),
    }
    if s.kind == "kmeans":
        assert model.centers is not None
        out.update(
            n_clusters=s.n_clusters,
            standardize=s.standardize,
            random_state=s.random_state,
            max_iter=s.max_iter,
            tol=s.tol,
            centers=model.centers.tolist(),
        )
    return out


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
