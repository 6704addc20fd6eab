"""Rows of a Zarr v3 array read straight into the caller's buffer: chunk files here, shards
through :mod:`.shards` (the layouts :func:`.chunks.plan_chunk_layout` accepts). Chunks that
cut a row along another axis too (:class:`.chunks.BlockSplit`) are decoded whole into a
reused scratch buffer and copied into their slice of the rows."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.base import readinto_full
from shardload.formats.checksums import Verifier, digest, verify_file
from shardload.formats.copies import CopyOpener, keeps_maps, open_copy_checked
from shardload.formats.copy_maps import map_copy, unmap
from shardload.formats.zarr.chunks import (
    ChunkLayout,
    decode_into,
    read_whole,
    row_parts,
)
from shardload.formats.zarr.shards import read_shard_rows_into


def read_rows_into(
    layout: ChunkLayout,
    name: str,
    start: int,
    stop: int,
    out: np.ndarray,
    verifier: Verifier | None = None,
    indexes: Any = None,
) -> None:
    """Rows ``[start, stop)`` into ``out`` (C-contiguous, ``stop - start`` rows), chunk by chunk;
    each chunk (or shard) checked against its checksum first when ``verifier`` asks for it.
    ``indexes``: a :class:`.shards.ShardIndexCache` of a sharded layout's parsed indexes
    (default: each shard's index read anew); sharded layouts go to :mod:`.shards`."""
    if stop <= start:
        return
    if layout.shard is not None:
        read_shard_rows_into(layout, name, start, stop, out, verifier, indexes)
        return
    if layout.split is not None:
        _read_split_rows_into(layout, name, start, stop, out)
        return
    dst = out.reshape(-1).view(np.uint8).data
    rb = layout.row_bytes
    for i, a, b, at in row_parts(start, stop, layout.chunk_rows):
        _read_chunk_part(layout, name, i, a, b, dst[at * rb : (at + b - a) * rb], verifier)


_BLOCKS = threading.local()


def _read_split_rows_into(
    layout: ChunkLayout, name: str, start: int, stop: int, out: np.ndarray
) -> None:
    """Rows ``[start, stop)`` of an array whose chunks cut rows along ``layout.split.axis``:
    every block of every chunk decoded whole (the same checks and errors as a chunk's, a
    block never written read as the fill value) into this thread's scratch buffer, then its
    rows and its real indices along the axis copied into place. Plain Zarr only: no checksums
    (the reader plans splits for plain Zarr only)."""
    split = layout.split
    assert split is not None
    rows = layout.chunk_rows
    shape = (rows, *split.chunk_row_shape)
    # one block's rows as a plain layout: the reads, checks and errors of a whole chunk
    block = dataclasses.replace(
        layout,
        row_bytes=int(np.prod(split.chunk_row_shape, dtype=np.int64)) * layout.dtype.itemsize,
        split=None,
    )
    nbytes = rows * block.row_bytes
    buf = getattr(_BLOCKS, "buf", None)
    if buf is None or buf.nbytes < nbytes:
        buf = _BLOCKS.buf = np.empty(nbytes, np.uint8)
    scratch = buf[:nbytes].view(layout.dtype).reshape(shape)
    dst = out.reshape(stop - start, *split.row_shape)
    lead = (slice(None),) * split.axis
    for i, a, b, at in row_parts(start, stop, rows):
        for j in range(split.count):
            where, real = split.where(j)
            part = scratch[a:b]
            dst_bytes = part.reshape(-1).view(np.uint8).data
            _read_chunk_part(block, name, i, a, b, dst_bytes, path=layout.chunk_path(i, j))
            dst[(slice(at, at + b - a), *lead[1:], where)] = part[(*lead, slice(0, real))]


def _read_chunk_part(
    layout: ChunkLayout,
    name: str,
    i: int,
    a: int,
    b: int,
    dst: memoryview,
    verifier: Verifier | None = None,
    *,
    path: str | None = None,
) -> None:
    path = layout.chunk_path(i) if path is None else path
    rb = layout.row_bytes
    local = path if layout.opener is None else None
    check = verifier is not None and verifier.needed(name, i, local)
    copy = check and isinstance(layout.opener, CopyOpener)  # checked by its record, as opened
    check = check and not copy
    what = f"chunk {i}"
    mapped = None  # a node cache copy's mapping, decoded in place (formats/copies.py)
    try:
        with (
            open_copy_checked(layout.opener, verifier, name, i, path, what=what)
            if copy
            else layout.open(path)
        ) as f:
            if not layout.blosc:
                if check:
                    assert verifier is not None
                    verify_file(verifier, name, i, path, opener=layout.opener, what=what)
                f.seek(a * rb)
                got = readinto_full(f, dst)
                if got != len(dst):
                    raise ChunkReadError(
                        f"chunk {i} of array {name!r} is truncated or corrupt: {path} (expected "
                        f"{len(dst)} bytes at offset {a * rb}, got {got})"
                    )
                return
            if isinstance(layout.opener, CopyOpener):
                mapped = map_copy(f, keep=keeps_maps(layout.opener.fs))
            raw = read_whole(f) if mapped is None else memoryview(mapped[0])
    except FileNotFoundError as exc:
        if layout.strict:
            raise ChunkReadError(f"chunk {i} of array {name!r} is missing: {path}") from exc
        np.frombuffer(dst, dtype=layout.dtype)[...] = layout.fill_value
        return
    except OSError as exc:
        raise ChunkReadError(
            f"chunk {i} of array {name!r} could not be read: {path}: {exc}"
        ) from exc
    # Blosc trusts its header: check it against the file before decoding into our buffer
    if check:  # the compressed bytes are in memory already: hashing them costs little
        assert verifier is not None
        try:
            verifier.check(name, i, digest(raw), path=path, what=what)
        except ChunkReadError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"chunk {i} of array {name!r} is truncated or corrupt (Blosc): {path}: {exc}"
            ) from exc
    try:
        decode_into(layout, raw, a, b, dst, name=name, what=what, path=path)
    finally:
        if mapped is not None:
            unmap(mapped, raw)
