"""Several row spans of a sharded Zarr v3 array in one call: each shard file opened once.

The default load reads a shuffle group as many whole inner chunks of a few rows, picked from
all over a few shards. Read one span at a time (:func:`.shards.read_shard_rows_into`), each
inner chunk costs a file open, a Python path with its error messages built and a short
``pread``: about 45-50 us of CPU per 50 KB inner chunk, twice what reading and decoding it
costs (docs/design.md, "Reading shards"). Here the spans of one call are sorted by shard; each
shard is opened once (never kept open across calls: a descriptor kept could be a reused one,
serving another file's bytes), its inner chunks sorted by offset, runs of adjacent chunks read
with one ``pread``, and each chunk Blosc-decoded straight into its destination rows. Error
messages are built only when a check fails, and then the same as the one-span path's.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from typing import Any

import numpy as np
from numcodecs import blosc

from shardload.errors import ChunkReadError
from shardload.formats.checksums import Verifier, digest, verify_file
from shardload.formats.zarr.chunks import ChunkLayout, decode_into, row_parts
from shardload.formats.zarr.shard_local import DECOMPRESS_CTX, read_whole_chunks
from shardload.formats.zarr.shards import (
    EMPTY,
    RangeFile,
    ShardIndexCache,
    _fileno,
    _pread_into,
    _read_inner_chunks,
    _scratch,
    shard_errors,
    shard_index,
)

#: Adjacent inner chunks are read with one ``pread`` up to this many bytes (the scratch
#: buffer a reader thread keeps): fewer system calls, each without the GIL.
RUN_BYTES = 1 << 20

_HEADER = struct.Struct("<III")  # a Blosc header's decoded, block and compressed sizes

#: one piece of a span: (inner chunk j of the shard, its rows [lo, hi), destination bytes)
Piece = tuple[int, int, int, memoryview]
#: bytes [start, end) of a shard file: a buffer and how many of its bytes were read
Fetch = Callable[[int, int], tuple[memoryview, int]]


def read_shard_spans_into(
    layout: ChunkLayout,
    name: str,
    spans: Sequence[tuple[int, int]],
    outs: Sequence[np.ndarray],
    verifier: Verifier | None = None,
    indexes: ShardIndexCache | None = None,
) -> None:
    """Rows ``[start, stop)`` of each span into its ``out`` (C-contiguous), shard by shard in
    the order the spans first touch them; each shard file checked against its checksum first
    when ``verifier`` asks for it, and opened once. Whole inner chunks of a local file (the
    default load's) take :func:`.shard_local.read_whole_chunks`: their per-chunk work in numpy."""
    if read_whole_chunks(layout, name, spans, outs, verifier, indexes, RUN_BYTES):
        return
    for k, pieces in pieces_by_shard(layout, spans, outs).items():
        _read_pieces(layout, name, k, pieces, verifier, indexes)


def pieces_by_shard(
    layout: ChunkLayout, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
) -> dict[int, list[Piece]]:
    """The pieces of each shard the spans touch, in the order the spans first touch them."""
    assert layout.shard is not None
    rb, rows = layout.row_bytes, layout.chunk_rows
    per_shard = rows * layout.shard.chunks
    by_shard: dict[int, list[Piece]] = {}
    for (start, stop), out in zip(spans, outs, strict=True):
        if stop <= start:
            continue
        dst = out.reshape(-1).view(np.uint8).data
        for k, a, b, at in row_parts(start, stop, per_shard):
            pieces = by_shard.setdefault(k, [])
            base = at * rb
            if a % rows == 0 and b - a == rows:  # one whole inner chunk (the default load's)
                pieces.append((a // rows, 0, rows, dst[base : base + rows * rb]))
                continue
            for j, lo, hi, at2 in row_parts(a, b, rows):
                p = base + at2 * rb
                pieces.append((j, lo, hi, dst[p : p + (hi - lo) * rb]))
    return by_shard


def _read_pieces(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    path = layout.chunk_path(k)
    check = verifier is not None and verifier.needed(name, k)
    if check and layout.opener is None:  # a local file: checked through mmap, then read
        assert verifier is not None
        verify_file(verifier, name, k, path, what=f"shard {k}")
    data = None
    if check and layout.opener is not None:  # by URL: fetched whole and checked once
        assert verifier is not None
        data = _checked_once(layout, verifier, name, k, path)
    _read_opened(layout, name, k, pieces, indexes, path, data)


def _checked_once(
    layout: ChunkLayout, verifier: Verifier, name: str, k: int, path: str
) -> memoryview | None:
    """By URL, shard ``k`` fetched whole and checked by one of the reader's threads while the
    others wanting it wait (:meth:`~shardload.formats.checksums.Verifier.unit_lock`): the
    checked bytes, for this thread and those that waited for them; None when it was checked
    before (read by ranges) or is a local copy (a whole-file cache's, checked as a file)."""
    with verifier.unit_lock(name, k) as unit:
        if not verifier.needed(name, k):
            return unit.data
        try:
            with layout.open(path) as f:
                if not isinstance(f, RangeFile):
                    verify_file(verifier, name, k, path, opener=layout.opener, what=f"shard {k}")
                    return None
                unit.data = _checked_bytes(verifier, name, k, path, f)
        except OSError as exc:  # as verify_file: missing or unreadable, strict or not
            raise ChunkReadError.from_os_error(exc, f"shard {k}", name, path) from exc
        return unit.data


def _read_opened(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    indexes: ShardIndexCache | None,
    path: str,
    data: memoryview | None,
) -> None:
    """The pieces of shard ``k``: from ``data`` (its checked bytes) or the file, opened once."""
    with (
        shard_errors(layout, name, k, path, (part for *_, part in pieces)),
        nullcontext(BufferFile(data)) if data is not None else layout.open(path) as f,
    ):
        fd = _fileno(f)
        index = shard_index(layout, name, k, path, f, fd, indexes)
        if layout.blosc and fd is not None:
            _read_runs(layout, name, k, pieces, index, path, _local_fetch(fd))
        else:  # raw inner chunks, or not a local file: the one-span path, piece by piece
            for j, lo, hi, part in pieces:
                a = j * layout.chunk_rows + lo
                _read_inner_chunks(layout, name, k, a, a + hi - lo, part, f, fd, index, path)


def _local_fetch(fd: int) -> Fetch:
    def fetch(start: int, end: int) -> tuple[memoryview, int]:
        buf = _scratch(end - start)
        return buf, _pread_into(None, fd, buf, start)

    return fetch


def _checked_bytes(verifier: Verifier, name: str, k: int, path: str, f: RangeFile) -> memoryview:
    """Shard ``k`` fetched whole (one request) and checked against its checksum: its bytes
    (a read-only view)."""
    data = f.whole()
    verifier.check(name, k, digest(data), path=path, what=f"shard {k}")
    return data


def _bytes_fetch(data: bytes | memoryview) -> Fetch:
    view = memoryview(data)  # no copy (a BytesIO's getbuffer would copy shared bytes)

    def fetch(start: int, end: int) -> tuple[memoryview, int]:
        buf = view[start:end]
        return buf, len(buf)

    return fetch


def _slices(buf: memoryview, got: int, at: int) -> Fetch:
    """Bytes [start, end) of a file out of ``buf``, its bytes [at, at + got)."""

    def fetch(start: int, end: int) -> tuple[memoryview, int]:
        view = buf[start - at : min(end, at + got) - at]
        return view, len(view)

    return fetch


def _from_kept(at: dict[int, bytes]) -> Fetch:
    """Kept chunks by their offset in the shard (each its own run)."""

    def fetch(start: int, end: int) -> tuple[memoryview, int]:
        data = memoryview(at[start])
        return data, len(data)

    return fetch


def _no_fetch(start: int, end: int) -> tuple[memoryview, int]:  # pragma: no cover - never called
    raise AssertionError("a never-written inner chunk is not fetched")


class BufferFile:
    """A read-only file over bytes already fetched (a shard's, for its index): no copy, as
    ``io.BytesIO`` makes of anything but ``bytes``."""

    def __init__(self, data: Any) -> None:
        self.view, self._pos = memoryview(data).cast("B"), 0
        self.size = len(self.view)

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos if whence == 0 else self.size + pos
        return self._pos

    def readinto(self, dst: Any) -> int:
        view = memoryview(dst).cast("B")
        got = self.view[self._pos : self._pos + len(view)]
        view[: len(got)] = got
        self._pos += len(got)
        return len(got)


def _read_runs(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    index: np.ndarray,
    path: str,
    fetch: Fetch,
    gap: int = 0,
) -> None:
    """Blosc inner chunks of shard ``k`` in offset order, runs of chunks (up to ``RUN_BYTES``
    each, with at most ``gap`` bytes between one and the next) read with one ``fetch`` each,
    each chunk decoded into its piece; a check that fails hands the chunk to
    :func:`.chunks.decode_into`, which raises the error naming it. By URL
    (:mod:`.shard_fetch`) ``fetch`` slices bytes already fetched: ``gap`` > 0 lets runs span
    up to ``gap`` bytes (one fetched request, or a checked whole shard), -1 reads each chunk
    alone."""
    assert layout.shard is not None
    js = np.fromiter((p[0] for p in pieces), np.int64, len(pieces))
    offs, sizes = index[js, 0], index[js, 1]
    order = np.argsort(offs, kind="stable").tolist()
    offs_l, sizes_l = offs.tolist(), sizes.tolist()
    full = layout.chunk_rows * layout.row_bytes
    typesizes, shuffle = layout.blosc_header  # as decode_into checks them
    run_max = max(RUN_BYTES, gap)
    runs: list[tuple[int, int, int, int]] = []  # order[i:m]: one fetch of bytes [start, end)
    n, i = len(order), 0
    while i < n:
        first = order[i]
        start = offs_l[first]
        if start == EMPTY:  # never written (checked with the index): the fill value
            np.frombuffer(pieces[first][3], dtype=layout.dtype)[...] = layout.fill_value
            i += 1
            continue
        end, m = start + sizes_l[first], i + 1
        while m < n:  # the run: chunks that start where the last one ends (or within gap)
            q = order[m]
            q_end = offs_l[q] + sizes_l[q]
            if offs_l[q] > end + gap or max(end, q_end) - start > run_max:
                break
            end = max(end, q_end)
            m += 1
        runs.append((i, m, start, end))
        i = m
    fetched = (fetch(r[2], r[3]) for r in runs)
    if not layout.blosc:  # raw inner chunks (compression auto or none): their rows copied
        _copy_raw(layout, name, k, pieces, order, offs_l, sizes_l, path, runs, fetched)
        return
    rows, unpack, decompress = layout.chunk_rows, _HEADER.unpack_from, blosc.decompress
    ctx, address, of = DECOMPRESS_CTX, ctypes.addressof, ctypes.c_char.from_buffer
    for (i, m, start, _), (buf, got) in zip(runs, fetched, strict=True):
        base = np.frombuffer(buf, np.uint8).ctypes.data if ctx is not None and got else 0
        for q in order[i:m]:
            j, lo, hi, part = pieces[q]
            a, size = offs_l[q] - start, sizes_l[q]
            raw = buf[a : a + size]
            if a + size > got:
                raise ChunkReadError(
                    f"{_what(layout, k, j)} of array {name!r} is truncated: {path} "
                    f"(expected {size} bytes at offset {offs_l[q]}, got {max(0, got - a)})"
                )
            if lo == 0 and hi == rows and size >= 16:
                nbytes, _, cbytes = unpack(raw, 4)
                ok = cbytes == size and nbytes == full and raw[3] in typesizes
                if ok and shuffle in (-1, raw[2] & 5):
                    if ctx is not None:  # c-blosc straight into the piece, without the GIL
                        if ctx(base + a, address(of(part)), full, 1) == full:
                            continue
                    else:
                        try:
                            # into numcodecs' own buffer, then copied: given a destination,
                            # numcodecs checks it in Python (``ensure_contiguous_ndarray``,
                            # about 5 us holding the GIL, as long as decoding a 12 KB chunk)
                            part[:] = decompress(raw)
                            continue
                        except Exception:  # decode_into below raises the error naming it
                            pass
            what = _what(layout, k, j)  # built only here: an f-string per chunk costs
            decode_into(layout, raw, lo, hi, part, name=name, what=what, path=path)


def _copy_raw(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    order: list[int],
    offs_l: list[int],
    sizes_l: list[int],
    path: str,
    runs: list[tuple[int, int, int, int]],
    fetched: Any,
) -> None:
    """:func:`_read_runs` for raw inner chunks: each exactly its rows' bytes (else corrupt), the
    piece's rows copied out of the fetched bytes."""
    rb = layout.row_bytes
    full = layout.chunk_rows * rb
    for (i, m, start, _), (buf, got) in zip(runs, fetched, strict=True):
        for q in order[i:m]:
            j, lo, hi, part = pieces[q]
            a, size = offs_l[q] - start, sizes_l[q]
            if size != full:
                raise ChunkReadError(
                    f"{_what(layout, k, j)} of array {name!r} is corrupt: {path}: the shard's "
                    f"index says {size} bytes, {layout.chunk_rows} rows are {full}"
                )
            if a + size > got:
                raise ChunkReadError(
                    f"{_what(layout, k, j)} of array {name!r} is truncated: {path} "
                    f"(expected {size} bytes at offset {offs_l[q]}, got {max(0, got - a)})"
                )
            part[:] = buf[a + lo * rb : a + hi * rb]


def _what(layout: ChunkLayout, k: int, j: int) -> str:
    """How errors name inner chunk ``j`` of shard ``k``."""
    assert layout.shard is not None
    return f"chunk {k * layout.shard.chunks + j} (inner chunk {j} of shard {k})"


def read_spans_into(
    layout: ChunkLayout,
    name: str,
    spans: Sequence[tuple[int, int]],
    outs: Sequence[np.ndarray],
    verifier: Verifier | None,
    indexes: Any,
) -> None:
    """Several spans of an array in one call: sharded layouts as above, others span by span."""
    if layout.shard is not None:
        read_shard_spans_into(layout, name, spans, outs, verifier, indexes)
        return
    from shardload.formats.zarr.rows import read_rows_into

    for (start, stop), out in zip(spans, outs, strict=True):
        read_rows_into(layout, name, start, stop, out, verifier, indexes)
