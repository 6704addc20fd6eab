"""One write task of ``prepare``: read one block's rows through the view, check them, compute
their statistics partials and write them into ``OUT.partial`` (durably, or deferring the
fsyncs to the driver's recorder). Tasks run in any worker; :class:`PrepareJob` is all they get.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import DiskFullError, NaNError, ShardloadError, StoreError
from shardload.formats.registry import get_writer
from shardload.manifest.core import ArraySpec
from shardload.plan.chunks import RegularBounds
from shardload.plan.reads import READ_BUDGET_BYTES
from shardload.prep.commit import THROTTLE_ENV, write_block_durably
from shardload.prep.config import PrepareConfig
from shardload.prep.disk import is_disk_full
from shardload.prep.recorder import checksum_field, record_checksums
from shardload.prep.shared_reads import SharedReads, slice_rows
from shardload.prep.stats import Partial, partial
from shardload.prep.views.base import View
from shardload.util.durable import collect_written

log = logging.getLogger("shardload.prep.driver")  # the name users' logs have always shown


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
    origin: Any = None  # a RowOrigin (prep/origin.py): the rows come from it, not from source
    # how tasks read the source (shardload.prep.sources.layout.ReadPlan): consecutive blocks
    # whose rows the first of their tasks in a process reads for all (shared_reads), and the
    # dask chunks (whole source units) to open it with
    blocks_per_read: int = 1
    read_chunks: tuple[tuple[str, int], ...] | None = None
    #: a dated store: what its statistics cover (:class:`~shardload.prep.stats.dated.DatedStats`)
    dated: Any = None
    #: the view's row reader serves every read: a worker opens the source without dask
    read_by_rows: bool = False

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
#: rows of read groups (several blocks read at once), shared by the process's tasks
_SHARED = SharedReads(READ_BUDGET_BYTES)


def build(
    cfg: PrepareConfig,
    chunk_rows: int | None = None,
    dataset: Any = None,
    read_chunks: tuple[tuple[str, int], ...] | None = None,
    *,
    rows_first: bool = True,
) -> View:
    """Open the source and build the view; with ``chunk_rows``, dask chunks along a single
    sample dim match the store's chunks (each task then reads only its own rows); with
    ``read_chunks``, the source is opened with these dask chunks (whole source units). A
    ``dataset`` (the caller's lazy ``xarray.Dataset``) replaces the source, chunks as they are.
    ``rows_first``: see :func:`build_source`."""
    return build_source(cfg, chunk_rows, dataset, read_chunks, rows_first=rows_first)[0]


#: views that say whether their row reader serves every read (``read_by_rows``)
_ROWS_FIRST_VIEWS = ("flat", "window")


def build_source(
    cfg: PrepareConfig,
    chunk_rows: int | None = None,
    dataset: Any = None,
    read_chunks: tuple[tuple[str, int], ...] | None = None,
    *,
    rows_first: bool = True,
) -> tuple[View, Any]:
    """:func:`build`, and the lazy dataset the view reads.

    ``rows_first``: a source h5py may read (:func:`~shardload.prep.sources.open.rows_first`)
    is opened without dask first; where the view's row reader then serves every read, that
    view is the one returned (no dask is imported, none of its chunks planned), else the source
    is opened again as below, in dask chunks."""
    from shardload.prep.sources.open import open_rows, open_source
    from shardload.prep.views import build_view, row_dims

    if dataset is not None:
        if cfg.source.variables:
            dataset = dataset[list(cfg.source.variables)]
        return build_view(dataset, cfg), dataset
    if rows_first:
        by_rows = _build_read_by_rows(cfg)
        if by_rows is not None:
            return by_rows
    if read_chunks:
        ds = open_source(cfg.source, chunks=dict(read_chunks))
        rows = open_rows(cfg.source, ds, cfg.sample_dims) if cfg.view in ("flat", "graph") else None
        return build_view(ds, cfg, rows=rows), ds

    sample_chunks = None
    if (
        chunk_rows
        and (len(cfg.sample_dims) == 1 or cfg.source.kind == "radiation")
        and cfg.view != "window"
    ):
        sample_chunks = {(cfg.sample_dims or ("column",))[0]: chunk_rows}
    ds = open_source(cfg.source, sample_chunks=sample_chunks)
    served = ("flat", "graph", "window")  # window: its series (at_load) or its time spans
    rows = open_rows(cfg.source, ds, row_dims(cfg)) if cfg.view in served else None
    return build_view(ds, cfg, rows=rows), ds


def _build_read_by_rows(cfg: PrepareConfig) -> tuple[View, Any] | None:
    """The view of the source opened without dask, where its row reader serves every read
    (``view.read_by_rows``); None otherwise, or where the source is not one h5py may read."""
    from shardload.prep.sources.open import open_rows, open_source, rows_first
    from shardload.prep.views import build_view, row_dims

    dims = row_dims(cfg)
    if cfg.view not in _ROWS_FIRST_VIEWS or not rows_first(cfg.source, dims):
        return None
    ds = open_source(cfg.source, dask_chunks=False)
    rows = open_rows(cfg.source, ds, dims)
    view = build_view(ds, cfg, rows=rows) if rows is not None else None
    if view is not None and getattr(view, "read_by_rows", False):
        return view, ds
    ds.close()
    return None


def share_view(fingerprint: str, view: View) -> None:
    """Make ``view`` the one tasks of ``fingerprint`` use in this process (threads share it)."""
    _SHARED.clear()
    _VIEWS.clear()
    _VIEWS[fingerprint] = view


def _view(job: PrepareJob) -> View:
    if job.fingerprint not in _VIEWS:
        _VIEWS.clear()
        _VIEWS[job.fingerprint] = (
            job.origin.open_view()
            if job.origin is not None
            else build(
                job.config,
                job.chunk_rows,
                job.dataset,
                job.read_chunks,
                rows_first=job.read_by_rows,
            )
        )
    return _VIEWS[job.fingerprint]


def _read_rows(job: PrepareJob, block: int, *, keep: bool = False) -> Mapping[str, Any]:
    """The view's rows of one block: read alone, or sliced from the rows of its read group
    (``job.blocks_per_read`` consecutive blocks, read once per process: :mod:`shared_reads`)."""
    _, a, b = job.block(block)
    per = max(1, job.blocks_per_read)
    if per == 1 and block:  # read alone (block 0: perhaps read for the codec sample)
        return _view(job).read(a, b)
    group = block // per
    first, last = group * per, min((group + 1) * per, job.num_blocks) - 1
    start, stop = job.block(first)[1], job.block(last)[2]
    uses = last - first + 1 + int(keep)
    rows = _SHARED.take((job.fingerprint, group), lambda: _view(job).read(start, stop), uses=uses)
    return {k: slice_rows(v, a - start, b - start) for k, v in rows.items()}


def read_first_block(job: PrepareJob, *, keep: bool) -> Mapping[str, Any]:
    """The rows of write block 0 as its task reads them; ``keep``: kept in this process for
    that task (the codec sample, :mod:`shardload.prep.codecs`, then reads no row twice)."""
    rows = _read_rows(job, 0, keep=keep)
    if not keep:  # its read group too: no task here takes it
        _SHARED.clear()
    return rows


def _read_block(
    job: PrepareJob, block: int, *, statistics: bool = True
) -> tuple[dict[str, Any], dict[str, Partial], dict[str, np.ndarray]]:
    """The rows of one block as the store's arrays (``RaggedRows`` for variable-length ones),
    their statistics partials and the block's notes (a dated store's missing rows and NaN
    counts: :mod:`shardload.prep.stats.dated`); ``statistics=False``: none of fixed arrays."""
    chunk, a, b = job.block(block)
    data = _read_rows(job, block)
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
        if job.dated is None and statistics:
            stats[name] = p = partial(arr)
            if job.config.nan == "fail" and p.nan_count.any():
                _nan_error(job, name, arr, chunk, a, b)
    if job.dated is None:
        return arrays, stats, {}
    return (arrays, *_dated_statistics(job, arrays, chunk, a, b))


def _dated_statistics(
    job: PrepareJob, arrays: dict[str, np.ndarray], chunk: int, a: int, b: int
) -> tuple[dict[str, Partial], dict[str, np.ndarray]]:
    """A dated block's partials (its period rows; tendencies from its rows and the halo after
    them) and notes; with ``nan: fail``, NaN values in rows not missing are an error."""
    from shardload.prep.stats.dated import NAN_NOTE, block_statistics

    stop = min(b + job.dated.halo_rows, job.length)
    halo = _view(job).read(b, stop) if stop > b else {}
    halo = {k: np.asarray(halo[k], dtype=job.specs[k].dtype) for k in halo if k in arrays}
    stats, notes = block_statistics(job.dated, arrays, a, b, halo)
    if job.config.nan == "fail":
        for name, arr in arrays.items():
            if int(notes.get(f"{NAN_NOTE}{name}", [0])[0]):
                _nan_error(job, name, arr, chunk, a, b)
    return stats, notes


def _nan_error(job: PrepareJob, name: str, arr: np.ndarray, chunk: int, a: int, b: int) -> None:
    """Raise the NaNError naming the first feature of ``arr`` with a NaN (in a row that is not
    all NaN: a dated store's missing states are not NaN values)."""
    v = arr.reshape(len(arr), -1)
    nan = np.isnan(v)
    nan = nan[~nan.all(axis=1)] if job.dated is not None else nan
    per = nan.sum(axis=0)
    feat = int(np.argmax(per > 0)) if arr.ndim <= 2 else int(np.argmax(per > 0)) % arr.shape[-1]
    names = _view(job).specs[name].features
    label = names[feat] if names and feat < len(names) else f"feature {feat}"
    raise NaNError(
        f"NaN values in array {name!r} ({label}) in chunk {chunk} (rows {a}:{b}): "
        f"{int(per.sum())} NaN(s); set nan: warn to keep them"
    )


def block_stats(job: PrepareJob, block: int) -> dict[str, Any]:
    """The statistics of a block written (and recorded) by an earlier, interrupted run, from
    the source again: a progress record carries no statistics (see :func:`prepare`)."""
    _, stats, notes = _read_block(job, block)
    return {"block": block, "stats": stats, "notes": notes, "paths": []}


def run_task(job: PrepareJob, item: int) -> dict[str, Any]:
    """``item >= 0``: write block ``item`` (:func:`run_block`); ``item < 0``: only the
    statistics of block ``-item - 1`` (:func:`block_stats`)."""
    return run_block(job, item) if item >= 0 else block_stats(job, -item - 1)


def run_block(job: PrepareJob, block: int) -> dict[str, Any]:
    """Read the rows of one block from the source, compute their stats, write them.

    Returns ``{"block": i, "record": fields, "stats": partials, "paths": files}``: the named
    arrays of the block's progress record (the checksums of what it wrote), the statistics
    partials of each array, and the files written (``job.defer_fsync``: not fsynced yet, the
    driver fsyncs them before it writes the record)."""
    throttle_s = float(os.environ.get(THROTTLE_ENV) or 0)
    if throttle_s:  # a testing aid; sleep(0) would still give up the GIL (1-5 ms each)
        time.sleep(throttle_s / 2)
    # the statistics of the block run beside its encoding and write (numpy's reductions and
    # the codecs leave the GIL): not where a NaN must stop the block before it is written
    beside = job.dated is None and job.config.nan != "fail"
    arrays, stats, notes = _read_block(job, block, statistics=not beside)
    fmt = get_writer(job.config.format)
    record: dict[str, np.ndarray] = {}
    with ThreadPoolExecutor(1, thread_name_prefix="shardload-stats") as pool:
        pending = pool.submit(_fixed_partials, job, arrays) if beside else None
        with collect_written(defer=job.defer_fsync) as paths:
            for k, (name, arr) in enumerate(arrays.items()):
                if k and throttle_s:  # between two arrays' writes
                    time.sleep(throttle_s / 2)
                if job.specs[name].ragged:
                    record.update(_write_ragged(job, block, name, arr))
                else:
                    _write_array(job, fmt, block, name, arr, record)
        if pending is not None:
            fixed = pending.result()
            stats = {n: stats[n] if n in stats else fixed[n] for n in arrays}
    return {"block": block, "record": record, "stats": stats, "notes": notes, "paths": paths}


def _fixed_partials(job: PrepareJob, arrays: Mapping[str, Any]) -> dict[str, Partial]:
    """The statistics partials of a block's fixed-size arrays (read by :func:`_read_block`
    with ``statistics=False``), in the order of ``arrays``."""
    return {name: partial(arr) for name, arr in arrays.items() if not job.specs[name].ragged}


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
    (:mod:`shardload.formats.ragged.write`); the record fields (checksums, row lengths)."""
    from shardload.formats.ragged.write import write_ragged_block

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
