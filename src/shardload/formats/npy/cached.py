"""An npy stack read through the node cache: rows read in place from the cached copies.

A store opened with ``cache_dir`` is read by URL (``formats/npy/url.py``), every file through
the node cache (``move/cache.py``). To the scatter reader (``load/scatter.py``) the reader
offers each chunk as a :class:`~shardload.formats.base.RawChunk` of its cached copy, opened
when the reader first needs it (which fills the cache when the copy is missing): its rows go
by ``preadv`` from the copy straight into their batch rows, as from a local folder, instead of
the whole file being read, hashed and copied out in each process.

Trust: a copy is checked against the store's checksum before its rows are used, once per
process (the reader's :class:`~shardload.formats.checksums.Verifier`), with no hashing when the
copy's record in the cache vouches for it: the record holds the XXH3-64 computed from these
very bytes when they were written into the cache (or last hashed), its stamp (size, inode,
mtime, boot id) still equals the open copy's, and that digest equals the store's checksum as
this process read it from the store's checksum file. Otherwise the open copy is hashed, and a
mismatch raises ``ChunkReadError`` naming the file (the cache itself first fetches again a
copy whose bytes do not match the store's checksum: ``RemoteFileSystem.cached_copy``).
"""

from __future__ import annotations

import mmap
import os
from typing import TYPE_CHECKING

import numpy as np
import xxhash

from shardload.errors import ChunkReadError
from shardload.formats.base import RawChunk

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
    path, v = reader.path(name, i), reader.verifier
    want = v.recorded(name, i, path=path, what=f"chunk {i}") if v.enabled else None
    try:
        fd, vouched = reader.fs.cached_copy(path, what=f"chunk {i} of array {name!r}", digest=want)
    except OSError as exc:
        raise ChunkReadError.from_os_error(exc, f"chunk {i}", name, path) from exc
    try:
        if v.needed(name, i):
            if want is not None and vouched == want and v.mode != "always":
                v.vouch(name, i)
            else:
                v.check(name, i, fd_digest(fd), path=path, what=f"chunk {i}")
        offset = reader._offsets.get((name, i))
        if offset is None:
            offset = reader._parse_header(name, i, os.pread(fd, HEADER_BYTES, 0))
            reader._offsets.setdefault((name, i), offset)
    except BaseException:
        os.close(fd)
        raise
    bounded = getattr(reader.fs.spec, "cache_bytes", None) is not None
    return fd, RawChunk(path, offset, row_bytes, transient=bounded)


def fd_digest(fd: int) -> int:
    """XXH3-64 of the whole open file ``fd`` (mapped: no copy out of the page cache)."""
    if os.fstat(fd).st_size == 0:
        return int(xxhash.xxh3_64_intdigest(b""))
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
        return int(xxhash.xxh3_64_intdigest(m))
