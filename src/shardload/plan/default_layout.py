"""The default layout of a compressed Zarr store (pure): small inner chunks in big shards,
sized from the row bytes (docs/design.md, "The default layout")."""

from __future__ import annotations

from shardload.errors import ConfigError
from shardload.plan.chunks import plan_chunk_rows

#: Default layout of a compressed Zarr store (:func:`plan_default_layout`): inner chunks of at
#: most this many decoded bytes, the unit a compressed store is decoded and shuffled by. 128 KiB:
#: a default shuffle group (64 MiB decoded, ``load.options.WHOLE_CHUNK_GROUP_BYTES``) holds 512
#: of them, so a batch draws its rows from hundreds of chunks (docs/design.md, "The default
#: layout").
DEFAULT_INNER_CHUNK_BYTES = 128 << 10
#: ... and at least this many inner chunks in a store (smaller chunks, down to
#: ``MIN_INNER_CHUNK_BYTES``, in a store under 1 GiB): a batch mixes only rows of the chunks
#: one DataLoader worker reads, so 16 ranks x 2 workers need 8,192 chunks between them for each
#: to draw a batch of 256 rows from 256 chunks.
DEFAULT_MIN_CHUNKS = 8192
#: The smallest inner chunk the default layout makes (smaller ones cost more to index than to
#: decode).
MIN_INNER_CHUNK_BYTES = 4 << 10
#: ... in shard files of about this many decoded bytes: few files (an HPC file system rations
#: inodes), each big enough that opening it costs far less than reading it.
DEFAULT_SHARD_BYTES = 64 << 20


def plan_default_layout(
    row_bytes: int,
    *,
    length: int,
    inner_bytes: int = DEFAULT_INNER_CHUNK_BYTES,
    min_chunks: int = DEFAULT_MIN_CHUNKS,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
) -> tuple[int, int]:
    """``(chunk_rows, shard_chunks)`` of the default layout: inner chunks of at most
    ``inner_bytes``, fewer rows where that leaves the store under ``min_chunks`` chunks (but at
    least one row and about ``MIN_INNER_CHUNK_BYTES``), in shards of about ``shard_bytes`` (at
    least one inner chunk); a store smaller than one shard is one shard per array.

    >>> plan_default_layout(6200, length=10**7)     # 21-row inner chunks, 515 to a shard
    (21, 515)
    >>> plan_default_layout(6200, length=65_536)    # 406 MB: 8,192 chunks of 8 rows
    (8, 1353)
    >>> plan_default_layout(6200, length=1000)      # a small store: chunks of 1 row, one shard
    (1, 1000)
    >>> plan_default_layout(10**6, length=1000)     # rows bigger than an inner chunk: one row
    (1, 67)
    """
    most = plan_chunk_rows(row_bytes, length=length, target_bytes=inner_bytes)
    least = plan_chunk_rows(row_bytes, length=length, target_bytes=MIN_INNER_CHUNK_BYTES)
    if min_chunks <= 0 or shard_bytes <= 0:
        raise ConfigError(f"bad default layout sizes: {min_chunks} chunks, {shard_bytes} bytes")
    chunk_rows = max(least, min(most, length // min_chunks))
    num_chunks = max(1, -(-length // chunk_rows))
    per_shard = max(1, shard_bytes // (chunk_rows * row_bytes))
    return chunk_rows, int(min(per_shard, num_chunks))
