"""Windows cut at load time: the reader of ``at_load`` window stores (layout in
:mod:`shardload.plan.windows`).

A batch is a set of window samples; each sample's look-back window is a run of ``lookback``
consecutive rows of a series array (one per source variable), and its target one row. On raw
rows in local files (npy, uncompressed Zarr) every run is one ``preadv`` straight into the
batch's rows (:func:`~shardload.loader.scatter.read_runs`; the destination of a variable's
row is its columns of the window row, so a window of one variable is one iovec). Elsewhere
(compressed chunks, URLs) the series rows a batch needs from each chunk are read with the
format's reader, then gathered.

The epoch plan is the one of every store (:mod:`shardload.plan.epoch`), over the window
samples: splits, ranks, workers, resume and elastic resume are shared with written windows.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from ..errors import ChunkReadError, PlanError, ShardloadError, StoreError
from ..formats.base import ArrayReader, RawChunk, RawChunks
from ..manifest import ArrayInfo, Manifest
from ..plan.epoch import EpochPlan, iter_worker_batches
from ..plan.windows import WindowGeometry, plan_window_runs, window_geometry
from .recycle import Allocate
from .scatter import _preadv, plan_iovecs, read_runs

#: Runs of one reader task at least (smaller batches are one task per array and variable).
RUNS_PER_TASK = 256


def series_manifest(manifest: Manifest, geometry: WindowGeometry) -> Manifest:
    """The manifest of the stored series arrays (what the format's reader opens)."""
    from dataclasses import replace

    from ..plan.chunks import plan_chunk_bounds

    series = manifest.static["window"]["series"]
    arrays = {k: ArrayInfo.from_dict({**v, "name": k}) for k, v in series["arrays"].items()}
    return replace(
        manifest, length=geometry.series_length, arrays=arrays, stats={}, splits={},
        split_rows={}, chunk_bounds=plan_chunk_bounds(geometry.series_length, geometry.chunk_rows),
        feature_files={},
    )  # fmt: skip


class WindowReader:
    """An :class:`~shardload.formats.base.ArrayReader` of the window arrays of an ``at_load``
    store over the format's reader of its series arrays (``series``)."""

    def __init__(self, manifest: Manifest, geometry: WindowGeometry, series: ArrayReader) -> None:
        self.manifest, self.geometry, self.series = manifest, geometry, series
        self._raw: dict[tuple[str, int], RawChunk] = {}

    #: the arrays ``shardload verify`` checks: the stored ones
    @property
    def stored_arrays(self) -> tuple[str, ...]:
        return tuple(self.manifest.static["window"]["series"]["arrays"])

    def checksum_units(self, name: str) -> int:
        return int(self.series.checksum_units(name))  # type: ignore[attr-defined]

    def check_unit(self, name: str, k: int) -> None:
        self.series.check_unit(name, k)  # type: ignore[attr-defined]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Samples ``[start, stop)`` of window array ``name``."""
        info = self.manifest.arrays[name]
        out = np.empty((max(0, stop - start), *info.row_shape), np.dtype(info.dtype))
        self.read_into(name, start, stop, out)
        return out

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        if stop > start:
            self.read_samples(name, np.arange(start, stop, dtype=np.int64), out)

    def raw(self, series: str, chunk: int) -> RawChunk | None:
        """Chunk ``chunk`` of series array ``series`` as raw local rows, or None."""
        key = (series, chunk)
        if key not in self._raw:
            if _preadv() is None or not isinstance(self.series, RawChunks):
                return None
            rc = self.series.raw_chunk(series, chunk)
            if rc is None:
                return None
            self._raw[key] = rc
        return self._raw[key]

    def read_samples(
        self, name: str, samples: np.ndarray, out: np.ndarray,
        submit: Callable[..., Future[None]] | None = None,
    ) -> list[Future[None]]:  # fmt: skip
        """Fill ``out`` (C-contiguous, one row per sample) with window array ``name`` of
        ``samples``; with ``submit`` (an executor's), the reads run there and their futures
        are returned."""
        _, cols = self.geometry.array_columns(name)
        if not out.flags.c_contiguous or len(out) != len(samples):
            raise PlanError(f"window array {name!r}: the batch buffer is not {len(samples)} C rows")
        if len(samples) == 0:
            return []
        chunk, file_row, pos, per = plan_window_runs(self.geometry, name, samples)
        futs: list[Future[None]] = []
        item = out.dtype.itemsize
        width = out.shape[-1]
        for c in cols:
            if self.raw(c.series, int(chunk[0])) is None:  # not raw local rows: gather
                gather: tuple[Any, ...] = (_gather_runs, self, c, chunk, file_row, pos, per, out)
                futs.append(submit(*gather) if submit else _done(*gather))
                continue
            # destination of file row j of sample i: out row i, step j, columns [col0, col1)
            step = np.arange(per, dtype=np.uint64) * np.uint64(width * item)
            base = (
                np.uint64(out.ctypes.data)
                + pos.astype(np.uint64) * np.uint64(per * width * item)
                + np.uint64(c.col0 * item)
            )
            ptrs = (base[:, None] + step[None, :]).reshape(-1)
            rb = (c.col1 - c.col0) * item
            runs = np.arange(len(samples) + 1, dtype=np.int64) * per
            iov, run_iov = plan_iovecs(ptrs, runs, rb)
            ends = np.flatnonzero(np.append(chunk[1:] != chunk[:-1], True))
            chunk_end = dict(
                zip(chunk[ends].tolist(), (file_row[ends] + per).tolist(), strict=True)
            )
            raw_of = self._raw_of(c.series)
            n = len(samples)
            parts = max(1, n // RUNS_PER_TASK)
            cuts = np.linspace(0, n, parts + 1).astype(np.int64).tolist()
            for p0, p1 in itertools.pairwise(cuts):
                job: tuple[Any, ...] = (read_runs, raw_of, c.series, range(p0, p1), chunk, file_row, run_iov,
                       iov, chunk_end)  # fmt: skip
                futs.append(submit(*job) if submit else _done(*job))
        return futs

    def _raw_of(self, series: str) -> Callable[[int], RawChunk]:
        def get(chunk: int) -> RawChunk:
            rc = self.raw(series, chunk)
            if rc is None:  # raw for one chunk, not for another: cannot be for one format
                raise StoreError(f"series array {series!r}: chunk {chunk} is not raw rows")
            return rc

        return get

    def close(self) -> None:
        self._raw.clear()
        self.series.close()


def _done(fn: Callable[..., None], *args: Any) -> Future[None]:
    """Run ``fn`` now; its result as a finished future."""
    f: Future[None] = Future()
    try:
        fn(*args)
        f.set_result(None)
    except BaseException as exc:  # handed over like a pool's future
        f.set_exception(exc)
    return f


def _gather_runs(
    reader: WindowReader, c: Any, chunk: np.ndarray, file_row: np.ndarray, pos: np.ndarray,
    per: int, out: np.ndarray,
) -> None:  # fmt: skip
    """Samples' runs of series ``c.series`` through the format's reader: per chunk, the rows
    from the first run's start to the last run's end, then a gather."""
    rows_per_chunk = reader.geometry.chunk_rows
    starts = np.flatnonzero(np.append(True, chunk[1:] != chunk[:-1]))
    stops = np.append(starts[1:], len(chunk))
    steps = np.arange(per, dtype=np.int64)
    for a, b in zip(starts.tolist(), stops.tolist(), strict=True):
        k = int(chunk[a])
        lo, hi = int(file_row[a]), int(file_row[b - 1]) + per
        g0 = k * rows_per_chunk
        try:
            block = reader.series.read(c.series, g0 + lo, g0 + hi)
        except ShardloadError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"chunk {k} of series array {c.series!r} could not be read: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        idx = (file_row[a:b] - lo)[:, None] + steps[None, :]
        vals = block[idx.reshape(-1)].reshape(b - a, per, -1)
        dst = out.reshape(len(out), per, -1)
        dst[pos[a:b], :, c.col0 : c.col1] = vals


def open_window_reader(manifest: Manifest, open_series: Callable[[Manifest], ArrayReader]) -> (
    WindowReader | None
):  # fmt: skip
    """A :class:`WindowReader` for an ``at_load`` store (None for any other store);
    ``open_series(manifest)`` opens the format's reader on the series manifest."""
    g = window_geometry(manifest.static)
    if g is None:
        return None
    return WindowReader(manifest, g, open_series(series_manifest(manifest, g)))


def window_batches(
    store: Any, names: Sequence[str], plan: EpochPlan, rank: int, worker: int, *,
    prefetch: int, threads: int, new_batch: Callable[[int], dict[str, np.ndarray]],
    index_key: str, allocate: Allocate | None = None,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """The worker's batches of an ``at_load`` store, in plan order: each batch's windows read
    by ``threads`` reader threads, up to ``prefetch + 1`` batches ahead of the one yielded.
    Closing the iterator waits for the reads in flight (no thread writes into a batch's
    memory after the caller reclaims it)."""
    reader = store.reader
    if not isinstance(reader, WindowReader):
        raise StoreError(f"{store.url} is not a window store with at_load: true")
    batches = iter_worker_batches(plan, rank, worker)
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="shardload-window")
    inflight: deque[tuple[dict[str, np.ndarray], list[Future[None]]]] = deque()
    ahead = max(1, prefetch) + 1
    try:
        for rows in batches:
            out = (allocate(len(rows)) if allocate else None) or new_batch(len(rows))
            out[index_key][...] = rows
            futs: list[Future[None]] = []
            for a in names:
                futs += reader.read_samples(a, rows, out[a], submit=pool.submit)
            inflight.append((out, futs))
            while len(inflight) > ahead:
                yield _finish(inflight)
        while inflight:
            yield _finish(inflight)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _finish(inflight: deque[tuple[dict[str, np.ndarray], list[Future[None]]]]) -> dict:
    out, futs = inflight.popleft()
    for f in futs:
        f.result()  # re-raises a read error here, in the consuming thread
    return out
