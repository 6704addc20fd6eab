"""An npy stack read by URL: a call's rows in few range requests per chunk file, in flight
together (issue 28).

The default load of raw rows reads a shuffle group as many small pieces of rows drawn from
every chunk file; asked for one at a time, an epoch of a 16,384-row npy store of 7 files made
about 1,200 requests by URL (202 per file, a size query and a header read per file and
thread besides, docs/benchmarks.md). So the loader hands a group's spans of an array to one
call (:meth:`NpyUrlReader.read_spans_into`), which plans its requests per chunk file as
``formats/zarr/shard_fetch.py`` does per shard: the pieces sorted by offset, neighbours at
most ``URL_GAP_BYTES`` (256 KiB, ``formats/zarr/ranges.py``) apart merged into one request
of at most ``URL_RUN_BYTES``, and
``URL_IN_FLIGHT`` requests in flight at most for all of a reader's calls together.

A chunk file whose checksum must still be checked is fetched whole, once per reader (the
reader's other threads wanting it meanwhile wait for that check and use its bytes; at most
``CHECK_BYTES`` of files at once); its header and pieces are then read from those
bytes, and it is kept for the later calls (the loader's later groups, which read other pieces
of it) within ``SHARDLOAD_URL_KEEP_BYTES`` per reader (64 MiB by default, as a sharded Zarr
store's kept chunks, ``formats/zarr/kept.py``; the least recently used dropped first; not with
``verify="always"``, which checks a file at each read). Otherwise a file's header (checked against the manifest before any of its bytes are trusted) is one small
range request, once per reader. Every check of the local reader holds: the header against the
manifest, a short answer (a truncated file) named by its chunk, a missing file named.
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, StoreError
from shardload.formats.base import RawChunk
from shardload.formats.checksums import DEFAULT_VERIFY, digest
from shardload.formats.copies import is_cached
from shardload.formats.npy import cached
from shardload.formats.npy.read import NpyReader, _header_len
from shardload.formats.zarr.ranges import (
    CHECK_BYTES,
    URL_GAP_BYTES,
    URL_RUN_BYTES,
    ByteBudget,
    KeptFiles,
    Piece,
    copy_pieces,
    plan_runs,
)
from shardload.manifest.core import Manifest
from shardload.move.remote import URL_IN_FLIGHT, read_bytes, read_many
from shardload.move.retries import current_stop, stop_on

#: Bytes asked for a chunk file's header (numpy writes 128; more are fetched when it says so,
#: up to ``MAX_HEADER_BYTES``: a damaged length field asks for no more than that).
HEADER_BYTES = 4096
MAX_HEADER_BYTES = 1 << 20


def open_reader(
    fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
) -> NpyUrlReader:
    """The reader of an npy stack by URL (``formats/registry.py``: ``url=True``)."""
    return NpyUrlReader(fs, root, manifest, verify=verify)


class NpyUrlReader(NpyReader):
    """An npy stack by URL: a call's spans in planned range requests (module docstring)."""

    #: the loader hands this reader a group's spans of an array in one call (load/reader.py)
    plans_requests = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._requests = threading.BoundedSemaphore(URL_IN_FLIGHT)  # of all calls together
        self._checking = ByteBudget(CHECK_BYTES)
        self._header_lock = threading.Lock()  # guards the headers' offsets
        #: checked files kept whole for later calls (module docstring)
        self.kept = KeptFiles()
        #: the last chunk headers checked by :meth:`check_metadata` (for a worker's reader)
        self._carried: dict[str, bytes] = {}

    def check_metadata(self, where: str) -> None:
        """As :meth:`NpyReader.check_metadata`, with each array's last chunk header and the
        checksum file fetched in one batch of requests (one round trip, not one per file);
        none for a header another process's reader carried here (:meth:`take_metadata`),
        checked the same way."""
        heads = self._heads()
        sums = self.verifier.sums_path()
        todo = [p for p in heads if p not in self._carried]
        got: dict[str, bytes | BaseException] = {**self._carried}
        got.update(
            read_many(
                self.fs,
                [*todo, *([sums] if sums else [])],
                what={p: f"chunk {i} of array {k!r}" for p, (k, i) in heads.items()},
                ranges={p: (0, HEADER_BYTES) for p in todo},
            )
        )
        if sums is not None and isinstance(raw := got[sums], bytes):
            self.verifier.take_sums(raw)
        for path, (name, i) in heads.items():
            data = got[path]
            try:
                if isinstance(data, FileNotFoundError):
                    continue  # left to the read that needs it
                if isinstance(data, BaseException):
                    raise data
                self._offsets[(name, i)] = offset = self._parse_header(name, i, data)
                if len(data) >= offset:  # the header's bytes, for a worker's reader
                    self._carried[path] = bytes(data[:offset])
            except ChunkReadError as exc:
                raise StoreError(
                    f"{where} and the files of array {name!r} disagree: {exc}"
                ) from exc

    def _heads(self) -> dict[str, tuple[str, int]]:
        """The last chunk file of each fixed array (its header is the arrays' metadata)."""
        n = self.manifest.num_chunks
        fixed = [k for k, a in self.manifest.arrays.items() if not a.is_ragged and n]
        return {self.path(k, n - 1): (k, n - 1) for k in fixed}

    def carried_metadata(self) -> dict[str, bytes]:
        """The last chunk headers this reader fetched and checked (a dict copy: a forked child
        reads it from the parent's reader without a lock)."""
        return self._carried.copy()

    def take_metadata(self, carried: Mapping[str, bytes]) -> None:
        """Keep another process's :meth:`carried_metadata`: :meth:`check_metadata` checks
        those headers against the manifest as if it had fetched them, and fetches none."""
        heads = self._heads()
        self._carried.update(
            {p: d for p, d in carried.items() if p in heads and isinstance(d, bytes)}
        )

    def _parse_header(self, name: str, i: int, data: bytes) -> int:
        """Chunk ``i``'s data offset from the first bytes of its file (fetching the rest of
        a header longer than ``data``), the header checked against the manifest."""
        path = self.path(name, i)
        if len(data) >= 10 and data[6:7] != b"\x01":  # npy 2.0/3.0: a 4-byte header length
            need = 12 + int.from_bytes(data[8:12], "little") if len(data) >= 12 else 12
        else:
            need = 10 + int.from_bytes(data[8:10], "little") if len(data) >= 10 else 10
        if data[:6] == b"\x93NUMPY" and len(data) < need <= MAX_HEADER_BYTES:
            with self._requests:
                data = read_bytes(self.fs, path, 0, need, what=f"chunk {i} of array {name!r}")
        info = self.manifest.arrays[name]
        c0, c1 = self.manifest.chunk_range(i)
        want = (np.dtype(info.dtype), False, (c1 - c0, *info.row_shape))
        return _header_len(io.BytesIO(data), path, want, f"chunk {i} of {name!r}")

    def _data_offset(self, name: str, i: int) -> int:
        """Where chunk ``i``'s rows start in its file: its header fetched (one small range
        request, no size query) and checked, once per reader."""
        key = (name, i)
        if key not in self._offsets:
            path = self.path(name, i)
            try:
                with self._requests:
                    data = read_bytes(
                        self.fs, path, 0, HEADER_BYTES, what=f"chunk {i} of array {name!r}"
                    )
            except OSError as exc:
                raise ChunkReadError.from_os_error(exc, f"chunk {i}", name, path) from exc
            offset = self._parse_header(name, i, data)
            with self._header_lock:
                self._offsets.setdefault(key, offset)
        return self._offsets[key]

    def cached_raw_chunk(self, name: str, i: int) -> RawChunk | None:
        """Chunk ``i`` as raw rows of its node cache copy (``formats/npy/cached.py``), or None
        (no ``cache_dir``, or a ragged array). No I/O until the chunk is opened."""
        if not is_cached(self.fs) or self.manifest.arrays[name].is_ragged:
            return None
        return cached.raw_chunk(self, name, i)

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        self.read_spans_into(name, [(start, stop)], [out])

    def read_spans_into(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None:
        """Rows ``[start, stop)`` of each span into its ``out``, in the requests planned per
        chunk file (module docstring); an ``out`` that is not C-contiguous, or of another
        dtype, is filled from a buffer of the array's own (bytes are copied as stored)."""
        dtype = np.dtype(self.manifest.arrays[name].dtype)
        direct = [o.flags.c_contiguous and o.dtype == dtype for o in outs]
        bufs = [o if ok else np.empty(o.shape, dtype) for o, ok in zip(outs, direct, strict=True)]
        self._read_spans(name, spans, bufs)
        for out, buf, ok in zip(outs, bufs, direct, strict=True):
            if not ok:
                out[...] = buf

    def _read_spans(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None:
        by_chunk = self._pieces(name, spans, outs)
        if not by_chunk:
            return
        stop = current_stop()  # the loader's close ends these threads' retries too
        with ThreadPoolExecutor(URL_IN_FLIGHT) as pool:  # threads start as tasks wait

            def plan(i: int) -> list:
                with stop_on(stop):
                    return self._plan_chunk(name, i, by_chunk[i])

            def fetch(run: tuple) -> None:
                with stop_on(stop):
                    self._fetch_run(name, *run)

            runs = [r for rs in pool.map(plan, list(by_chunk)) for r in rs]
            for _ in pool.map(fetch, runs):
                pass

    def _pieces(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> dict[int, list[tuple[int, int, memoryview]]]:
        """The spans cut at chunk bounds: per chunk, ``(first row, rows, dst)`` of each piece
        (rows counted within the chunk)."""
        row_bytes = self._row_bytes(name)
        by_chunk: dict[int, list[tuple[int, int, memoryview]]] = {}
        for (start, stop), out in zip(spans, outs, strict=True):
            if stop <= start:
                continue
            dst = out.reshape(-1).view(np.uint8).data
            i = int(np.searchsorted(self.bounds, start, side="right") - 1)
            pos = start
            while pos < stop:
                c0, c1 = int(self.bounds[i]), int(self.bounds[i + 1])
                a, b = pos - c0, min(stop, c1) - c0
                at = (pos - start) * row_bytes
                by_chunk.setdefault(i, []).append((a, b - a, dst[at : at + (b - a) * row_bytes]))
                pos += b - a
                i += 1
        return by_chunk

    def _row_bytes(self, name: str) -> int:
        info = self.manifest.arrays[name]
        return int(np.prod(info.row_shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize

    def _plan_chunk(self, name: str, i: int, pieces: list[tuple[int, int, memoryview]]) -> list:
        """Chunk ``i``: checked whole and its pieces copied from those bytes (no run left), or
        its runs ``(i, start, end, pieces)``."""
        always = self.verifier.enabled and self.verifier.mode == "always"
        whole = None if always else self.kept.get(name, i)
        if whole is None and self.verifier.needed(name, i):
            whole = self._checked_whole(name, i)
        if whole is not None:
            offset = self._offsets.get((name, i))
            if offset is None:
                offset = self._parse_header(name, i, whole)
                with self._header_lock:
                    self._offsets.setdefault((name, i), offset)
            placed = [(offset + a * self._row_bytes(name), len(d), d) for a, _, d in pieces]
            self._copy(name, i, placed, memoryview(whole), 0)
            return []
        offset = self._data_offset(name, i)
        row_bytes = self._row_bytes(name)
        placed = [(offset + a * row_bytes, len(dst), dst) for a, _, dst in pieces]
        runs = plan_runs(
            [(o, n) for o, n, _ in placed], gap_bytes=URL_GAP_BYTES, run_bytes=URL_RUN_BYTES
        )
        return [(i, start, end, [placed[q] for q in pos]) for pos, start, end in runs]

    def close(self) -> None:
        super().close()
        self.kept.clear()

    def _checked_whole(self, name: str, i: int) -> bytes | None:
        """Chunk file ``i`` fetched whole and checked, once per reader: a thread that waited
        for another's check gets its bytes (None: checked earlier, bytes gone)."""
        with self.verifier.unit_lock(name, i) as unit:
            if not self.verifier.needed(name, i):  # checked by a thread this one waited for,
                return unit.data if unit.data is not None else self.kept.get(name, i)  # or kept
            path = self.path(name, i)
            c0, c1 = self.manifest.chunk_range(i)
            try:
                with self._checking.take((c1 - c0) * self._row_bytes(name)), self._requests:
                    whole = read_bytes(self.fs, path, what=f"chunk {i} of array {name!r}")
            except OSError as exc:
                raise ChunkReadError.from_os_error(exc, f"chunk {i}", name, path) from exc
            self.verifier.check(name, i, digest(whole), path=path, what=f"chunk {i}")
            unit.data = whole
            if self.verifier.mode != "always":  # kept before the lock goes: a thread that
                self.kept.keep(name, i, whole)  # asked before this check ended finds them
            return whole

    def _fetch_run(self, name: str, i: int, start: int, end: int, placed: list[Piece]) -> None:
        """One request: bytes [start, end) of chunk file ``i``, its pieces copied out."""
        path = self.path(name, i)
        try:
            with self._requests:
                data = read_bytes(self.fs, path, start, end, what=f"chunk {i} of array {name!r}")
        except OSError as exc:
            raise ChunkReadError.from_os_error(exc, f"chunk {i}", name, path) from exc
        self._copy(name, i, placed, memoryview(data), start)

    def _copy(self, name: str, i: int, placed: list[Piece], data: memoryview, at: int) -> None:
        copy_pieces(placed, data, at, i, name, lambda: self.path(name, i))
