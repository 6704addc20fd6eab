"""``prepare``: raw files -> a complete store. The only module that wires
source -> view -> plan -> format. See docs/design.md ("Writing a store").
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ConfigError, DiskFullError, NaNError, ShardloadError, StoreError
from shardload.formats.base import FormatOptions, get_format
from shardload.formats.checksums import ALGORITHM, encode_checksums
from shardload.layout import CHECKSUMS_NAME, METADATA_NAME
from shardload.manifest.core import ArrayInfo, ArraySpec, Manifest
from shardload.plan.chunks import RegularBounds, plan_chunk_rows, plan_store_splits
from shardload.prep.commit import THROTTLE_ENV, BlockCommit, write_block_durably
from shardload.prep.config import PrepareConfig, load_config
from shardload.prep.disk import disk_full_error, is_disk_full
from shardload.prep.executor import open_executor, run_windowed
from shardload.prep.recorder import (
    DurableRecorder,
    checksum_field,
    merge_checksums,
    record_checksums,
)
from shardload.prep.stats import OrderedMerge, Partial, partial
from shardload.prep.views.base import View
from shardload.prep.views.window_series import WindowSeriesView, window_manifest
from shardload.store.core import Store, open_store
from shardload.util.durable import collect_written
from shardload.version import __version__

log = logging.getLogger(__name__)

STAT_FIELDS = ("count", "mean", "m2", "min", "max", "nan_count")


@dataclass(frozen=True)
class PrepareJob:
    """Everything a write task needs, and small enough to ship to any worker: its size does
    not grow with the number of chunks (boundaries are computed, not listed)."""

    config: PrepareConfig
    partial_dir: str
    length: int
    chunk_rows: int
    chunks_per_block: int  # write block = this many chunks (a Zarr shard; 1 otherwise)
    specs: Mapping[str, ArraySpec]
    fingerprint: str
    dataset: Any = None  # prepare(config, dataset=ds): the caller's lazy xarray.Dataset
    defer_fsync: bool = False  # tasks leave fsyncs to the driver (workers on its machine)

    @property
    def bounds(self) -> RegularBounds:
        return RegularBounds(self.length, self.chunk_rows)

    @property
    def num_blocks(self) -> int:
        return -(-self.length // (self.chunk_rows * self.chunks_per_block))

    def block(self, i: int) -> tuple[int, int, int]:
        """``(first chunk, first row, stop row)`` of write block ``i``, in O(1)
        (:func:`~shardload.plan.chunks.block_span` on regular boundaries)."""
        chunk = i * self.chunks_per_block
        if not 0 <= i < self.num_blocks:
            raise IndexError(f"write block {i} out of range ({self.num_blocks} blocks)")
        rows = self.chunk_rows * self.chunks_per_block
        return chunk, i * rows, min((i + 1) * rows, self.length)


# -- per-process cache: a worker opens the source and builds the view once ----------------------
_VIEWS: dict[str, View] = {}


def build(cfg: PrepareConfig, chunk_rows: int | None = None, dataset: Any = None) -> View:
    """Open the source and build the view; with ``chunk_rows``, dask chunks along a single
    sample dim match the store's chunks (each task then reads only its own rows). A
    ``dataset`` (the caller's lazy ``xarray.Dataset``) replaces the source, chunks as they are."""
    from shardload.prep.sources.open import open_rows, open_source
    from shardload.prep.views import build_view

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
        _VIEWS[job.fingerprint] = build(job.config, job.chunk_rows, job.dataset)
    return _VIEWS[job.fingerprint]


def _read_block(job: PrepareJob, block: int) -> tuple[dict[str, Any], dict[str, Partial]]:
    """The rows of one block, as the store's arrays (:class:`~shardload.manifest.ragged.RaggedRows` for
    variable-length ones), and their statistics partials."""
    chunk, a, b = job.block(block)
    data = _view(job).read(a, b)
    arrays: dict[str, Any] = {}
    stats: dict[str, Partial] = {}
    for name, spec in job.specs.items():
        if spec.ragged:
            arrays[name], stats[name] = _ragged_rows(job, name, spec, data[name], chunk, a, b)
            continue
        arr = data[name]
        want = (b - a, *spec.shape[1:])
        if arr.shape != want:
            raise StoreError(
                f"view returned shape {arr.shape} for array {name!r} rows {a}:{b}, expected {want}"
            )
        arrays[name] = arr = np.ascontiguousarray(arr, dtype=spec.dtype)
        stats[name] = p = partial(arr)
        if job.config.nan == "fail" and p.nan_count.any():
            feat = int(np.argmax(p.nan_count > 0))
            names = _view(job).specs[name].features
            label = names[feat] if names and feat < len(names) else f"feature {feat}"
            raise NaNError(
                f"NaN values in array {name!r} ({label}) in chunk {chunk} (rows {a}:{b}): "
                f"{int(p.nan_count.sum())} NaN(s); set nan: warn to keep them"
            )
    return arrays, stats


def block_stats(job: PrepareJob, block: int) -> dict[str, Any]:
    """The statistics of a block written (and recorded) by an earlier, interrupted run, from
    the source again: a progress record carries no statistics (see :func:`prepare`)."""
    return {"block": block, "stats": _read_block(job, block)[1], "paths": []}


def run_task(job: PrepareJob, item: int) -> dict[str, Any]:
    """``item >= 0``: write block ``item`` (:func:`run_block`); ``item < 0``: only the
    statistics of block ``-item - 1`` (:func:`block_stats`)."""
    return run_block(job, item) if item >= 0 else block_stats(job, -item - 1)


def run_block(job: PrepareJob, block: int) -> dict[str, Any]:
    """Read the rows of one block from the source, compute their stats, write them.

    Returns ``{"block": i, "record": fields, "stats": partials, "paths": files}``: the named
    arrays of the block's progress record (the checksums of what it wrote), the statistics
    partials of each array, and the files written. With ``job.defer_fsync`` these files are not
    fsynced yet: the driver fsyncs them before it writes the record.
    """
    throttle_s = float(os.environ.get(THROTTLE_ENV) or 0)
    time.sleep(throttle_s / 2)
    arrays, stats = _read_block(job, block)
    fmt = get_format(job.config.format)
    record: dict[str, np.ndarray] = {}
    with collect_written(defer=job.defer_fsync) as paths:
        for k, (name, arr) in enumerate(arrays.items()):
            if k:  # between two arrays' writes
                time.sleep(throttle_s / 2)
            if job.specs[name].ragged:
                record.update(_write_ragged(job, block, name, arr))
            else:
                _write_array(job, fmt, block, name, arr, record)
    return {"block": block, "record": record, "stats": stats, "paths": paths}


def _write_error(
    job: PrepareJob, name: str, chunk: int, a: int, b: int, exc: OSError
) -> ShardloadError:
    """The error for a failed write of one chunk of array ``name``: disk full (resume after
    freeing space) or another OS error; either way the store stays incomplete."""
    where = f"chunk {chunk} (rows {a}:{b}) of array {name!r}"
    if is_disk_full(exc):
        return DiskFullError(f"writing {where} to {job.partial_dir}: {exc}")
    return StoreError(
        f"writing {where} to {job.partial_dir} failed: {exc}. "
        "The store stays incomplete; re-run to resume."
    )


def _write_array(
    job: PrepareJob, fmt: Any, block: int, name: str, arr: np.ndarray, record: dict[str, Any]
) -> None:
    chunk, a, b = job.block(block)
    try:
        sums = write_block_durably(
            fmt, job.partial_dir, block, name, chunk, a, arr, bounds=job.bounds
        )
    except OSError as exc:
        raise _write_error(job, name, chunk, a, b, exc) from exc
    if sums is None:  # a staged block (HDF5): its checksums are over the rows themselves
        sums = fmt.row_checksums(chunk, arr, bounds=job.bounds)
    record_checksums(record, name, sums)


def split_metadata(manifest: Manifest, cfg: PrepareConfig) -> bytes:
    """``metadata.json``: each split's rows, chunks and (for row-range splits) its row range,
    with the fractions and seed that made them (the manifest holds the same; this file is
    for readers without shardload)."""
    splits = {
        name: {
            "rows": manifest.split_num_rows(name),
            "chunks": list(chunks),
            "row_range": list(manifest.split_rows[name]) if name in manifest.split_rows else None,
        }
        for name, chunks in manifest.splits.items()
    }
    doc = {
        "samples": manifest.length,
        "splits": splits,
        "fractions": dict(cfg.splits or {}),
        "split_seed": cfg.split_seed,
        "split_shuffle": cfg.split_shuffle,
        "shardload_version": __version__,
    }
    return json.dumps(doc, indent=1).encode()


#: Progress-record field of a variable-length array's row lengths (int64, the block's rows).
LENGTHS_KEY = "ragged:"


def _ragged_rows(
    job: PrepareJob, name: str, spec: ArraySpec, data: Any, chunk: int, a: int, b: int
) -> tuple[Any, Partial]:
    """A block of a variable-length array as the view returned it, checked: its rows (values
    in the store's dtype) and the statistics partial of its values."""
    from shardload.manifest.ragged import RaggedRows

    if not isinstance(data, RaggedRows) or len(data.lengths) != b - a:
        got = len(data.lengths) if isinstance(data, RaggedRows) else type(data).__name__
        raise StoreError(
            f"view returned {got} rows for variable-length array {name!r} rows {a}:{b}, "
            f"expected {b - a}"
        )
    values = np.ascontiguousarray(data.values, dtype=spec.dtype)
    p = partial(values)
    if job.config.nan == "fail" and p.nan_count.any():
        raise NaNError(
            f"NaN values in array {name!r} in chunk {chunk} (rows {a}:{b}): "
            f"{int(p.nan_count.sum())} NaN(s); set nan: warn to keep them"
        )
    return RaggedRows(values, np.asarray(data.lengths, np.int64)), p


def _write_ragged(job: PrepareJob, block: int, name: str, rows: Any) -> dict[str, np.ndarray]:
    """One block of a variable-length array: its values per sample chunk, durably
    (:mod:`shardload.formats.ragged.format`); the record fields (checksums, row lengths)."""
    from shardload.formats.ragged.format import write_ragged_block

    chunk, a, b = job.block(block)
    try:
        sums = write_ragged_block(
            job.config.format, Path(job.partial_dir), name, chunk, rows, bounds=job.bounds
        )
    except OSError as exc:
        raise _write_error(job, name, chunk, a, b, exc) from exc
    return {
        **checksum_field(name, sums),
        f"{LENGTHS_KEY}{name}": rows.lengths,
    }


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
    ``overwrite`` is false, :class:`StoreLockedError` when another run is writing ``out``,
    :class:`DiskFullError` when the disk fills up. An interrupted run leaves ``OUT.partial``;
    running again with the same config (and the same dataset, by dask's token) resumes it
    (splits may differ: they are not written into the arrays).
    """
    if dataset is not None:
        config = _with_dataset_source(config, dataset)
    cfg = config if isinstance(config, PrepareConfig) else load_config(config, overrides)
    out = Path(cfg.out)
    t0 = time.perf_counter()
    view = build(cfg, dataset=dataset)
    specs, length, row_bytes, chunk_rows = plan_rows(cfg, view)
    bounds = RegularBounds(length, chunk_rows)
    splits, split_rows = plan_splits_for(cfg, view, bounds)  # before any file is written
    fingerprint = _fingerprint(cfg, specs, bounds, dataset)
    fmt = get_format(cfg.format)
    options = FormatOptions(cfg.compression, cfg.compression_level, cfg.shard_chunks)
    commit = BlockCommit(
        out,
        fingerprint=fingerprint,
        num_blocks=-(-bounds.num_chunks // (cfg.shard_chunks or 1)),
        overwrite=cfg.overwrite,
        describe={"config": cfg.to_dict()},
    )
    # feature names stay out of the task (millions of names for wide arrays, shipped per task);
    # a worker reads them from its own view when an error needs one
    slim = {n: dataclasses.replace(s, features=None) for n, s in specs.items()}
    job = PrepareJob(
        cfg,
        str(commit.root),
        length,
        chunk_rows,
        cfg.shard_chunks or 1,
        slim,
        fingerprint,
        dataset,
        defer_fsync=workers_share_disk_cache(cfg),
    )
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
    num_blocks = job.num_blocks
    log.info(
        "preparing %s: %d samples, %d array(s), %d chunk(s) of %d rows (%.1f MiB/chunk), format=%s compression=%s",
        out,
        length,
        len(specs),
        bounds.num_chunks,
        chunk_rows,
        chunk_rows * row_bytes / 2**20,
        cfg.format,
        cfg.compression,
    )

    fixed = {n: s for n, s in specs.items() if not s.ragged}
    ragged = [n for n, s in specs.items() if s.ragged]

    def create(root: Path) -> None:
        fmt.create(root, fixed, bounds, options)
        if ragged:
            from shardload.formats.ragged.format import create_ragged

            create_ragged(cfg.format, root, ragged)

    def needed_bytes(done: frozenset[int]) -> int:
        """Uncompressed bytes of the blocks not recorded (staging formats: plus the final file)."""
        left = sum(b - a for i in range(num_blocks) if i not in done for _, a, b in [job.block(i)])
        return (left + (0 if fmt.parallel_write else length)) * row_bytes

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
            merged = _run(job, commit, done, row_bytes, progress)
            records = [commit.read_record(i) for i in range(num_blocks)]
            staged = ((i, *job.block(i)[:2]) for i in range(num_blocks))
            commit.finish_format(fmt, create, staged, list(fixed), bounds=bounds)
            stats = _final_stats(merged, specs, cfg.nan == "warn", num_blocks)
            sums = merge_checksums(records, list(specs))
            lengths = _finish_ragged(cfg, commit, records, specs, ragged, bounds, options, sums)
            manifest = Manifest(
                format=cfg.format,
                length=length,
                chunk_bounds=tuple(bounds),
                arrays={
                    n: ArrayInfo(
                        n,
                        tuple(s.shape),
                        np.dtype(s.dtype).name,
                        chunk_rows,
                        path=_array_path(cfg.format, n, s.ragged),
                        features=s.features,
                        attrs=dict(s.attrs),
                        ragged=_length_stats(lengths[n]) if s.ragged else None,
                    )
                    for n, s in specs.items()
                },
                splits=splits,
                split_rows=split_rows,
                stats=stats,
                static=dict(view.static),
                options={
                    **options.to_dict(),
                    "view": cfg.view,
                    "sample_dims": list(cfg.sample_dims),
                    "blocks": [job.block(i)[1] for i in range(num_blocks)] + [length],
                },
                provenance=_provenance(cfg, dataset),
                complete=True,
                shardload_version=__version__,
                checksums=ALGORITHM if sums else "",
            )
            if isinstance(view, WindowSeriesView):  # the window arrays over the series
                manifest = window_manifest(
                    manifest, view, view.sample_bounds(cfg.chunk_rows, cfg.target_chunk_bytes)
                )
            files = {METADATA_NAME: split_metadata(manifest, cfg), **manifest.file_writers()}
            if sums:  # before the manifest, which publish writes last
                files = {CHECKSUMS_NAME: encode_checksums(sums), **files}
            commit.publish(files)  # feature files first, the manifest last
        except DiskFullError as exc:
            raise disk_full_error(out, needed_bytes(commit.recorded()), str(exc)) from exc
        except ShardloadError:
            raise
        except OSError as exc:
            if is_disk_full(exc):
                raise disk_full_error(out, needed_bytes(commit.recorded()), str(exc)) from exc
            raise StoreError(
                f"writing {out} failed: {exc}; the store stays incomplete in {commit.root}, "
                "re-run to resume"
            ) from exc
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


def _array_path(fmt: str, name: str, ragged: bool) -> str:
    if ragged:
        from shardload.formats.ragged.format import array_path

        return array_path(fmt, name)
    return name if fmt != "hdf5" else f"data.h5/{name}"


def _length_stats(lengths: np.ndarray) -> dict[str, Any]:
    from shardload.formats.ragged.format import length_stats

    return length_stats(lengths)


def _finish_ragged(
    cfg: PrepareConfig,
    commit: BlockCommit,
    records: list[dict[str, np.ndarray]],
    specs: Mapping[str, ArraySpec],
    ragged: list[str],
    bounds: RegularBounds,
    options: FormatOptions,
    sums: dict[str, Any],
) -> dict[str, np.ndarray]:
    """Offsets (and for zarr / hdf5 the values) of the variable-length arrays, from the
    blocks' records; the offsets' checksum appended to each one's chunk checksums."""
    if not ragged:
        return {}
    from shardload.formats.ragged.format import finish_ragged

    lengths = {}
    for n in ragged:
        try:
            lengths[n] = np.concatenate([r[f"{LENGTHS_KEY}{n}"] for r in records])
        except KeyError as exc:
            raise StoreError(f"a progress record lacks the row lengths of array {n!r}") from exc
    infos = {n: (np.dtype(specs[n].dtype), lengths[n]) for n in ragged}
    off_sums = finish_ragged(
        cfg.format,
        commit.root,
        infos,
        bounds=tuple(bounds),
        options=options,
        progress=commit.progress,
    )
    for n in ragged:
        if n in sums:
            sums[n] = np.append(sums[n], np.uint64(off_sums[n]))
    return lengths


def _run(
    job: PrepareJob,
    commit: BlockCommit,
    done: frozenset[int],
    row_bytes: int,
    progress: bool | None,
) -> OrderedMerge:
    """Write every block not ``done`` and record each once durable; the statistics of every
    block, merged in block order.

    Statistics are not in the progress records (for wide arrays, 6 float64 values per feature
    per block: 447 MB per one-sample block of a 9.3 M-feature grid, 48x its data). The driver
    merges them in block order as blocks are recorded, and saves what it merged
    (``_progress/stats.npz``: a prefix of blocks) at most once per ``16 x its size`` (and
    256 MiB) of data recorded. A resumed run starts from that prefix and recomputes the
    statistics of the recorded blocks past it from the source (reading, not writing). Every
    run merges the same partials in the same order: a resumed store's statistics equal a clean
    run's, bit for bit.
    """
    from tqdm.auto import tqdm

    merge = _load_stats(commit, job)
    restat = sorted(i for i in done if i >= merge.next)
    items = sorted([*commit.todo(), *restat])
    if restat:
        log.info("statistics of %d recorded block(s) are read again from the source", len(restat))
    stats_bytes = sum(_num_features(s) * 8 * len(STAT_FIELDS) for s in job.specs.values())
    every = max(STATS_SAVE_FACTOR * stats_bytes, STATS_SAVE_BYTES)
    since = [0, merge.next]  # bytes recorded since the last save, prefix saved
    bar = tqdm(
        total=job.num_blocks,
        initial=len(done),
        unit="chunk",
        desc="prepare",
        disable=(not progress) if progress is not None else None,
    )

    def durable(res: dict[str, Any]) -> None:  # the block's files are durable: record it
        block = res["block"]
        if "record" in res:
            commit.record(block, res["record"])
            bar.update(1)
        merge.add(block, res["stats"])
        _, a, b = job.block(block)
        since[0] += (b - a) * row_bytes
        if since[0] >= every and merge.next > since[1]:
            commit.write_state(STATS_STATE, _stats_fields(merge))
            since[:] = [0, merge.next]

    try:
        with contextlib.ExitStack() as stack:
            ex, parallelism = stack.enter_context(open_executor(job.config.execution))
            if job.defer_fsync:
                recorder = stack.enter_context(DurableRecorder(commit, durable, maxsize=8))
                on_result = lambda res: recorder.put(res["paths"], res)  # noqa: E731
            else:

                def on_result(res: dict[str, Any]) -> None:
                    commit.synced.update(res["paths"])
                    durable(res)

            todo = [i if i not in done else -i - 1 for i in items]
            window = max(2, 2 * parallelism)
            run_windowed(ex, run_task, job, todo, window=window, on_result=on_result)
    finally:
        bar.close()
    return merge


#: ``_progress/stats.npz``: the statistics merged over the first ``blocks`` blocks
STATS_STATE = "stats"
#: the statistics are saved at most once per this many bytes of blocks recorded, and per
#: this many times their own size
STATS_SAVE_BYTES = 256 << 20
STATS_SAVE_FACTOR = 16


def _num_features(spec: ArraySpec) -> int:
    return int(spec.shape[-1]) if len(spec.shape) >= 2 else 1


def _stats_fields(merge: OrderedMerge) -> dict[str, np.ndarray]:
    fields = {"blocks": np.array(merge.next)}
    for name, p in (merge.merged or {}).items():
        fields.update({f"{name}/{k}": v for k, v in p.fields().items()})  # + exact sums
    return fields


def _load_stats(commit: BlockCommit, job: PrepareJob) -> OrderedMerge:
    """The statistics saved by an interrupted run (a prefix of recorded blocks), or none."""
    saved = commit.read_state(STATS_STATE)
    if not saved:
        return OrderedMerge()
    try:
        prefix = int(saved["blocks"])
        merged = {
            n: Partial.from_dict(
                {k: saved[f"{n}/{k}"] for k in (*STAT_FIELDS, "s1", "s2") if f"{n}/{k}" in saved}
            )
            for n in job.specs
        }
    except (KeyError, ValueError, TypeError):
        log.warning("ignoring the saved statistics in %s: not of this store", commit.progress)
        return OrderedMerge()
    if not 0 < prefix <= job.num_blocks or not all(i in commit.done for i in range(prefix)):
        log.warning("ignoring the saved statistics in %s: blocks not recorded", commit.progress)
        return OrderedMerge()
    if any(p.count.shape != (_num_features(job.specs[n]),) for n, p in merged.items()):
        log.warning("ignoring the saved statistics in %s: not of these arrays", commit.progress)
        return OrderedMerge()
    return OrderedMerge(start=prefix, merged=merged)


def workers_share_disk_cache(cfg: PrepareConfig) -> bool:
    """Whether the write tasks run on this machine (threads, local processes, a local dask
    cluster started here): then the driver can fsync the files they wrote, by path, and tasks
    defer their fsyncs to it. Workers elsewhere (a scheduler ``address``, an active client,
    dask-jobqueue) fsync their own files: an fsync here would not flush another host's cache."""
    from shardload.prep.executor import active_client, resolve_scheduler

    scheduler = resolve_scheduler(cfg.execution)
    if scheduler in ("sync", "threads", "processes"):
        return True
    return scheduler == "distributed" and not cfg.execution.address and active_client() is None


def plan_rows(cfg: PrepareConfig, view: View) -> tuple[dict[str, ArraySpec], int, int, int]:
    """``(specs, length, row_bytes, chunk_rows)`` of the store ``cfg`` writes from ``view``
    (pure; shared by prepare and ``prepare --check``)."""
    specs = dict(view.specs)
    length = int(view.length)
    if length == 0:
        raise ShardloadError("the view has no samples (length 0): check sample_dims and the source")
    row_bytes = sum(s.row_bytes for s in specs.values())
    if isinstance(view, WindowSeriesView):  # series chunks of whole space points
        return specs, length, row_bytes, view.plan_series_chunk_rows(cfg.target_chunk_bytes)
    chunk_rows = cfg.chunk_rows or plan_chunk_rows(
        row_bytes, length=length, target_bytes=cfg.target_chunk_bytes
    )
    return specs, length, row_bytes, chunk_rows


def plan_splits_for(
    cfg: PrepareConfig, view: View, bounds: Sequence[int]
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]]]:
    """Splits are labels over the written rows, planned from the config at each publish (not
    part of the write fingerprint). Window views get contiguous time ranges with a gap so that
    no two splits share a time step: window ``w`` spans times ``[w*stride, w*stride +
    lookback + horizon)``, so consecutive splits keep ``ceil((lookback + horizon) / stride) - 1``
    windows apart."""
    group_rows, gap = None, 0
    if isinstance(view, WindowSeriesView):  # windows at load time: split the samples
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
    return chunks, rows


def _final_stats(
    merge: OrderedMerge, specs: Mapping[str, ArraySpec], warn_nan: bool, num_blocks: int
) -> dict[str, Any]:
    if not merge.started or merge.next != num_blocks:
        raise StoreError(
            f"the statistics cover blocks 0:{merge.next} of {num_blocks} (a block was not merged)"
        )
    stats = {}
    final = merge.finalize()
    for name in specs:
        stats[name] = final[name]
        nans = int(np.sum(stats[name].nan_count))
        if nans and warn_nan:
            log.warning(
                "array %r has %d NaN value(s) (counts per feature in the manifest stats)",
                name,
                nans,
            )
    return stats


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
) -> str:
    """What the written arrays depend on: config (less what only runs or labels them: execution,
    overwrite, splits), source files (size, mtime), array specs, chunking."""
    from shardload.prep.sources.paths import expand_paths, is_url

    d = cfg.to_dict()
    for k in ("execution", "overwrite", "base_dir", "splits", "split_seed", "split_shuffle"):
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
    d["_specs"] = {
        k: [list(s.shape), np.dtype(s.dtype).name, *(["ragged"] if s.ragged else [])]
        for k, s in specs.items()
    }
    d["_bounds"] = [bounds.length, bounds.chunk_rows]
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:24]


def _provenance(cfg: PrepareConfig, dataset: Any = None) -> dict[str, Any]:
    from shardload.prep.sources.paths import expand_paths

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
