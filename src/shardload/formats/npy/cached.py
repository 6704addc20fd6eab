"""An npy stack read through the node cache: rows read in place from the cached copies.

A store opened with ``cache_dir`` is read by URL (``formats/npy/url.py``), every file through
the node cache (``move/cache.py``). To the scatter reader (``load/scatter.py``) the reader
offers each chunk as a :class:`~shardload.formats.base.RawChunk` of its cached copy, opened
when the reader first needs it (which fills the cache when the copy is missing): its rows go
by ``preadv`` from the copy straight into their batch rows, as from a local folder, instead of
the whole file being read, hashed and copied out in each process.

Trust: a copy is checked against the store's checksum before its rows are used, once per
process, with no hashing when the copy's record in the cache vouches for it
(``formats/copies.py``, as Zarr chunk files and shards read through the cache).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import numpy as np

from shardload.formats.base import RawChunk
from shardload.formats.copies import open_checked_copy

if TYPE_CHECKING:
    from shardload.formats.npy.url import NpyUrlReader

#: Bytes read for a chunk file's header (numpy writes 128; a longer one is read again whole).
HEADER_BYTES = 4096


def raw_chunk(reader: NpyUrlReader, name: str, i: int) -> RawChunk:
    """Chunk ``i`` of ``name`` as raw rows of its cached copy (opened by ``opener``: no I/O
    here; ``offset`` is set by the opener)."""
    info = reader.manifest.arrays[name]
    row_bytes = int(np.prod(info.row_shape, dtype=np.int64)) * np.dtype(info.dtype).itemsize
    path = reader.path(name, i)
    return RawChunk(path, -1, row_bytes, opener=lambda: open_chunk(reader, name, i, row_bytes))


def open_chunk(reader: NpyUrlReader, name: str, i: int, row_bytes: int) -> tuple[int, RawChunk]:
    """A descriptor on chunk ``i``'s checked copy (module docstring) and its raw rows."""
    path = reader.path(name, i)
    fd = open_checked_copy(reader.fs, reader.verifier, name, i, path, what=f"chunk {i}")
    try:
        offset = reader._offsets.get((name, i))
        if offset is None:
            offset = reader._parse_header(name, i, os.pread(fd, HEADER_BYTES, 0))
            reader._offsets.setdefault((name, i), offset)
    except BaseException:
        os.close(fd)
        raise
    bounded = getattr(reader.fs.spec, "cache_bytes", None) is not None
    return fd, RawChunk(path, offset, row_bytes, transient=bounded)
