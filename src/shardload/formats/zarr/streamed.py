"""By URL, a shard fetched ahead for its check decoded while its bytes arrive (issues 25 and
28).

A first epoch by URL fetches each shard whole for its checksum; the GETs of the first shards a
worker reads start at the plan (:mod:`.ahead`), and the call that checks such a shard decoded
its chunks only once the last byte was in and hashed: the network idle while the chunks were
decoded, the decode idle while they arrived. The GET ahead reads the answer into its buffer a
piece at a time on ``http.client`` (:mod:`shardload.move.http_get`, the GIL released in
``recv``) and says how far it got (:class:`.ahead.Stream`); here every call that wants the
shard while that GET runs (the first group's, and the group read ahead: counted among the
shard's users, ``Verifier.unit_use``, not yet holding its lock) asks for the shard's index
apart (one small range request at the end of the shard, once the answer's length is known,
shared by those calls: ``Stream.tail``) and decodes its own pieces in offset order as their
bytes arrive (:func:`.shard_spans._read_runs`, which waits for each run's bytes), then waits
for the check; a shard of ``STREAM_MIN_BYTES`` or more only. (Before, only the call holding
the lock did; the others waited for it, then decoded from the checked bytes: the epoch's tail.)

Nothing decoded here is trusted on its own: the rows go only into the call's own destination
(the group, which the loader hands out only when the call returns), the call then takes the
GET's bytes and digest and checks them as before (:func:`.shard_fetch._checked_whole`), and
what was decoded stands only if it came from that very buffer, in one attempt, with the index
read apart equal to the index of the checked bytes (:func:`decoded_from`); else every piece is
decoded again from the checked bytes. A chunk that fails to decode, an index that fails its
checks, a GET retried or failed: nothing is raised here, the pieces are decoded again after
the check, which raises what the shard's damage is, naming it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from shardload.formats.zarr.ahead import Ahead
from shardload.formats.zarr.chunks import ChunkLayout
from shardload.formats.zarr.shard_spans import RUN_BYTES, Piece, _read_runs
from shardload.formats.zarr.shards import EMPTY, RangeFile, _read_index

if TYPE_CHECKING:
    from shardload.formats.zarr.url_rows import RowSink

__all__ = ["STREAM_MIN_BYTES", "Early", "decode_arriving", "decoded_from"]

#: Shards smaller than this are decoded once they are in (as before): their answer comes in a
#: few pieces (``http_get.PIECE_BYTES``), too few to decode between, and the index asked for
#: apart would be a request more for nothing.
STREAM_MIN_BYTES = 8 << 20

#: pieces decoded as they arrived: the index they were placed by, the buffer they came from
Early = tuple[np.ndarray, memoryview]


class _TailFile:
    """The last bytes ``tail`` of a file of ``size`` bytes (its index), as a file."""

    def __init__(self, size: int, tail: memoryview) -> None:
        self.size, self.tail, self._pos = size, tail, 0

    def seek(self, pos: int, whence: int = 0) -> int:
        self._pos = pos
        return pos

    def readinto(self, dst: Any) -> int:
        view = memoryview(dst).cast("B")
        at = self._pos - (self.size - len(self.tail))
        got = self.tail[max(0, at) : max(0, at) + len(view)]
        view[: len(got)] = got
        self._pos += len(got)
        return len(got)


class _Gone(Exception):
    """The GET ended without the bytes, or started again in a new buffer."""


def decode_arriving(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    pieces: list[Piece],
    ahead: Ahead | None,
    sink: RowSink | None = None,
) -> Early | None:
    """Decode ``pieces`` of shard ``k`` from its GET ahead as the bytes arrive (the caller is
    one of the shard's users, ``Verifier.unit_use``): the index used and the buffer decoded
    from, or None when there was no such GET (or it was taken already) or anything went wrong
    (the caller decodes from the checked bytes). ``sink``: the pieces' chunks decoded by it
    into their rows instead (:mod:`.url_rows`), from the bytes in so far, a piece it leaves
    a failure as any other."""
    stream = ahead.stream(name, k) if ahead is not None else None
    spec = layout.shard
    if stream is None or spec is None or not spec.index_at_end or layout.opener is None:
        return None
    total = stream.size()
    n = spec.index_nbytes
    if total is None or total < max(n, STREAM_MIN_BYTES):
        return None
    first: list[tuple[memoryview, int]] = []

    def fetch(start: int, end: int) -> tuple[memoryview, int]:
        got = stream.wait(end)
        if got is None or (first and first[0][1] != got[1]):
            raise _Gone
        if not first:
            first.append(got)
        return got[0][start:end], end - start

    try:
        tail = stream.tail(lambda: RangeFile(layout.opener.fs, path).fetch(total - n, total)[0])
        index = _read_index(layout, name, k, path, _TailFile(total, tail), None)
        if sink is not None:
            _sink_arriving(sink, k, pieces, index, fetch)
        else:
            _read_runs(layout, name, k, pieces, index, path, fetch, RUN_BYTES)
    except Exception:  # (a damaged shard is named by the check and the decode after it)
        return None
    return (index, first[0][0]) if first else None


def _sink_arriving(
    sink: RowSink, k: int, pieces: list[Piece], index: np.ndarray, fetch: Any
) -> None:
    """``pieces`` decoded by ``sink`` in offset order, ``RUN_BYTES`` of the shard at a time
    once those bytes are in (``fetch``: the bytes from 0 to an offset, waited for)."""
    js = np.fromiter((p[0] for p in pieces), np.int64, len(pieces))
    offs = index[js, 0]
    if (offs == np.uint64(EMPTY)).any():
        raise _Gone  # (never written: decoded after the check, as any other piece left)
    order = np.argsort(offs, kind="stable")
    ends = (offs + index[js, 1]).astype(np.int64)[order]
    step = np.r_[np.flatnonzero(np.diff(ends // RUN_BYTES)) + 1, len(order)]
    a = 0
    for b in step.tolist():
        buf, _ = fetch(0, int(ends[a:b].max()))
        if sink.decode(k, [pieces[q] for q in order[a:b].tolist()], buf, index):
            raise _Gone  # a piece left: all decoded again from the checked bytes
        a = b


def decoded_from(early: Early | None, data: memoryview, index: np.ndarray) -> bool:
    """Whether the pieces decoded as they arrived (``early``) stand: decoded from the very
    buffer of the checked bytes ``data`` (held alive by ``early`` meanwhile: never a reused
    one), by an index equal to ``index``, the checked bytes' own."""
    if early is None:
        return False
    placed, buf = early
    a, b = np.frombuffer(buf, np.uint8), np.frombuffer(data, np.uint8)
    same = len(a) == len(b) and a.ctypes.data == b.ctypes.data
    return same and placed.shape == index.shape and bool(np.array_equal(placed, index))
