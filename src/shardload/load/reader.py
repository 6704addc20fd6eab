"""Reading a shuffle group's segments into group buffers (the gather reader's reads).

A group's segments are read into one page-aligned buffer per array (each segment with one read
per array over its row span, or over the bounding span of an explicit-row segment), in tasks
of about ``TASK_BYTES`` (:func:`submit_segments`); :class:`BufferPool` reuses the buffers of
groups the loader is done with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from itertools import pairwise
from typing import cast

import numpy as np

from shardload.errors import ChunkReadError, ShardloadError
from shardload.formats.base import READ_ALIGN, ReadsInto, ReadsSpansInto
from shardload.plan.spans import Segment, Spans, spans_rows
from shardload.store.core import Store


@dataclass(eq=False)
class Group:
    """One shuffle group being read: ``bufs[name][order]`` are its rows in yield order and
    ``rows[order]`` their global row numbers; segment ``i`` of ``spans`` lands at rows
    ``offsets[i]:offsets[i + 1]`` of the buffers."""

    spans: Spans
    order: np.ndarray
    bufs: dict[str, np.ndarray]
    rows: np.ndarray
    offsets: np.ndarray  # where each segment starts in the buffers
    futures: list[Future[None]] = field(default_factory=list)
    submitted: int = 0  # segments handed to the pool

    @property
    def segments(self) -> int:
        return len(self.spans)

    def wait(self) -> None:
        for f in self.futures:
            f.result()  # re-raises a read error here, in the consuming thread

    def release(self, pool: BufferPool) -> None:
        """Give the buffers back to ``pool`` (the caller no longer reads them)."""
        bufs, self.bufs = self.bufs, {}
        for name, buf in bufs.items():
            pool.give(name, buf)


class BufferPool:
    """Free group buffers per array, reused by later groups (flat bytes, grown when needed).

    Holds at most ``keep`` buffers per array; a worker's groups in flight bound the rest.
    """

    def __init__(self, keep: int = 2) -> None:
        self.keep = keep
        self._free: dict[str, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """A buffer of ``shape``, page-aligned (the kernel copies files into aligned memory
        faster: :func:`~shardload.formats.base.aligned_empty`)."""
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        want = nbytes + READ_ALIGN  # the pool holds the unaligned allocations
        with self._lock:
            free = self._free.get(name, [])
            fits = [i for i, b in enumerate(free) if b.nbytes >= want]
            buf = free.pop(min(fits, key=lambda i: free[i].nbytes)) if fits else None
        if buf is None:  # np.empty commits no memory: unread pages cost nothing
            buf = np.empty(want, np.uint8)
        off = (-buf.ctypes.data) % READ_ALIGN
        return buf[off : off + nbytes].view(dtype).reshape(shape)

    def give(self, name: str, arr: np.ndarray) -> None:
        base = arr
        while base.base is not None and isinstance(base.base, np.ndarray):
            base = base.base
        with self._lock:
            free = self._free.setdefault(name, [])
            free.append(base)
            free.sort(key=lambda b: -b.nbytes)
            del free[self.keep :]


def new_group(
    store: Store,
    names: Sequence[str],
    spans: Spans,
    order: np.ndarray,
    pool: BufferPool | None = None,
) -> Group:
    """A group of ``spans`` with its buffers taken from ``pool`` (vectorised over segments:
    a default group holds over a thousand whole inner chunks)."""
    offsets = spans.cum
    n = int(offsets[-1])
    arrays = store.manifest.arrays
    pool = pool or BufferPool(keep=0)
    bufs = {a: pool.take(a, (n, *arrays[a].row_shape), np.dtype(arrays[a].dtype)) for a in names}
    return Group(spans, order, bufs, spans_rows(spans), offsets)


_READS_INTO: dict[type, bool] = {}


def _reads_into(reader: object) -> bool:
    """``isinstance(reader, ReadsInto)``, once per reader class: a runtime-checkable
    Protocol's ``isinstance`` costs ~10 us (Python 3.11), a few % of reading a small chunk."""
    cls = type(reader)
    got = _READS_INTO.get(cls)
    if got is None:
        got = _READS_INTO[cls] = isinstance(reader, ReadsInto)
    return got


def read_segment(store: Store, name: str, seg: Segment, out: np.ndarray) -> None:
    """Read one segment of one array into ``out`` (its slice of the group buffer)."""
    a, b = seg.chunk_start + seg.start, seg.chunk_start + seg.stop
    try:
        reader = store.reader
        if seg.rows is None:
            if _reads_into(reader):
                cast(ReadsInto, reader).read_into(name, a, b, out)
            else:
                out[...] = reader.read(name, a, b)
        else:  # explicit rows (a resumed, partly read group): the bounding span, then a gather
            np.take(reader.read(name, a, b), seg.rows - seg.start, axis=0, out=out, mode="clip")
    except ShardloadError:
        raise
    except Exception as exc:
        raise ChunkReadError(
            f"chunk {seg.chunk} (rows {a}:{b}) of array {name!r} in {store.url} could not be "
            f"read: {type(exc).__name__}: {exc}"
        ) from exc


def read_segments(
    store: Store, name: str, segments: Sequence[Segment], outs: Sequence[np.ndarray]
) -> None:
    """Read several segments of one array (one pool task: small chunks cost one task each
    otherwise), each into its slice of the group buffer: in one call where the reader takes
    several spans at once (a sharded Zarr array: each shard opened once per task)."""
    reader = store.reader
    if len(segments) > 1 and _reads_spans(reader) and all(s.rows is None for s in segments):
        spans = [(s.chunk_start + s.start, s.chunk_start + s.stop) for s in segments]
        try:
            cast(ReadsSpansInto, reader).read_spans_into(name, spans, outs)
        except ShardloadError:
            raise
        except Exception as exc:
            raise _spans_error(store, name, [s.chunk for s in segments], exc) from exc
        return
    for seg, out in zip(segments, outs, strict=True):
        read_segment(store, name, seg, out)


def read_ranges(
    store: Store,
    name: str,
    chunks: np.ndarray,
    ranges: Sequence[tuple[int, int]],
    outs: Sequence[np.ndarray],
) -> None:
    """Global row ranges of one array (``chunks``: the chunk of each) into their slices of
    the group buffer, in one call of a reader of several spans (:func:`read_segments` for
    range segments, without a ``Segment`` object per chunk)."""
    try:
        cast(ReadsSpansInto, store.reader).read_spans_into(name, ranges, outs)
    except ShardloadError:
        raise
    except Exception as exc:
        raise _spans_error(store, name, chunks.tolist(), exc) from exc


def _spans_error(store: Store, name: str, chunks: Sequence[int], exc: Exception) -> ChunkReadError:
    listed = sorted(set(chunks))
    shown = ", ".join(map(str, listed[:8])) + (", ..." if len(listed) > 8 else "")
    return ChunkReadError(
        f"one of chunks {shown} ({len(listed)} chunks) of array {name!r} in "
        f"{store.url} could not be read: {type(exc).__name__}: {exc}"
    )


_READS_SPANS: dict[type, bool] = {}


def plans_requests(store: Store, names: Sequence[str]) -> bool:
    """True when the reader plans its own requests for a call's spans of some of ``names``:
    an npy stack by URL (``plans_requests``, formats/npy/url.py), a raw Zarr array by URL
    (``ZarrReader.ranged``, formats/zarr/ranges.py)."""
    if getattr(store.reader, "plans_requests", False):
        return True
    ranged = getattr(store.reader, "ranged", None)
    return callable(ranged) and any(ranged(n) is not None for n in names)


def _coalesces(store: Store, names: Sequence[str]) -> bool:
    """True when a reader of several spans per call reads some of ``names`` by URL from
    shards (a Zarr reader's direct layout by URL exists for sharded arrays only), or plans
    its requests itself (:func:`plans_requests`)."""
    if plans_requests(store, names):
        return True
    layout = getattr(store.reader, "layout", None)
    return callable(layout) and any(getattr(layout(n), "shard", None) for n in names)


def _reads_spans(reader: object) -> bool:
    """``isinstance(reader, ReadsSpansInto)``, once per reader class (as :func:`_reads_into`)."""
    cls = type(reader)
    got = _READS_SPANS.get(cls)
    if got is None:
        got = _READS_SPANS[cls] = isinstance(reader, ReadsSpansInto)
    return got


#: A pool task reads segments of about this many decoded bytes (whole segments, at least one):
#: a task per small chunk costs a future and a thread wake-up each (tens of microseconds
#: against a few hundred to decode a 200 KB chunk).
TASK_BYTES = 1 << 20

#: A reader that takes several spans per call (sharded Zarr: a shard opened once per call and
#: shard) gets tasks of up to this many bytes, but at least two per reader thread in a group:
#: a group's inner chunks lie all over a few shards, so a larger task opens each shard once
#: for more chunks (16 MiB tasks: 0.55-0.67 CPU s an epoch, 1 MiB: 0.68-1.01, in-process on
#: the 406 MB default store of benchmarks/bench_default_layout.py, 2026-11-27).
SPAN_TASK_BYTES = 16 << 20


def submit_segments(
    submit: Callable[..., Future[None]],
    store: Store,
    names: Sequence[str],
    g: Group,
    most: int,
    row_bytes: int,
    threads: int = 1,
) -> int:
    """Submit up to ``most`` of the group's next segments (at least one), as one task per array
    of about ``TASK_BYTES`` (``SPAN_TASK_BYTES`` at most, and a group in at least two tasks per
    one of the ``threads``, for readers of several spans per call); how many were submitted.
    By URL a task is one segment (a chunk's request), but for sharded Zarr arrays, whose calls
    coalesce near inner chunks and keep requests in flight of their own: their tasks are sized
    as for one thread per CPU."""
    i = g.submitted
    stop = min(g.segments, i + max(1, most))
    local = store.is_local
    task = TASK_BYTES if local else 0  # by URL: a request per task, all in flight
    spans_reader = _reads_spans(store.reader)
    if spans_reader and local:
        share = int(g.offsets[-1]) * row_bytes // (2 * max(1, threads))
        task = max(TASK_BYTES, min(SPAN_TASK_BYTES, share))
    elif spans_reader and _coalesces(store, names):
        # a sharded array by URL: one call per array for what is submitted (the group), which
        # plans its range requests over all of it and keeps them in flight itself
        # (formats/zarr/shard_fetch.py): a group split into tasks met each shard's chunks
        # too sparsely to share a request (about 6,000 requests an epoch of 8,192 chunks);
        # raw rows by URL (npy, raw Zarr) likewise, per chunk file (a request per piece before)
        task = int(g.offsets[-1]) * row_bytes
    # the task: segments i..j-1, whole ones, until their rows reach ``task`` bytes (at least one)
    want = int(g.offsets[i]) + -(-task // max(1, row_bytes))
    j = min(stop, max(i + 1, int(np.searchsorted(g.offsets, want, "left"))))
    at = g.offsets[i : j + 1].tolist()
    parts = list(pairwise(at))
    sp = g.spans
    if spans_reader and j - i > 1 and not (sp.ex[i:j] >= 0).any():  # ranges, read in one call
        first = sp.base[i:j] + sp.lo[i:j]
        last = first + (sp.hi[i:j] - sp.lo[i:j])
        ranges = list(zip(first.tolist(), last.tolist(), strict=True))
        chunks = sp.chunk[i:j]
        for name in names:
            buf = g.bufs[name]
            outs = [buf[a:b] for a, b in parts]
            g.futures.append(submit(read_ranges, store, name, chunks, ranges, outs))
    else:  # explicit rows (a resumed group), or a reader of one span a call
        segs = [sp.segment(k) for k in range(i, j)]
        for name in names:
            buf = g.bufs[name]
            outs = [buf[a:b] for a, b in parts]
            g.futures.append(submit(read_segments, store, name, segs, outs))
    g.submitted = j
    return j - i
