"""Raw Zarr chunks read by URL: a call's rows in few range requests per chunk file (issues 25
and 28).

A Zarr chunk file that shardload wrote without compression or shards is the chunk's rows,
C-ordered, row ``r`` at byte ``r * row_bytes`` (:class:`.chunks.ChunkLayout` with no Blosc
codec). By URL such a chunk is read as the local reader reads it: the rows asked for, by HTTP
range requests (``Range: bytes=a-b``), instead of the whole chunk through zarr-python. That is
what lets the loader plan pieces of chunks for a store read by URL as it does for the same
store on a disk (the same batches for the same seed, epoch and world: :mod:`shardload.load.kinds`).

The default load reads a shuffle group as many small pieces drawn from every chunk file; asked
for one request per piece, an epoch of a 2,000-row store of one 512 KB chunk file made 134
requests. So the loader hands a group's spans of an array to one call
(:meth:`RawUrlReads.read_spans_into`), which plans its requests per chunk file as an npy stack
by URL does (``formats/npy/url.py``, with the same constants): the pieces sorted by offset,
neighbours at most ``URL_GAP_BYTES`` (256 KiB) apart merged into one request of at most
``URL_RUN_BYTES`` (a group needing a dense share of a file fetches it in one span),
``URL_IN_FLIGHT`` requests in flight at most for all of a reader's calls together (memory: as
many answers of at most ``URL_RUN_BYTES``).

Checksums cover a whole stored file (:mod:`shardload.formats.checksums`), so a range cannot be
checked on its own. When ``verify`` asks for a chunk (by URL ``"auto"`` means the first time
each process reads it, as ``"first-epoch"``; ``"always"``: every read), the whole file is
fetched once per reader (the reader's other threads wanting it meanwhile wait for that check and
use its bytes; at most ``CHECK_BYTES`` of files at once), hashed and checked, and the rows asked
for are served from those bytes; it is kept for the later calls (the loader's later groups read
other pieces of it) within ``SHARDLOAD_URL_KEEP_BYTES`` per reader (64 MiB by default, the least
recently used dropped first; not with ``verify="always"``). Later range requests of a checked
file carry ``If-Match`` on the version checked (``move/pinned.py``). No row reaches a caller
from a file this process has not found to match its checksum (unless ``verify="never"``); a
short answer (a truncated file) and a missing file (an HTTP 404, never the fill value zarr
would serve) are errors naming the chunk.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.base import is_local
from shardload.formats.checksums import Verifier, digest
from shardload.formats.zarr.kept import keep_bytes
from shardload.move.retries import current_stop, stop_on

if TYPE_CHECKING:  # .chunks imports numcodecs: an npy stack by URL (its pieces, here) needs none
    from shardload.formats.zarr.chunks import ChunkLayout

#: Pieces with at most this many bytes between them share one request. A request costs about
#: as much as 1 MB more of its answer through ``shardload serve`` on loopback, one at a time;
#: but a default group's pieces (tens of KB) lie a few hundred KB apart in every file, so
#: 1 MiB merged nearly all of each file: 3 times the store's bytes fetched an epoch, slower
#: than a request per piece (docs/benchmarks.md, "raw rows by URL"). 256 KiB: 1.1 times.
URL_GAP_BYTES = 256 << 10
#: One request asks for at most this many bytes (and the memory a fetching thread holds).
URL_RUN_BYTES = 8 << 20
#: Bytes of chunk files fetched whole for their checks at once, per reader (each is held
#: until its pieces are copied out).
CHECK_BYTES = 256 << 20

#: one piece of a call: bytes [offset, offset + nbytes) of a chunk file into ``dst``
Piece = tuple[int, int, memoryview]


def plan_runs(pieces: Sequence[tuple[int, int]], *, gap_bytes: int, run_bytes: int) -> list:
    """The requests for byte ranges ``(offset, nbytes)`` of one file: ``(positions, start,
    end)``, positions in offset order, ranges at most ``gap_bytes`` apart in one request of at
    most ``run_bytes`` (one range at least).

    >>> plan_runs([(0, 100), (5000, 10), (100, 20)], gap_bytes=0, run_bytes=10**6)
    [([0, 2], 0, 120), ([1], 5000, 5010)]
    >>> plan_runs([(0, 100), (100, 20), (5000, 10)], gap_bytes=10**6, run_bytes=4000)
    [([0, 1], 0, 120), ([2], 5000, 5010)]
    """
    runs: list[tuple[list[int], int, int]] = []
    for q in sorted(range(len(pieces)), key=lambda q: pieces[q][0]):
        o, n = pieces[q]
        if runs:
            pos, start, last = runs[-1]
            if o <= last + gap_bytes and max(last, o + n) - start <= run_bytes:
                pos.append(q)
                runs[-1] = (pos, start, max(last, o + n))
                continue
        runs.append(([q], o, o + n))
    return runs


def raw_layout(
    root: str, name: str, info: Any, manifest: Any, read_small: Any
) -> ChunkLayout | None:
    """The layout of array ``info`` of a shardload store at ``root`` when its chunk files are raw
    rows (no codec but bytes, no shards), from its ``zarr.json`` (``read_small(path, what=)``);
    else None (zarr-python reads it, and reports a missing or damaged ``zarr.json``)."""
    from shardload.formats.zarr.chunks import plan_chunk_layout

    folder = f"{root.rstrip('/')}/{info.path}"
    try:
        meta = json.loads(read_small(f"{folder}/zarr.json", what=f"array {name!r}"))
    except (FileNotFoundError, ValueError):
        return None
    if not isinstance(meta, dict):
        return None
    layout = plan_chunk_layout(
        meta,
        folder=folder,
        dtype=np.dtype(info.dtype),
        shape=tuple(info.shape),
        chunk_bounds=manifest.chunk_bounds,
        strict=True,
    )
    return None if layout is None or layout.blosc else layout


class KeptFiles:
    """Checked files' bytes kept for a reader's later calls (its later groups read other pieces
    of them), the least recently used dropped beyond ``keep_bytes()``; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._files: OrderedDict[tuple[str, int], Any] = OrderedDict()  # least recent first
        self._bytes, self._max = 0, keep_bytes()

    def get(self, name: str, i: int) -> Any:
        """The kept bytes (``bytes`` or a read-only memoryview), or None."""
        with self._lock:
            data = self._files.get((name, i))
            if data is not None:
                self._files.move_to_end((name, i))
            return data

    def keep(self, name: str, i: int, data: Any) -> None:
        if len(data) > self._max:
            return
        with self._lock:
            if (name, i) in self._files:
                return
            self._files[(name, i)] = data
            self._bytes += len(data)
            while self._bytes > self._max:
                self._bytes -= len(self._files.popitem(last=False)[1])

    def clear(self) -> None:
        with self._lock:
            self._files.clear()
            self._bytes = 0


class RawUrlReads:
    """A Zarr reader's raw chunk files by URL: a call's spans in planned range requests, checked
    files kept (module docstring). One per reader."""

    def __init__(self, fs: Any, verifier: Verifier) -> None:
        self.fs, self.verifier = fs, verifier
        #: of all calls together (a local store's reader, which never calls, imports no fsspec)
        self._requests = threading.BoundedSemaphore(1 if is_local(fs) else _remote().URL_IN_FLIGHT)
        self._checking = ByteBudget(CHECK_BYTES)
        self.kept = KeptFiles()

    def read_spans_into(
        self,
        layout: ChunkLayout,
        name: str,
        spans: Sequence[tuple[int, int]],
        outs: Sequence[np.ndarray],
    ) -> None:
        """Rows ``[start, stop)`` of each span into its ``out`` (C-contiguous, of the layout's
        dtype): per chunk file, checked whole or in planned range requests."""
        from shardload.formats.zarr.chunks import row_parts

        rb = layout.row_bytes
        by_chunk: dict[int, list[Piece]] = {}
        for (start, stop), out in zip(spans, outs, strict=True):
            dst = out.reshape(-1).view(np.uint8).data
            for i, a, b, at in row_parts(start, stop, layout.chunk_rows):
                by_chunk.setdefault(i, []).append(
                    (a * rb, (b - a) * rb, dst[at * rb : (at + b - a) * rb])
                )
        if not by_chunk:
            return
        if len(by_chunk) == 1:  # one file: no thread to start (a single read)
            for run in self._plan(layout, name, *next(iter(by_chunk.items()))):
                self._fetch(layout, name, *run)
            return
        halt = current_stop()  # the loader's close ends these threads' retries too
        with ThreadPoolExecutor(_remote().URL_IN_FLIGHT) as pool:  # threads start as tasks wait

            def plan(item: tuple[int, list[Piece]]) -> list:
                with stop_on(halt):
                    return self._plan(layout, name, *item)

            def fetch(run: tuple) -> None:
                with stop_on(halt):
                    self._fetch(layout, name, *run)

            runs = [r for rs in pool.map(plan, list(by_chunk.items())) for r in rs]
            for _ in pool.map(fetch, runs):
                pass

    def _plan(self, layout: ChunkLayout, name: str, i: int, pieces: list[Piece]) -> list:
        """Chunk ``i``: its pieces copied from its checked bytes (no run left), or its runs
        ``(i, start, end, pieces)``."""
        always = self.verifier.enabled and self.verifier.mode == "always"
        whole = None if always else self.kept.get(name, i)
        if whole is None and self.verifier.needed(name, i):
            whole = self._checked_whole(layout, name, i)
        if whole is not None:
            _copy(self.fs, layout, name, i, pieces, memoryview(whole), 0)
            return []
        runs = plan_runs(
            [(o, n) for o, n, _ in pieces], gap_bytes=URL_GAP_BYTES, run_bytes=URL_RUN_BYTES
        )
        return [(i, start, end, [pieces[q] for q in pos]) for pos, start, end in runs]

    def clear(self) -> None:
        self.kept.clear()

    def _checked_whole(self, layout: ChunkLayout, name: str, i: int) -> memoryview | None:
        """Chunk file ``i`` fetched whole and checked, once per reader: a thread that waited
        for another's check gets its bytes (None: checked earlier, bytes gone)."""
        with self.verifier.unit_lock(name, i) as unit:
            if not self.verifier.needed(name, i):  # checked by a thread this one waited for,
                return unit.data if unit.data is not None else self.kept.get(name, i)  # or kept
            path = layout.chunk_path(i)
            with self._checking.take(layout.chunk_rows * layout.row_bytes), self._requests:
                whole = _get(self.fs, layout, name, i, None)
            self.verifier.check(name, i, digest(whole), path=_url(self.fs, path), what=f"chunk {i}")
            unit.data = whole
            if self.verifier.mode != "always":  # kept before the lock goes: a thread that
                self.kept.keep(name, i, whole)  # asked before this check ended finds them
            return whole

    def _fetch(
        self, layout: ChunkLayout, name: str, i: int, start: int, end: int, pieces: list[Piece]
    ) -> None:
        """One request: bytes [start, end) of chunk file ``i``, its pieces copied out."""
        with self._requests:
            data = _get(self.fs, layout, name, i, (start, end))
        _copy(self.fs, layout, name, i, pieces, memoryview(data), start)


def _remote() -> Any:
    """:mod:`shardload.move.remote`, imported when a store by URL is read (it imports fsspec)."""
    from shardload.move import remote

    return remote


def _url(fs: Any, path: str) -> str:
    return fs.unstrip_protocol(path) if hasattr(fs, "unstrip_protocol") else path


def _get(fs: Any, layout: ChunkLayout, name: str, i: int, span: tuple[int, int] | None) -> Any:
    """Chunk file ``i`` whole (``span`` None) or bytes ``span`` of it, as a read-only view (by
    URL a large answer read into one buffer as it arrives: ``move/pinned.py``); a missing file
    (an HTTP 404) named, never the fill value zarr would serve."""
    path, remote = layout.chunk_path(i), _remote()
    what = f"chunk {i} of array {name!r}"
    try:
        if isinstance(fs, remote.RemoteFileSystem):
            return fs.cat_file(path, *(span or (None, None)), what, view=True)
        return memoryview(remote.read_bytes(fs, path, *(span or (None, None)), what=what))
    except FileNotFoundError as exc:
        raise ChunkReadError(f"chunk {i} of array {name!r} is missing: {_url(fs, path)}") from exc


def _copy(
    fs: Any, layout: ChunkLayout, name: str, i: int, pieces: list[Piece], data: memoryview, at: int
) -> None:
    copy_pieces(pieces, data, at, i, name, lambda: _url(fs, layout.chunk_path(i)))


def copy_pieces(
    pieces: list[Piece], data: memoryview, at: int, i: int, name: str, where: Callable[[], str]
) -> None:
    """Each piece ``(offset, nbytes, dst)`` of chunk file ``i`` of array ``name`` from ``data``
    (the file's bytes from ``at``); a short answer is a truncated file, named by ``where()``."""
    for off, nbytes, dst in pieces:
        got = data[off - at : off - at + nbytes]
        if len(got) != nbytes:
            raise ChunkReadError(
                f"chunk {i} of array {name!r} is truncated or corrupt: {where()} "
                f"(expected {nbytes} bytes at offset {off}, got {len(got)})"
            )
        dst[:] = got


class ByteBudget:
    """At most ``most`` bytes taken at once (a single larger take waits for an empty budget)."""

    def __init__(self, most: int) -> None:
        self.most, self.used = most, 0
        self.cond = threading.Condition()

    @contextmanager
    def take(self, nbytes: int) -> Iterator[None]:
        with self.cond:
            self.cond.wait_for(lambda: self.used == 0 or self.used + nbytes <= self.most)
            self.used += nbytes
        try:
            yield
        finally:
            with self.cond:
                self.used -= nbytes
                self.cond.notify_all()
