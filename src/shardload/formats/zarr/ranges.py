"""Raw Zarr chunks read by URL: the rows of a piece of a chunk in one ranged request.

A Zarr chunk file that shardload wrote without compression or shards is the chunk's rows,
C-ordered, row ``r`` at byte ``r * row_bytes`` (:class:`.chunks.ChunkLayout` with no Blosc
codec). By URL such a chunk is read as the local reader reads it: the rows asked for, one HTTP
range request (``Range: bytes=a-b``) per chunk they touch, instead of the whole chunk through
zarr-python. That is what lets the loader plan pieces of chunks for a store read by URL as it
does for the same store on a disk (the same batches for the same seed, epoch and world:
:mod:`shardload.load.kinds`).

Checksums cover a whole stored file (:mod:`shardload.formats.checksums`), so a range cannot be
checked on its own. When ``verify`` asks for a chunk (by URL ``"auto"`` means the first time
each process reads it, as ``"first-epoch"``; ``"always"``: every read), the whole file is
fetched once, hashed and checked, and the rows asked for are served from those same bytes;
the process's later reads of that chunk fetch only their rows. No row reaches a caller from a
file this process has not found to match its checksum (unless ``verify="never"``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.checksums import Verifier, digest
from shardload.formats.zarr.chunks import ChunkLayout, row_parts


def fetch_rows_into(
    fs: Any,
    layout: ChunkLayout,
    name: str,
    start: int,
    stop: int,
    out: np.ndarray,
    verifier: Verifier | None = None,
) -> None:
    """Rows ``[start, stop)`` of a raw array into ``out`` (C-contiguous, ``stop - start``
    rows), one ranged read per chunk they touch (or the whole chunk, checked, when
    ``verifier`` asks for it first)."""
    if stop <= start:
        return
    dst = out.reshape(-1).view(np.uint8).data
    rb = layout.row_bytes
    for i, a, b, at in row_parts(start, stop, layout.chunk_rows):
        _fetch_chunk_part(fs, layout, name, i, a, b, dst[at * rb : (at + b - a) * rb], verifier)


def _fetch_chunk_part(
    fs: Any,
    layout: ChunkLayout,
    name: str,
    i: int,
    a: int,
    b: int,
    dst: memoryview,
    verifier: Verifier | None,
) -> None:
    from shardload.move.remote import read_bytes

    path = layout.chunk_path(i)
    url = fs.unstrip_protocol(path) if hasattr(fs, "unstrip_protocol") else path
    rb = layout.row_bytes
    what = f"chunk {i} of array {name!r}"
    try:
        if verifier is not None and verifier.needed(name, i):
            whole = read_bytes(fs, path, what=what)
            verifier.check(name, i, digest(whole), path=url, what=f"chunk {i}")
            raw: Any = memoryview(whole)[a * rb : b * rb]
        else:
            raw = read_bytes(fs, path, a * rb, b * rb, what=what)
    except FileNotFoundError as exc:  # an HTTP 404: never the fill value zarr would serve
        raise ChunkReadError(f"chunk {i} of array {name!r} is missing: {url}") from exc
    if len(raw) != len(dst):
        raise ChunkReadError(
            f"chunk {i} of array {name!r} is truncated or corrupt: {url} (expected {len(dst)} "
            f"bytes at offset {a * rb}, got {len(raw)})"
        )
    dst[:] = raw
