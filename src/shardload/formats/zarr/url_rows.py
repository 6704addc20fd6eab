"""By URL, inner chunks decoded (Blosc) or copied (raw) straight into the places their rows go
(issues 25 and 28).

The local read of a compressed shard (:mod:`.shard_rows`) decodes each inner chunk into a small
buffer that stays in the CPU's cache and copies each of its rows to its row of a batch: no
group buffer, no gather pass. By URL a shard's bytes mostly arrive whole in memory, fetched
once for its checksum (:func:`.shard_fetch._checked_whole`): here the chunks a call needs are
decoded from those checked bytes the same way, by the compiled kernel's ``decode_rows_buf``
(without the GIL, every chunk's place checked against the buffer's length). Shards of raw
inner chunks (the default layout of values lz4 does not shrink) take the same path: the
kernel's ``copy_rows_buf`` copies each row from the checked bytes to its place (a chunk of
another size than its rows' is left to the caller's path, which names it), where the gather
reader copied every row twice (into a group buffer, then out of it).

The kernel also serves the bytes of a shard's GET ahead as they arrive (:mod:`.streamed`) and
chunks kept from an earlier request (:meth:`RowSink.decode_kept`, from the kept bytes where
they lie). The rest of the URL path is unchanged (:func:`.shard_fetch.read_url_shards`): each
chunk is a piece of a per-call staging array, and the pieces the kernel does not serve (one
fetched by a range request, or one the kernel cannot serve: then decoded or named by the path
it takes today, with today's errors) are decoded there as before, then their rows copied to
their places. The staging array is never written where the kernel served its chunks (its
pages are never touched). Rows are used only once the call returns, every shard checked.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from shardload.formats.checksums import Verifier
from shardload.formats.zarr import shard_fetch, shard_rows
from shardload.formats.zarr.chunks import ChunkLayout
from shardload.formats.zarr.shard_spans import Piece
from shardload.formats.zarr.shards import EMPTY, RangeOpener, ShardIndexCache

_TMP = threading.local()


def decodes_url_rows(layout: ChunkLayout | None) -> bool:
    """Whether the kernel can decode this array's rows into place by URL: a shardload
    (strict) array of Blosc or raw inner chunks in shards read through range requests, and
    the kernel built."""
    return (
        shard_rows.KERNEL is not None
        and layout is not None
        and layout.shard is not None
        and isinstance(layout.opener, RangeOpener)
        and layout.strict
    )


class RowSink:
    """One call's chunks (``chunks``: global chunk numbers, sorted, each once) and where each
    one's rows go (``dst[i, r]``: the address of row ``r`` of chunk ``chunks[i]``, 0 for
    nowhere); ``served[i]``: decoded into place by the kernel."""

    def __init__(self, layout: ChunkLayout, chunks: np.ndarray, dst: np.ndarray) -> None:
        assert layout.shard is not None
        self.layout, self.chunks, self.dst = layout, chunks, dst
        self.served = np.zeros(len(chunks), bool)

    def decode(
        self, k: int, pieces: list[Piece], data: memoryview, index: np.ndarray
    ) -> list[Piece]:
        """Shard ``k``'s ``pieces`` (this call's, whole inner chunks) decoded from its checked
        bytes ``data`` (``index``: their own) into their rows; the pieces left (never written,
        or a chunk the kernel could not serve) for the caller's path."""
        buf = np.frombuffer(data, np.uint8)
        return self._serve(k, pieces, buf.ctypes.data, len(buf), index)

    def decode_kept(self, k: int, pieces: list[Piece], held: dict[int, bytes]) -> list[Piece]:
        """Shard ``k``'s ``pieces`` whose chunks were kept from earlier requests (``held``: each
        one's bytes by global chunk number, :mod:`.kept`) decoded from those bytes where they
        lie into their rows, as :meth:`decode` (the same checks); the pieces left for the
        caller's path. Each chunk is placed by its own address, as an offset from address 0
        (its size its bytes' length: it lies wholly inside them)."""
        layout = self.layout
        assert layout.shard is not None
        first = k * layout.shard.chunks
        index = np.full((layout.shard.chunks, 2), EMPTY, np.uint64)
        for j, *_ in pieces:
            view = np.frombuffer(held[first + j], np.uint8)
            index[j] = view.ctypes.data, len(view)
        return self._serve(k, pieces, 0, 1 << 62, index)

    def _serve(
        self, k: int, pieces: list[Piece], base: int, nbytes: int, index: np.ndarray
    ) -> list[Piece]:
        """:meth:`decode` of bytes at address ``base`` (``nbytes`` long, alive for the call)."""
        layout = self.layout
        assert layout.shard is not None
        js = np.fromiter((p[0] for p in pieces), np.int64, len(pieces))
        at = np.searchsorted(self.chunks, js + k * layout.shard.chunks)
        offs, sizes = index[js, 0], index[js, 1]
        written = np.flatnonzero(offs != np.uint64(EMPTY))
        order = written[np.argsort(offs[written], kind="stable")]
        if not len(order):
            self.served[at] = False
            return pieces
        offs_o, sizes_o = offs[order].astype(np.int64), sizes[order].astype(np.int64)
        dst = np.ascontiguousarray(self.dst[at[order]], np.uint64)
        kernel, rows, rb = shard_rows.KERNEL, layout.chunk_rows, layout.row_bytes
        where = (base, nbytes, offs_o.ctypes.data, sizes_o.ctypes.data)
        if layout.blosc:  # the header checks the local kernel makes, decoded via a small buffer
            tmp = getattr(_TMP, "buf", None)
            if tmp is None or len(tmp) < rows * rb:
                tmp = _TMP.buf = np.empty(rows * rb, np.uint8)
            (ts_a, ts_b), shuffle = layout.blosc_header
            tail = (dst.ctypes.data, rows, rb, ts_a, ts_b, shuffle, tmp.ctypes.data)

            def serve(i: int, n: int) -> int:
                return int(kernel.decode_rows_buf(shard_rows._DECOMPRESS, *where, i, n, *tail))
        else:  # raw inner chunks: each row copied from the checked bytes

            def serve(i: int, n: int) -> int:
                return int(kernel.copy_rows_buf(*where, i, n, dst.ctypes.data, rows, rb))

        left = np.ones(len(pieces), bool)
        i, n = 0, len(order)
        while i < n:
            got = serve(i, n)
            left[order[i:got]] = False
            i = got + 1  # chunk ``got`` (if any) is left to the caller's path, which names it
        self.served[at] = ~left  # a piece left: its rows copied from staging after all
        return [p for p, q in zip(pieces, left.tolist(), strict=True) if q]

    def copy_rest(self, staging: np.ndarray) -> None:
        """The rows of the chunks not served by the kernel copied from ``staging`` (the whole
        chunks the caller's path decoded, ``staging[i]`` chunk ``chunks[i]``'s)."""
        rb = self.layout.row_bytes
        for i in np.flatnonzero(~self.served).tolist():
            base = staging[i].ctypes.data
            for r, p in enumerate(self.dst[i].tolist()):
                if p:
                    ctypes.memmove(p, base + r * rb, rb)


def decode_url_rows_into(
    layout: ChunkLayout,
    name: str,
    rows: np.ndarray,
    to: np.ndarray,
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    """Row ``rows[i]`` of array ``name`` by URL (global row numbers, sorted, each once) copied
    to address ``to[i]`` (``layout.row_bytes`` bytes there, the caller's, alive for the call):
    each inner chunk fetched as :func:`.shard_fetch.read_url_shards` fetches it, every shard
    checked first."""
    assert layout.shard is not None
    n_rows, per = layout.chunk_rows, layout.shard.chunks
    chunk, r = np.divmod(rows, n_rows)
    starts = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
    chunks = chunk[starts]
    dst = np.zeros((len(chunks), n_rows), np.uint64)  # 0: a row nobody asked for
    dst[np.repeat(np.arange(len(chunks)), np.diff(np.r_[starts, len(rows)])), r] = to
    full = n_rows * layout.row_bytes
    staging = np.empty((len(chunks), full), np.uint8)  # touched only where the kernel is not
    by_shard: dict[int, list[Piece]] = {}
    for i, c in enumerate(chunks.tolist()):
        by_shard.setdefault(c // per, []).append((c % per, 0, n_rows, staging[i].data))
    sink = RowSink(layout, chunks, dst)
    shard_fetch.read_url_shards(layout, name, by_shard, verifier, indexes, sink=sink)
    sink.copy_rest(staging)


class DecodedRowsByUrl(shard_rows.DecodedRows):
    """:class:`.shard_rows.DecodedRows` (the Zarr reader's capability), by URL too."""

    def decoded_rows(self, name: str) -> bool:
        """Whether array ``name`` is one the kernel decodes into place, locally or by URL
        (:func:`decodes_url_rows`; not CF-encoded)."""
        layout = None if name in self._cf else self.layout(name)
        return super().decoded_rows(name) or decodes_url_rows(layout)

    def decode_rows_into(self, name: str, rows: np.ndarray, to: np.ndarray) -> None:
        """Row ``rows[i]`` (sorted, each once) to address ``to[i]``: by URL
        :func:`decode_url_rows_into`, else :func:`.shard_rows.decode_rows_into`."""
        layout = self.layout(name)
        assert layout is not None
        if layout.opener is None:
            super().decode_rows_into(name, rows, to)
            return
        decode_url_rows_into(layout, name, rows, to, self.verifier, self._indexes)
