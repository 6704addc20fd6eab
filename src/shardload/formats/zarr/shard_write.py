"""Native writes of whole Zarr v3 shards of small chunks (the ``sharding_indexed`` codec).

zarr-python writes a shard through its async codec pipeline one inner chunk at a time, about
0.7 ms per inner chunk: 5.8 s for the 8,193 inner chunks of 1,139 rows of a 9.3 M-sample
1-D array (docs/benchmarks.md, issue 29), where encoding them is a few hundredths of that.
Here each inner chunk is Blosc-encoded in C (as :func:`.write.write_chunk` does for chunk
files), the shard is the encoded chunks back to back and its index ((offset, size) uint64 per
inner chunk, then its crc32c) where the array's metadata puts it, written as one file and
synced. Inner chunks past the array's end are empty (offset and size 2**64 - 1), as zarr-python
leaves them; a short last inner chunk is padded with the fill value. Only the layouts
:func:`.chunks.plan_chunk_layout` accepts with ``shards=True`` come here, and only blocks of
whole shards.
"""

from __future__ import annotations

import os
from typing import Any

import google_crc32c
import numpy as np
from numcodecs import blosc

from shardload.formats.checksums import digest
from shardload.formats.zarr.chunks import ChunkLayout, blosc_codec
from shardload.util.durable import file_written

#: an empty inner chunk's offset and size in a shard index
EMPTY = np.uint64(2**64 - 1)


def whole_shards(layout: ChunkLayout, start: int, stop: int, length: int) -> bool:
    """Whether rows ``[start, stop)`` of an array of ``length`` rows are whole shards."""
    if layout.shard is None:
        return False
    rows = layout.shard.chunks * layout.chunk_rows
    return start % rows == 0 and (stop % rows == 0 or stop == length) and stop > start


def blosc_encoder(config: dict[str, Any]) -> Any:
    """``encode(array) -> bytes``: :func:`blosc_codec`'s ``encode``, byte for byte, without
    its per-call checks. The shard writer encodes thousands of inner chunks of a few KB each,
    where ``Blosc.encode``'s checks cost twice the compression itself (0.23 s against 0.08 s
    for the 8,193 inner chunks of a 9.3 M-sample array)."""
    codec = blosc_codec(config)
    cname, clevel, shuffle = codec._cname_bytes, codec.clevel, codec.shuffle
    blocksize = codec.blocksize

    def encode(arr: np.ndarray) -> bytes:
        # the buffer's item size is Blosc's type size, as Blosc.encode has it (datetimes and
        # other types without a buffer format as the unsigned integers of their size)
        if arr.dtype.kind not in "biuf" or not arr.flags.c_contiguous:
            return bytes(codec.encode(arr))
        return bytes(blosc.compress(arr.data, cname, clevel, shuffle, blocksize))

    return encode


def encode_shard(layout: ChunkLayout, rows: np.ndarray, length: int, first_row: int) -> list[Any]:
    """The shard that starts at row ``first_row`` and holds ``rows`` (all of its rows within
    an array of ``length`` rows), as the buffers whose bytes, back to back, are the file's:
    written and hashed as they are (:func:`write_parts`, :func:`~shardload.formats.checksums.
    digest`), never joined into one copy of the shard (0.29 s of a 378 MB GRIB prepare)."""
    spec = layout.shard
    assert spec is not None
    n = layout.chunk_rows
    block = np.ascontiguousarray(rows, dtype=layout.dtype)
    encode = blosc_encoder(layout.blosc_config) if layout.blosc_config is not None else None
    parts: list[Any] = []
    index = np.full((spec.chunks, 2), EMPTY, dtype="<u8")
    offset = 0 if spec.index_at_end else spec.index_nbytes
    for j in range(spec.chunks):
        lo = j * n
        if first_row + lo >= length:
            break  # past the array's end: empty
        chunk = block[lo : lo + n]
        if len(chunk) < n:
            pad = np.full((n - len(chunk), *block.shape[1:]), layout.fill_value, layout.dtype)
            chunk = np.concatenate([chunk, pad])
        # uncompressed: the rows themselves (a view of the contiguous block, no copy)
        data = encode(chunk) if encode is not None else chunk.reshape(-1).view(np.uint8)
        index[j] = (offset, len(data))
        offset += len(data)
        parts.append(data)
    raw = index.tobytes()
    if spec.index_crc:
        raw += int(google_crc32c.value(raw)).to_bytes(4, "little")
    return [*parts, raw] if spec.index_at_end else [raw, *parts]


#: buffers per ``writev`` call (Linux's IOV_MAX)
_IOV_MAX = 1024


def write_parts(fd: int, parts: list[Any]) -> None:
    """Write the bytes of ``parts`` back to back through ``fd``, a few ``writev`` calls in
    all (a short write goes on where it stopped; an error raises, ``ENOSPC`` included)."""
    views = [memoryview(p).cast("B") for p in parts]
    views = [v for v in views if v.nbytes]
    i = 0
    while i < len(views):
        n = os.writev(fd, views[i : i + _IOV_MAX])
        while n and i < len(views):
            if n >= views[i].nbytes:
                n -= views[i].nbytes
                i += 1
            else:
                views[i], n = views[i][n:], 0


def write_shards(layout: ChunkLayout, start: int, data: np.ndarray, length: int) -> dict[int, int]:
    """Write the whole shards of rows ``[start, start + len(data))`` (see
    :func:`whole_shards`), each synced; their checksums (the files' bytes) by shard."""
    spec = layout.shard
    assert spec is not None
    per = spec.chunks * layout.chunk_rows
    out = {}
    for k in range(start // per, -(-(start + len(data)) // per)):
        lo = k * per - start
        parts = encode_shard(layout, data[lo : lo + per], length, k * per)
        path = layout.chunk_path(k)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb", buffering=0) as f:
            write_parts(f.fileno(), parts)
            file_written(f.fileno(), path)  # durable before the block's progress record
        out[k] = digest(*parts)
    return out
