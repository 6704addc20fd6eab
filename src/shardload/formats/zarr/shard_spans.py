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

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
from numcodecs import blosc

from shardload.errors import ChunkReadError
from shardload.formats.checksums import Verifier
from shardload.formats.zarr.chunks import ChunkLayout, decode_into, row_parts, verify_file
from shardload.formats.zarr.shards import (
    EMPTY,
    ShardIndexCache,
    _fileno,
    _pread_into,
    _read_index,
    _read_inner_chunks,
    _scratch,
)

#: Adjacent inner chunks are read with one ``pread`` up to this many bytes (the scratch
#: buffer a reader thread keeps): fewer system calls, each without the GIL.
RUN_BYTES = 1 << 20

_HEADER = struct.Struct("<III")  # a Blosc header's decoded, block and compressed sizes

#: one piece of a span: (inner chunk j of the shard, its rows [lo, hi), destination bytes)
Piece = tuple[int, int, int, memoryview]


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
    when ``verifier`` asks for it, and opened once."""
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
    for k, pieces in by_shard.items():
        _read_pieces(layout, name, k, pieces, verifier, indexes)


def _read_pieces(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    path = layout.chunk_path(k)
    if verifier is not None and verifier.needed(name, k):
        verify_file(verifier, name, k, path, opener=layout.opener, what=f"shard {k}")
    try:
        with layout.open(path) as f:
            fd = _fileno(f)
            index = indexes.get(path) if indexes is not None else None
            if index is None:
                index = _read_index(layout, name, k, path, f, fd)
                if indexes is not None:
                    indexes.put(path, index)
            if layout.blosc and fd is not None:
                _read_runs(layout, name, k, pieces, fd, index, path)
            else:  # raw inner chunks, or not a local file: the one-span path, piece by piece
                for j, lo, hi, part in pieces:
                    a = j * layout.chunk_rows + lo
                    _read_inner_chunks(layout, name, k, a, a + hi - lo, part, f, fd, index, path)
    except FileNotFoundError as exc:
        if layout.strict:
            raise ChunkReadError(f"shard {k} of array {name!r} is missing: {path}") from exc
        for *_, part in pieces:
            np.frombuffer(part, dtype=layout.dtype)[...] = layout.fill_value
    except OSError as exc:
        raise ChunkReadError(
            f"shard {k} of array {name!r} could not be read: {path}: {exc}"
        ) from exc


def _read_runs(
    layout: ChunkLayout,
    name: str,
    k: int,
    pieces: list[Piece],
    fd: int,
    index: np.ndarray,
    path: str,
) -> None:
    """Blosc inner chunks of shard ``k`` (open as ``fd``) in offset order, runs of adjacent
    chunks (up to ``RUN_BYTES``) read with one ``pread`` each, each chunk decoded into its
    piece; a check that fails hands the chunk to :func:`.chunks.decode_into`, which raises
    the error naming it."""
    assert layout.shard is not None
    js = np.fromiter((p[0] for p in pieces), np.int64, len(pieces))
    offs, sizes = index[js, 0], index[js, 1]
    order = np.argsort(offs, kind="stable").tolist()
    offs_l, sizes_l = offs.tolist(), sizes.tolist()
    full = layout.chunk_rows * layout.row_bytes
    typesizes = (1, layout.dtype.itemsize)
    n, i = len(order), 0
    while i < n:
        first = order[i]
        start = offs_l[first]
        if start == EMPTY:  # never written (checked with the index): the fill value
            np.frombuffer(pieces[first][3], dtype=layout.dtype)[...] = layout.fill_value
            i += 1
            continue
        end, m = start + sizes_l[first], i + 1
        while m < n:  # the run: chunks that start where the last one ends
            q = order[m]
            if offs_l[q] != end or end + sizes_l[q] - start > RUN_BYTES:
                break
            end += sizes_l[q]
            m += 1
        buf = _scratch(end - start)
        got = _pread_into(None, fd, buf, start)
        for q in order[i:m]:
            j, lo, hi, part = pieces[q]
            a, size = offs_l[q] - start, sizes_l[q]
            raw = buf[a : a + size]
            if a + size > got:
                what = f"chunk {k * layout.shard.chunks + j} (inner chunk {j} of shard {k})"
                raise ChunkReadError(
                    f"{what} of array {name!r} is truncated: {path} (expected {size} bytes "
                    f"at offset {offs_l[q]}, got {max(0, got - a)})"
                )
            if lo == 0 and hi == layout.chunk_rows and size >= 16:
                nbytes, _, cbytes = _HEADER.unpack_from(raw, 4)
                if cbytes == size and nbytes == full and raw[3] in typesizes:
                    try:
                        blosc.decompress(raw, part)  # in C, without the GIL
                        continue
                    except Exception:  # decode_into below raises the error naming it
                        pass
            what = f"chunk {k * layout.shard.chunks + j} (inner chunk {j} of shard {k})"
            decode_into(layout, raw, lo, hi, part, name=name, what=what, path=path)
        i = m


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
