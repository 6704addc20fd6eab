"""Whole inner chunks of a local sharded array, many at once: the default load's reads
(Blosc ones decoded into place; raw ones, of ``compression: auto`` or ``none``, read into place).

A shuffle group of the default load reads about 1,400 whole inner chunks of a few rows, a
scattered sixth of every shard. Read piece by piece (:func:`.shard_spans._read_runs`), each
chunk cost a Python generator, a few memoryviews, a tuple and a dict look-up on top of its
``pread`` and ``decompress``: 0.05-0.1 CPU s an epoch more than a bare loop of the same system
calls (docs/benchmarks.md, "Load: the default store, levers tried"). Here the spans' chunks,
shards, index entries, offset order and runs of neighbouring chunks are found with numpy, a
few calls per shard; what is left per chunk is one ``preadv`` per run of neighbouring chunks,
its Blosc header's check and one decode straight into the caller's array. The checks
and the error messages are the one-span path's (:func:`.chunks.decode_into` raises them).

The decode calls c-blosc's ``blosc_decompress_ctx`` in numcodecs' own extension through
``ctypes`` (the GIL released, as numcodecs does): ``numcodecs.blosc.decompress`` checks and
wraps both buffers in Python first, about 4 us of a 16 us call for an 8-row chunk of 6.2 KB
rows (docs/benchmarks.md, "Load: the default store's decode called directly"). Where that
symbol is missing, numcodecs' ``decompress`` as before.
"""

from __future__ import annotations

import ctypes
import operator
import os
import struct
from collections.abc import Callable, Sequence
from itertools import pairwise

import numpy as np
from numcodecs import blosc

from shardload.errors import ChunkReadError
from shardload.formats.base import RawShard
from shardload.formats.checksums import Verifier, verify_file
from shardload.formats.zarr.chunks import ChunkLayout, decode_into
from shardload.formats.zarr.shards import (
    EMPTY,
    ShardIndexCache,
    _pread_into,
    _scratch,
    shard_errors,
    shard_index,
)

_HEADER = struct.Struct("<III")  # a Blosc header's decoded, block and compressed sizes
_NBYTES = operator.attrgetter("nbytes")
_C_CONTIGUOUS = operator.attrgetter("flags.c_contiguous")


def _blosc_decompress_ctx() -> Callable[[int, int, int, int], int] | None:
    """c-blosc's ``int blosc_decompress_ctx(const void *src, void *dest, size_t destsize,
    int numinternalthreads)`` from numcodecs' extension (loaded already), or None."""
    try:
        fn = ctypes.CDLL(blosc.__file__).blosc_decompress_ctx
    except (OSError, AttributeError, TypeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


#: The decode without numcodecs' wrapping, or None (then ``blosc.decompress``).
DECOMPRESS_CTX = _blosc_decompress_ctx()


def read_whole_chunks(
    layout: ChunkLayout,
    name: str,
    spans: Sequence[tuple[int, int]],
    outs: Sequence[np.ndarray],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
    run_bytes: int,
) -> bool:
    """Read the spans when each is one whole inner chunk of a local array (Blosc, or raw inner
    chunks, read straight into place) and its ``out``
    exactly that chunk's bytes, C-contiguous (shard by shard, in the order the spans first
    touch them, each checked first when ``verifier`` asks); False, reading nothing, otherwise.
    Runs of chunks that follow each other in a shard file are read with one ``preadv`` of up
    to ``run_bytes`` (or one chunk)."""
    spec = layout.shard
    if spec is None or layout.opener is not None or not spans:
        return False
    rows = layout.chunk_rows
    sp = np.array(spans, dtype=np.int64)
    if sp.shape != (len(outs), 2):
        return False
    starts = sp[:, 0]
    if ((sp[:, 1] - starts) != rows).any() or (starts % rows).any():
        return False
    if set(map(_NBYTES, outs)) != {rows * layout.row_bytes} or not all(map(_C_CONTIGUOUS, outs)):
        return False
    chunks = starts // rows
    shard = chunks // spec.chunks
    ks, first = np.unique(shard, return_index=True)
    for k in ks[np.argsort(first, kind="stable")].tolist():
        sel = np.flatnonzero(shard == k)
        js = chunks[sel] - k * spec.chunks
        _read_shard(layout, name, k, js, sel, outs, verifier, indexes, run_bytes)
    return True


def raw_shard(
    layout: ChunkLayout | None,
    name: str,
    k: int,
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> RawShard:
    """Shard ``k`` of a local array of raw inner chunks for a caller that reads their rows
    itself (the scatter reader, :mod:`shardload.load.scatter`): checked against its checksum
    first when ``verifier`` asks, as :func:`_read_shard` does, its index read and checked once
    per reader (crc32c, every entry inside the shard's data), every inner chunk exactly its
    rows' bytes (``layout``: the array's, raw inner chunks in local shards)."""
    assert layout is not None and layout.shard is not None and not layout.blosc
    spec = layout.shard
    path = layout.chunk_path(k)
    if verifier is not None and verifier.needed(name, k):
        verify_file(verifier, name, k, path, what=f"shard {k}")
    with shard_errors(layout, name, k, path, ()):  # strict: a missing shard is an error
        st = os.stat(path)
    version = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)
    # an index kept from an earlier epoch only for this version of the file: a shard
    # rewritten since is read with its own index (the one kept would place other rows)
    index = indexes.get(path, version) if indexes is not None else None
    if index is None:
        with shard_errors(layout, name, k, path, ()), layout.open(path) as f:
            index = shard_index(layout, name, k, path, f, f.fileno(), indexes)
    offs, sizes = index[:, 0], index[:, 1]
    empty = offs == np.uint64(EMPTY)
    written = np.flatnonzero(~empty)
    full = _check_raw_sizes(layout, name, k, path, sizes[written], written)
    starts = np.where(empty, -1, offs.astype(np.int64))
    end = int((starts + full).max(initial=0)) + (spec.index_nbytes if spec.index_at_end else 0)
    fill = np.full(layout.row_bytes // layout.dtype.itemsize, layout.fill_value, layout.dtype)
    return RawShard(path, starts, layout.row_bytes, full, end, fill.tobytes(), version)


def _read_shard(
    layout: ChunkLayout,
    name: str,
    k: int,
    js: np.ndarray,
    sel: np.ndarray,
    outs: Sequence[np.ndarray],
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
    run_bytes: int,
) -> None:
    """Inner chunks ``js`` of shard ``k`` into ``outs[sel]``: the file opened once."""
    path = layout.chunk_path(k)
    if verifier is not None and verifier.needed(name, k):  # checked through mmap, then read
        verify_file(verifier, name, k, path, what=f"shard {k}")
    parts = (_bytes_of(outs[q]) for q in sel.tolist())
    with shard_errors(layout, name, k, path, parts), layout.open(path) as f:  # a local file
        fd = f.fileno()
        index = shard_index(layout, name, k, path, f, fd, indexes)
        _read_chunks(layout, name, k, path, fd, index, js, sel, outs, run_bytes)


def _read_chunks(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    fd: int,
    index: np.ndarray,
    js: np.ndarray,
    sel: np.ndarray,
    outs: Sequence[np.ndarray],
    run_bytes: int,
) -> None:
    offs, sizes = index[js, 0], index[js, 1]
    order = np.argsort(offs, kind="stable")
    offs, sizes, js, sel = offs[order], sizes[order], js[order], sel[order]
    empty = offs == np.uint64(EMPTY)
    if empty.any():  # never written (checked with the index): the fill value
        for q in sel[empty].tolist():
            _fill(layout, outs[q])
        keep = ~empty
        offs, sizes, js, sel = offs[keep], sizes[keep], js[keep], sel[keep]
    if not len(offs):
        return
    ends = offs + sizes
    runs = _runs(offs, ends, run_bytes)
    if not layout.blosc:  # raw inner chunks (compression auto or none): read into place
        _read_raw(layout, name, k, path, fd, offs, sizes, js, sel, outs, runs)
        return
    offs_l, sizes_l, js_l, sel_l = offs.tolist(), sizes.tolist(), js.tolist(), sel.tolist()
    ends_l = ends.tolist()
    full = layout.chunk_rows * layout.row_bytes
    typesizes, shuffle = layout.blosc_header
    bounds = np.array(runs)
    scratch = _scratch(int((ends[bounds[1:] - 1] - offs[bounds[:-1]]).max()))
    unpack, decompress, preadv = _HEADER.unpack_from, blosc.decompress, os.preadv
    ctx, address, of = DECOMPRESS_CTX, ctypes.addressof, ctypes.c_char.from_buffer
    base = address(of(scratch)) if ctx is not None else 0
    for i, m in pairwise(runs):
        start = offs_l[i]
        want = ends_l[m - 1] - start
        buf = scratch[:want]
        got = preadv(fd, [buf], start)
        if got < want:  # a short read: the rest, if the file has it
            got += _pread_into(None, fd, buf[got:], start + got)
        for q in range(i, m):
            a, size = offs_l[q] - start, sizes_l[q]
            raw = buf if m - i == 1 else buf[a : a + size]
            if a + size > got:
                raise ChunkReadError(
                    f"{chunk_name(layout, k, js_l[q])} of array {name!r} is truncated: {path} "
                    f"(expected {size} bytes at offset {offs_l[q]}, got {max(0, got - a)})"
                )
            out = outs[sel_l[q]]
            if size >= 16:
                nbytes, _, cbytes = unpack(raw, 4)
                ok = cbytes == size and nbytes == full and raw[3] in typesizes
                if ok and shuffle in (-1, raw[2] & 5):
                    if ctx is not None:  # in C, without the GIL; < 0: a bad chunk
                        if ctx(base + a, address(of(out)), full, 1) == full:
                            continue
                    else:
                        try:
                            decompress(raw, out)  # in C, without the GIL
                            continue
                        except Exception:  # decode_into below raises the error naming it
                            pass
            what = chunk_name(layout, k, js_l[q])
            dst = out.reshape(-1).view(np.uint8).data
            decode_into(layout, raw, 0, layout.chunk_rows, dst, name=name, what=what, path=path)


def _read_raw(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    fd: int,
    offs: np.ndarray,
    sizes: np.ndarray,
    js: np.ndarray,
    sel: np.ndarray,
    outs: Sequence[np.ndarray],
    runs: list[int],
) -> None:
    """Raw inner chunks (each exactly its rows' bytes) read with one ``preadv`` per run
    straight into their ``outs``: no scratch buffer, no copy; a short read is finished part by
    part (:func:`_pread_into`), as a Blosc run's is, and only a file that ends early is an error."""
    full = _check_raw_sizes(layout, name, k, path, sizes, js)
    offs_l, sel_l = offs.tolist(), sel.tolist()
    for i, m in pairwise(runs):
        parts = [_bytes_of(outs[sel_l[q]]) for q in range(i, m)]
        want = full * (m - i)
        got = os.preadv(fd, parts, offs_l[i])
        if got < want:  # a short read: the rest, if the file has it
            got = _finish_parts(fd, parts, got, offs_l[i])
        if got < want:
            raise ChunkReadError(
                f"{chunk_name(layout, k, int(js[i]))} of array {name!r} is truncated: {path} "
                f"(expected {want} bytes at offset {offs_l[i]}, got {got})"
            )


def _check_raw_sizes(
    layout: ChunkLayout, name: str, k: int, path: str, sizes: np.ndarray, js: np.ndarray
) -> int:
    """The bytes of a raw inner chunk (its rows'); a ``ChunkReadError`` naming the first of
    shard ``k``'s inner chunks ``js`` whose index entry (``sizes``) says otherwise (corrupt)."""
    full = layout.chunk_rows * layout.row_bytes
    bad = np.flatnonzero(sizes != full)
    if len(bad):
        q = int(bad[0])
        raise ChunkReadError(
            f"{chunk_name(layout, k, int(js[q]))} of array {name!r} is corrupt: {path} holds "
            f"{int(sizes[q])} bytes for it, its rows are {full} bytes"
        )
    return full


def _finish_parts(fd: int, parts: Sequence[memoryview], got: int, start: int) -> int:
    """After a ``preadv`` of ``parts`` from byte ``start`` of ``fd`` read ``got`` bytes: the
    rest of each part read; the bytes read in all (fewer only where the file ends)."""
    pos = 0
    for part in parts:
        n = len(part)
        if pos + n > got:
            skip = got - pos
            more = _pread_into(None, fd, part[skip:], start + got)
            got += more
            if skip + more < n:
                return got
        pos += n
    return got


def _runs(offs: np.ndarray, ends: np.ndarray, run_bytes: int) -> list[int]:
    """Where the runs of chunks (in offset order) start, and the end: a chunk joins the run
    before it when it starts where that run's last chunk ends and the run stays within
    ``run_bytes``."""
    joins = offs[1:] == ends[:-1]
    if not joins.any():
        return list(range(len(offs) + 1))
    bounds = [0]
    offs_l, ends_l, joins_l = offs.tolist(), ends.tolist(), joins.tolist()
    for q in range(1, len(offs_l)):
        if not joins_l[q - 1] or ends_l[q] - offs_l[bounds[-1]] > run_bytes:
            bounds.append(q)
    bounds.append(len(offs_l))
    return bounds


def _bytes_of(out: np.ndarray) -> memoryview:
    return out.reshape(-1).view(np.uint8).data


def _fill(layout: ChunkLayout, out: np.ndarray) -> None:
    np.frombuffer(_bytes_of(out), dtype=layout.dtype)[...] = layout.fill_value


def chunk_name(layout: ChunkLayout, k: int, j: int) -> str:
    """How errors name inner chunk ``j`` of shard ``k``."""
    assert layout.shard is not None
    return f"chunk {k * layout.shard.chunks + j} (inner chunk {j} of shard {k})"
