"""Blosc inner chunks of local shards decoded straight into the places their rows go.

The default load of a compressed store reads each shuffle group's inner chunks (a few rows
each) into a group buffer, then gathers its batches out of it: every decoded byte is written
to a 67 MB group buffer, far larger than the CPU's caches, and read back once more by the
gather. Here each inner chunk is decoded into a small buffer that stays in the cache and each
of its rows copied to its row of a batch (an address the caller gives): the group buffer and
the gather pass go. The per-chunk work runs in C without the GIL (``_decode_rows.c``, built by
``setup.py`` where a C compiler is found): the same chunks in Python cost about 5 us each, as
much as decoding them (docs/design.md, "Compressed shards decoded into their batches").

Without the compiled part (:data:`KERNEL` None) nothing here is used: the loader reads into
group buffers and gathers (:mod:`shardload.load.gather`), with the same batches.

Every shard is checked against its checksum (as ``verify`` asks) before any of its rows is
written; a chunk the kernel cannot serve (a short read, a header that does not match, a failed
decode) is read again here and decoded, or its error raised as the gather path raises it
(:func:`.chunks.decode_into`).
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any, cast

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.checksums import Verifier, verify_file
from shardload.formats.zarr.chunks import ChunkLayout, decode_into
from shardload.formats.zarr.shard_local import DECOMPRESS_CTX, chunk_name
from shardload.formats.zarr.shards import (
    EMPTY,
    ShardIndexCache,
    _scratch,
    shard_errors,
    shard_index,
)
from shardload.util import extension

_compiled: Any = extension.compiled()  # the optional compiled part (setup.py), or None

#: c-blosc's ``blosc_decompress_ctx`` in numcodecs' extension, the address the kernel calls.
_DECOMPRESS = ctypes.cast(cast(Any, DECOMPRESS_CTX), ctypes.c_void_p).value if DECOMPRESS_CTX else 0
#: The arguments ``decode_rows`` (and ``decode_rows_buf``, ``copy_rows_buf``, url_rows.py;
#: ``read_rows``, staged reads) take (the extension's ``ABI``).
ABI = extension.ABI


def usable(compiled: Any) -> Any:
    """``compiled`` if its ``decode_rows`` takes the arguments passed here, else None: an old
    build beside newer sources (before ``setup.py build_ext`` runs again) is never called."""
    return compiled if getattr(compiled, "ABI", 1) == ABI else None


#: The compiled kernel, or None (then the loader gathers out of group buffers).
KERNEL: Any = usable(_compiled) if _DECOMPRESS and _compiled is not None else None
#: Runs of neighbouring chunks are read with one ``pread`` of up to this many bytes.
RUN_BYTES = 1 << 20

_TMP = threading.local()


def decodes_rows(layout: ChunkLayout | None) -> bool:
    """Whether the kernel can decode this array's rows into place: a shardload (strict) local
    array of Blosc inner chunks in shards, and the kernel built."""
    return (
        KERNEL is not None
        and layout is not None
        and layout.shard is not None
        and layout.blosc
        and layout.opener is None
        and layout.strict
    )


def decode_rows_into(
    layout: ChunkLayout,
    name: str,
    rows: np.ndarray,
    to: np.ndarray,
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    """Row ``rows[i]`` of array ``name`` (global row numbers, sorted, each once) copied to
    address ``to[i]`` (``layout.row_bytes`` bytes there, the caller's, alive for the call):
    each inner chunk decoded once, shard by shard, each shard checked first."""
    assert layout.shard is not None
    n_rows, per = layout.chunk_rows, layout.shard.chunks
    chunk, r = np.divmod(rows, n_rows)
    starts = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
    chunks = chunk[starts]
    dst = np.zeros((len(chunks), n_rows), np.uint64)  # 0: a row nobody asked for
    dst[np.repeat(np.arange(len(chunks)), np.diff(np.r_[starts, len(rows)])), r] = to
    shard = chunks // per
    bounds = np.flatnonzero(np.r_[True, shard[1:] != shard[:-1], True])
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        k = int(shard[a])
        _decode_shard(layout, name, k, chunks[a:b] - k * per, dst[a:b], verifier, indexes)


def _decode_shard(
    layout: ChunkLayout,
    name: str,
    k: int,
    js: np.ndarray,
    dst: np.ndarray,
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    """Inner chunks ``js`` of shard ``k``, row ``r`` of chunk ``js[i]`` to ``dst[i, r]``."""
    path = layout.chunk_path(k)
    if verifier is not None and verifier.needed(name, k):  # checked through mmap, then read
        verify_file(verifier, name, k, path, what=f"shard {k}")
    with shard_errors(layout, name, k, path, ()), layout.open(path) as f:  # strict: no fill
        fd = f.fileno()
        index = shard_index(layout, name, k, path, f, fd, indexes)
        offs, sizes = index[js, 0], index[js, 1]
        order = np.argsort(offs, kind="stable")
        offs, sizes, js, dst = offs[order], sizes[order], js[order], dst[order]
        empty = offs == np.uint64(EMPTY)
        if empty.any():  # never written (checked with the index): the fill value
            fill = np.full(
                layout.row_bytes // layout.dtype.itemsize, layout.fill_value, layout.dtype
            )
            for p in dst[empty].ravel().tolist():
                if p:
                    ctypes.memmove(p, fill.ctypes.data, layout.row_bytes)
            keep = ~empty
            offs, sizes, js, dst = offs[keep], sizes[keep], js[keep], dst[keep]
        if len(offs):
            _decode_chunks(layout, name, k, path, fd, offs, sizes, js, dst)


def _decode_chunks(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    fd: int,
    offs: np.ndarray,
    sizes: np.ndarray,
    js: np.ndarray,
    dst: np.ndarray,
) -> None:
    offs, sizes = offs.astype(np.int64), sizes.astype(np.int64)
    dst = np.ascontiguousarray(dst, np.uint64)
    full = layout.chunk_rows * layout.row_bytes
    scratch = np.frombuffer(_scratch(max(RUN_BYTES, int(sizes.max()))), np.uint8)
    tmp = getattr(_TMP, "buf", None)
    if tmp is None or len(tmp) < full:
        tmp = _TMP.buf = np.empty(full, np.uint8)
    args = (offs.ctypes.data, sizes.ctypes.data)
    (ts_a, ts_b), shuffle = layout.blosc_header
    tail = (layout.chunk_rows, layout.row_bytes, ts_a, ts_b, shuffle)
    i, n = 0, len(offs)
    while i < n:
        i = KERNEL.decode_rows(
            _DECOMPRESS,
            fd,
            *args,
            i,
            n,
            dst.ctypes.data,
            *tail,
            scratch.ctypes.data,
            len(scratch),
            tmp.ctypes.data,
        )
        if i < n:  # a chunk it could not serve: decoded here, or its error raised
            _one_chunk(layout, name, k, path, fd, int(js[i]), int(offs[i]), int(sizes[i]), tmp)
            for r, p in enumerate(dst[i].tolist()):
                if p:
                    ctypes.memmove(p, tmp.ctypes.data + r * layout.row_bytes, layout.row_bytes)
            i += 1


def _one_chunk(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    fd: int,
    j: int,
    off: int,
    size: int,
    out: np.ndarray,
) -> None:
    """Inner chunk ``j`` of shard ``k`` decoded into ``out``, or the gather path's error."""
    raw = os.pread(fd, size, off)
    if len(raw) < size:
        raise ChunkReadError(
            f"{chunk_name(layout, k, j)} of array {name!r} is truncated: {path} "
            f"(expected {size} bytes at offset {off}, got {len(raw)})"
        )
    full = layout.chunk_rows * layout.row_bytes
    what = chunk_name(layout, k, j)
    dst = out[:full].data
    decode_into(layout, memoryview(raw), 0, layout.chunk_rows, dst, name=name, what=what, path=path)


class DecodedRows:
    """The capability a Zarr reader gets here (:class:`~shardload.formats.base.DecodesRows`):
    ``decoded_rows(name)``, whether ``decode_rows_into(name, rows, to)`` serves the array."""

    _cf: dict[str, Any]
    verifier: Verifier
    _indexes: ShardIndexCache

    def layout(self, name: str) -> ChunkLayout | None:  # pragma: no cover - the reader's own
        raise NotImplementedError

    def decoded_rows(self, name: str) -> bool:
        """Whether array ``name`` is one the kernel decodes into place (:func:`decodes_rows`;
        not CF-encoded: their stored values are decoded again after the read)."""
        return name not in self._cf and decodes_rows(self.layout(name))

    def decode_rows_into(self, name: str, rows: np.ndarray, to: np.ndarray) -> None:
        """Row ``rows[i]`` (sorted, each once) to address ``to[i]`` (:func:`decode_rows_into`)."""
        layout = self.layout(name)
        assert layout is not None
        decode_rows_into(layout, name, rows, to, self.verifier, self._indexes)
