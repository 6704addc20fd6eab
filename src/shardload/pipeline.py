"""``prepare``: raw files -> a complete store. The only module that wires
source -> view -> plan -> format. See docs/design.md ("Writing a store").
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Mapping
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import __version__
from .config import PrepareConfig, load_config
from .errors import ConfigError, NaNError, ShardloadError, StoreError, StoreExistsError
from .executor import open_executor, resolve_scheduler
from .formats.base import FormatOptions, get_format
from .manifest import MANIFEST_NAME, ArrayInfo, Manifest
from .plan.chunks import plan_blocks, plan_chunk_bounds, plan_chunk_rows, plan_splits
from .stats import Partial, finalize, merge_all, partial
from .store import PARTIAL_SUFFIX, Store, open_store
from .views.base import ArraySpec, View

log = logging.getLogger(__name__)

PROGRESS_DIR = "_progress"
JOB_FILE = "job.json"
#: Testing aid: seconds to sleep in every write task (simulates slow storage for crash tests).
THROTTLE_ENV = "SHARDLOAD_THROTTLE_S"


@dataclass(frozen=True)
class PrepareJob:
    """Everything a write task needs, and small enough to ship to any worker."""

    config: PrepareConfig
    partial_dir: str
    bounds: tuple[int, ...]  # chunk boundaries
    blocks: tuple[int, ...]  # write-block boundaries (chunks or shards)
    specs: Mapping[str, ArraySpec]
    fingerprint: str
    dataset: Any = None  # prepare(config, dataset=ds): the caller's lazy xarray.Dataset


# -- per-process cache: a worker opens the source and builds the view once ----------------------
_VIEWS: dict[str, View] = {}


def build(cfg: PrepareConfig, chunk_rows: int | None = None, dataset: Any = None) -> View:
    """Open the source and build the view; with ``chunk_rows``, dask chunks along a single
    sample dim match the store's chunks (each task then reads only its own rows). A
    ``dataset`` (the caller's lazy ``xarray.Dataset``) replaces the source, chunks as they are."""
    from .sources.open import open_rows, open_source
    from .views import build_view

    if dataset is not None:
        if cfg.source.variables:
            dataset = dataset[list(cfg.source.variables)]
        return build_view(dataset, cfg)

    sample_chunks = None
    if (
        chunk_rows
        and (len(cfg.sample_dims) == 1 or cfg.source.kind == "radiation")
        and cfg.view != "window"
    ):
        sample_chunks = {(cfg.sample_dims or ("column",))[0]: chunk_rows}
    ds = open_source(cfg.source, sample_chunks=sample_chunks)
    rows = open_rows(cfg.source, ds, cfg.sample_dims) if cfg.view in ("flat", "graph") else None
    return build_view(ds, cfg, rows=rows)


def _view(job: PrepareJob) -> View:
    if job.fingerprint not in _VIEWS:
        _VIEWS.clear()
        _VIEWS[job.fingerprint] = build(
            job.config, job.bounds[1] - job.bounds[0] if len(job.bounds) > 1 else None, job.dataset
        )
    return _VIEWS[job.fingerprint]


def run_block(job: PrepareJob, block: int, write: bool) -> dict[str, Any]:
    """Read rows of one block from the source, compute stats, write it (or return the data)."""
    a, b = job.blocks[block], job.blocks[block + 1]
    chunk = job.bounds.index(a)
    if os.environ.get(THROTTLE_ENV):
        time.sleep(float(os.environ[THROTTLE_ENV]))
    data = _view(job).read(a, b)
    fmt = get_format(job.config.format)
    stats: dict[str, Any] = {}
    for name, spec in job.specs.items():
        arr = data[name]
        want = (b - a, *spec.shape[1:])
        if arr.shape != want:
            raise StoreError(
                f"view returned shape {arr.shape} for array {name!r} rows {a}:{b}, expected {want}"
            )
        arr = np.ascontiguousarray(arr, dtype=spec.dtype)
        data[name] = arr
        p = partial(arr)
        if job.config.nan == "fail" and p.nan_count.any():
            feat = int(np.argmax(p.nan_count > 0))
            label = (
                spec.features[feat]
                if spec.features and feat < len(spec.features)
                else f"feature {feat}"
            )
            raise NaNError(
                f"NaN values in array {name!r} ({label}) in chunk {chunk} (rows {a}:{b}): "
                f"{int(p.nan_count.sum())} NaN(s); set nan: warn to keep them"
            )
        stats[name] = p
        if write:
            try:
                fmt.write_block(Path(job.partial_dir), name, chunk, a, arr, bounds=job.bounds)
            except OSError as exc:
                raise _write_error(exc, name, chunk, a, b, job.partial_dir) from exc
    return {"block": block, "stats": stats, "data": None if write else data}


def _write_error(exc: OSError, name: str, chunk: int, a: int, b: int, where: str) -> StoreError:
    why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else str(exc)
    return StoreError(
        f"writing chunk {chunk} (rows {a}:{b}) of array {name!r} to {where} failed: {why}. "
        "The store stays incomplete; free space and re-run to resume."
    )


# -- driver -------------------------------------------------------------------------------------
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
    ``overwrite`` is false. An interrupted run leaves ``OUT.partial``; running again with the same
    config (and the same dataset, by dask's token) resumes it.
    """
    if dataset is not None:
        config = _with_dataset_source(config, dataset)
    cfg = config if isinstance(config, PrepareConfig) else load_config(config, overrides)
    out = Path(cfg.out)
    partial_dir = out.with_name(out.name + PARTIAL_SUFFIX)
    if out.exists() and not cfg.overwrite:
        raise StoreExistsError(
            f"output {out} exists; pass --overwrite (overwrite: true) to replace it"
        )
    t0 = time.perf_counter()
    view = build(cfg, dataset=dataset)
    specs = dict(view.specs)
    length = view.length
    if length == 0:
        raise ShardloadError("the view has no samples (length 0): check sample_dims and the source")
    row_bytes = sum(s.row_bytes for s in specs.values())
    chunk_rows = cfg.chunk_rows or plan_chunk_rows(
        row_bytes, length=length, target_bytes=cfg.target_chunk_bytes
    )
    bounds = plan_chunk_bounds(length, chunk_rows)
    blocks = plan_blocks(bounds, cfg.shard_chunks) if cfg.shard_chunks else bounds
    fingerprint = _fingerprint(cfg, specs, bounds, dataset)
    job = PrepareJob(cfg, str(partial_dir), bounds, blocks, specs, fingerprint, dataset)
    _VIEWS.clear()
    if (
        dataset is None
        and cfg.view != "window"
        and (len(cfg.sample_dims) == 1 or cfg.source.kind == "radiation")
        and getattr(view, "rows", None) is None
    ):
        # re-open with dask chunks aligned to the store's chunks; threads here share it
        _VIEWS[fingerprint] = build(cfg, chunk_rows)
    else:
        _VIEWS[fingerprint] = view
    fmt = get_format(cfg.format)
    options = FormatOptions(cfg.compression, cfg.compression_level, cfg.shard_chunks)
    num_blocks = len(blocks) - 1
    log.info(
        "preparing %s: %d samples, %d array(s), %d chunk(s) of %d rows (%.1f MiB/chunk), format=%s compression=%s",
        out, length, len(specs), len(bounds) - 1, chunk_rows, chunk_rows * row_bytes / 2**20, cfg.format, cfg.compression,
    )  # fmt: skip

    done = _start_or_resume(partial_dir, job, fmt, options)
    progress_dir = partial_dir / PROGRESS_DIR
    todo = [i for i in range(num_blocks) if i not in done]
    if done:
        log.info(
            "resuming %s: %d of %d block(s) already written", partial_dir, len(done), num_blocks
        )
    scheduler = resolve_scheduler(cfg.execution)
    write_in_task = fmt.parallel_write or scheduler in ("threads", "sync")
    _run(job, todo, num_blocks, len(done), write_in_task, progress_dir, progress)
    fmt.finish(partial_dir)

    partials = _load_partials(progress_dir, num_blocks, list(specs))
    stats = {}
    for name in specs:
        merged = merge_all(partials[name])
        assert merged is not None
        stats[name] = finalize(merged)
        nans = int(sum(stats[name].nan_count))
        if nans and cfg.nan == "warn":
            log.warning(
                "array %r has %d NaN value(s) (counts per feature in the manifest stats)",
                name,
                nans,
            )
    manifest = Manifest(
        format=cfg.format,
        length=length,
        chunk_bounds=bounds,
        arrays={
            n: ArrayInfo(
                n,
                tuple(s.shape),
                np.dtype(s.dtype).name,
                chunk_rows,
                path=n if cfg.format != "hdf5" else f"data.h5/{n}",
                features=s.features,
                attrs=dict(s.attrs),
            )
            for n, s in specs.items()
        },
        splits=plan_splits(
            len(bounds) - 1, cfg.splits, seed=cfg.split_seed, shuffle=cfg.split_shuffle
        ),
        stats=stats,
        static=dict(view.static),
        options={
            **options.to_dict(),
            "view": cfg.view,
            "sample_dims": list(cfg.sample_dims),
            "blocks": list(blocks),
        },
        provenance=_provenance(cfg, dataset),
        complete=True,
        shardload_version=__version__,
    )
    fsync_tree(partial_dir)  # every array file on disk before the manifest says complete
    for rel, data in manifest.to_files().items():  # feature files first, the manifest last
        (partial_dir / rel).parent.mkdir(parents=True, exist_ok=True)
        _write_atomic(partial_dir / rel, data)
        _fsync_dir((partial_dir / rel).parent)
    shutil.rmtree(progress_dir, ignore_errors=True)
    _publish(partial_dir, out)
    dt = time.perf_counter() - t0
    total = length * row_bytes
    log.info(
        "wrote %s: %d samples, %.1f MiB in %.1f s (%.1f MiB/s)",
        out,
        length,
        total / 2**20,
        dt,
        total / 2**20 / max(dt, 1e-9),
    )
    return open_store(out)


def _run(
    job: PrepareJob,
    todo: list[int],
    total: int,
    initial: int,
    write_in_task: bool,
    progress_dir: Path,
    progress: bool | None,
) -> None:
    from tqdm.auto import tqdm

    fmt = get_format(job.config.format)
    bar = tqdm(
        total=total,
        initial=initial,
        unit="chunk",
        desc="prepare",
        disable=(not progress) if progress is not None else None,
    )
    with open_executor(job.config.execution) as (ex, parallelism):
        window = max(2, 2 * parallelism)
        pending: set[Future[Any]] = set()
        it = iter(todo)
        try:
            while True:
                while len(pending) < window:
                    i = next(it, None)
                    if i is None:
                        break
                    pending.add(ex.submit(run_block, job, i, write_in_task))
                if not pending:
                    break
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    res = fut.result()
                    i = res["block"]
                    if res["data"] is not None:
                        a = job.blocks[i]
                        chunk = job.bounds.index(a)
                        for name, arr in res["data"].items():
                            try:
                                fmt.write_block(
                                    Path(job.partial_dir), name, chunk, a, arr, bounds=job.bounds
                                )
                            except OSError as exc:
                                raise _write_error(
                                    exc, name, chunk, a, a + len(arr), job.partial_dir
                                ) from exc
                    _write_partials(progress_dir / f"block-{i:06d}.npz", res["stats"])
                    bar.update(1)
        except BaseException:
            for f in pending:
                f.cancel()
            raise
        finally:
            bar.close()


def _start_or_resume(
    partial_dir: Path, job: PrepareJob, fmt: Any, options: FormatOptions
) -> set[int]:
    progress_dir = partial_dir / PROGRESS_DIR
    job_file = progress_dir / JOB_FILE
    if partial_dir.exists():
        if (partial_dir / MANIFEST_NAME).exists() and not progress_dir.exists():
            return set(range(len(job.blocks) - 1))  # finished but not yet renamed
        try:
            old = json.loads(job_file.read_text())["fingerprint"]
        except (OSError, ValueError, KeyError):
            old = None
        if old == job.fingerprint:
            return {int(p.stem.split("-")[1]) for p in progress_dir.glob("block-*.npz")}
        log.warning("%s is from another config or source; restarting it", partial_dir)
        shutil.rmtree(partial_dir)
    try:
        progress_dir.mkdir(parents=True)
        fmt.create(partial_dir, job.specs, job.bounds, options)
    except OSError as exc:
        raise StoreError(f"cannot create {partial_dir}: {exc}") from exc
    _write_atomic(
        job_file,
        json.dumps({"fingerprint": job.fingerprint, "config": job.config.to_dict()}).encode(),
    )
    return set()


def _write_partials(path: Path, stats: Mapping[str, Partial]) -> None:
    """A block's progress record: its statistics partials (binary: a few KB per array)."""
    buf = io.BytesIO()
    fields = ("count", "mean", "m2", "min", "max", "nan_count")
    np.savez(buf, **{f"{n}/{k}": getattr(p, k) for n, p in stats.items() for k in fields})
    _write_atomic(path, buf.getvalue())


def _load_partials(
    progress_dir: Path, num_blocks: int, names: list[str]
) -> dict[str, list[Partial]]:
    out: dict[str, list[Partial]] = {n: [] for n in names}
    for i in range(num_blocks):
        path = progress_dir / f"block-{i:06d}.npz"
        try:
            with np.load(path) as z:
                for n in names:
                    out[n].append(
                        Partial.from_dict(
                            {k.split("/", 1)[1]: z[k] for k in z if k.startswith(n + "/")}
                        )
                    )
        except (OSError, ValueError, KeyError) as exc:
            raise StoreError(f"block {i} has no valid progress record ({path}): {exc}") from exc
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _publish(partial_dir: Path, out: Path) -> None:
    """Rename the finished folder into place; an old store (overwrite) is moved aside first."""
    old = None
    if out.exists():
        old = out.with_name(f"{out.name}.old-{os.getpid()}-{int(time.time())}")
        os.replace(out, old)
    os.replace(partial_dir, out)
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (files written durably already cost little)."""
    for folder, _, files in os.walk(root):
        for name in files:
            _fsync(Path(folder) / name)
        _fsync_dir(Path(folder))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    """fsync a folder where the filesystem allows it (some refuse: ignored)."""
    with contextlib.suppress(OSError):
        _fsync(path)


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
    bounds: tuple[int, ...],
    dataset: Any = None,
) -> str:
    from .sources.open import expand_paths, is_url

    d = cfg.to_dict()
    for k in ("execution", "overwrite", "base_dir"):
        d.pop(k, None)
    files: list[list[Any]] = []
    if dataset is not None:
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
    d["_specs"] = {k: [list(s.shape), np.dtype(s.dtype).name] for k, s in specs.items()}
    d["_bounds"] = [len(bounds), bounds[1] if len(bounds) > 1 else 0]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _provenance(cfg: PrepareConfig, dataset: Any = None) -> dict[str, Any]:
    from .sources.open import expand_paths

    files = (
        ["xarray.Dataset passed to prepare(dataset=...)"]
        if dataset is not None
        else expand_paths(
            list(cfg.source.paths) + list(cfg.source.outputs), dict(cfg.source.storage_options)
        )
    )
    return {
        "files": files[:10000],
        "num_files": len(files),
        "config": cfg.to_dict(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "shardload_version": __version__,
    }
