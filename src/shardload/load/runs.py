"""Reading runs of file rows into scattered memory: ``preadv`` through ctypes (releases the
GIL), or all of a task's calls in one io_uring batch (:mod:`.uring`), ``O_DIRECT`` for the small
reads of a store larger than the memory that could cache it (:func:`.files.read_past_cache`).

The arguments of every call are computed with numpy first (:func:`plan_iovecs`,
:func:`plan_read_ops`): a group may hold thousands of small pieces, and no Python step runs per
piece except the ``preadv`` fallback loop.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.base import RawChunk
from shardload.load import uring
from shardload.load.files import OpenChunks
from shardload.util import extension
from shardload.util.libc import libc

#: Linux's IOV_MAX: iovecs per ``preadv`` call.
IOV_MAX = 1024

#: A read call goes ``O_DIRECT`` (when the loader reads past the page cache) only when the
#: aligned span it covers is at most this: single rows and short runs, the reads of
#: ``shuffle="uniform"``; longer runs are sequential enough for the page cache's readahead.
DIRECT_MAX_SPAN = 64 << 10
#: Bounce memory of one reader thread's ``O_DIRECT`` reads in flight (one slot per read).
DIRECT_BOUNCE_BYTES = 16 << 20

#: A page-cache read call of at most this many bytes goes through the reader thread's small
#: buffer, its rows then streamed to their places (the compiled ``read_rows``; see
#: :func:`_staged_reads`); it stays in the CPU's cache (a core's L2 holds it with room to spare).
STAGE_BYTES = 256 << 10
#: The arguments of the compiled ``read_rows`` this module passes (the extension's ``ABI``).
KERNEL_ABI = extension.ABI

_PREADV: dict[bool, Any] = {}
_STAGE = threading.local()


def _kernel() -> Any:
    """The compiled ``read_rows`` (``setup.py``'s optional extension), or None where it is not
    built or is an older build (then reads go to their places through io_uring or ``preadv``,
    as before; the same bytes land in the same places either way)."""
    ext = extension.compiled()
    return ext.read_rows if getattr(ext, "ABI", 1) == KERNEL_ABI else None


#: ``read_rows``, or None; ``SHARDLOAD_STAGED_READS=0`` turns it off (io_uring or ``preadv``).
READ_ROWS: Any = _kernel() if os.environ.get("SHARDLOAD_STAGED_READS", "1") != "0" else None


def _preadv(errno: bool = False) -> Any:
    """libc's ``preadv`` through ctypes (releases the GIL), or None where there is none.

    The fast one keeps no ``errno``: ctypes' ``use_errno`` more than doubles the cost of a
    call (about 3 against 1.2 us here), and a small piece is one call. A failed call is
    repeated through the ``errno=True`` one to name the error.
    """
    if errno not in _PREADV:
        fn: Any = None
        if sys.platform.startswith("linux"):
            try:
                proto = ctypes.CFUNCTYPE(
                    ctypes.c_ssize_t,
                    ctypes.c_int,
                    ctypes.c_void_p,
                    ctypes.c_int,
                    ctypes.c_int64,
                    use_errno=errno,
                )
                fn = proto(("preadv", libc(use_errno=errno)))
            except (OSError, AttributeError):
                fn = None
        _PREADV[errno] = fn
    return _PREADV[errno]


def plan_iovecs(
    ptrs: np.ndarray, breaks: np.ndarray, row_bytes: int
) -> tuple[np.ndarray, np.ndarray]:
    """``(k, 2)`` uint64 iovecs (base, length) for consecutive file rows landing at ``ptrs``,
    runs of rows whose destinations follow each other merged, never across a ``breaks`` row
    (a new run starts there; ``breaks`` ends with the row count); and the first iovec of each
    run, with the iovec count at the end (pure).

    >>> iov, first = plan_iovecs(np.array([100, 110, 200, 210]), np.array([0, 3, 4]), 10)
    >>> iov.tolist(), first.tolist()
    ([[100, 20], [200, 10], [210, 10]], [0, 2, 3])
    """
    n = len(ptrs)
    if n == 0:
        return np.zeros((0, 2), np.uint64), np.zeros(1, np.int64)
    new = np.ones(n, bool)
    new[1:] = ptrs[1:] != ptrs[:-1] + np.uint64(row_bytes)
    new[breaks[breaks < n]] = True
    starts = np.flatnonzero(new)
    iov = np.empty((len(starts), 2), np.uint64)
    iov[:, 0] = ptrs[starts]
    iov[:, 1] = np.diff(np.append(starts, n)).astype(np.uint64) * np.uint64(row_bytes)
    return iov, np.searchsorted(starts, breaks)


def plan_read_ops(
    first: np.ndarray, count: np.ndarray, offsets: np.ndarray, nbytes: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Cut runs (iovecs ``first[r]:first[r] + count[r]``, file offset ``offsets[r]``) into read
    calls of at most ``IOV_MAX`` iovecs (pure). ``nbytes`` is the cumulative byte count of the
    iovecs (``nbytes[i]``: bytes before iovec ``i``).

    Returns ``(run, first, count, offset, want)`` per call.

    >>> nb = np.arange(0, 2051 * 10, 10)
    >>> run, f, c, o, w = plan_read_ops(np.array([0, 2000]), np.array([2000, 50]),
    ...                                 np.array([0, 7]), nb)
    >>> run.tolist(), f.tolist(), c.tolist(), o.tolist(), w.tolist()
    ([0, 0, 1], [0, 1024, 2000], [1024, 976, 50], [0, 10240, 7], [10240, 9760, 500])
    """
    calls = -(-count // IOV_MAX)
    run = np.repeat(np.arange(len(count), dtype=np.int64), calls)
    j = np.arange(len(run), dtype=np.int64) - np.repeat(np.cumsum(calls) - calls, calls)
    f = first[run] + j * IOV_MAX
    c = np.minimum(IOV_MAX, first[run] + count[run] - f)
    off = offsets[run] + nbytes[f] - nbytes[first[run]]
    return run, f, c, off, nbytes[f + c] - nbytes[f]


def plan_direct_spans(offsets: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
    """Bytes of the ``uring.DIRECT_ALIGN``-aligned span an ``O_DIRECT`` read of ``nbytes`` at
    ``offsets`` covers (pure).

    >>> plan_direct_spans(np.array([0, 6200, 4095]), np.array([6200, 6200, 2])).tolist()
    [8192, 12288, 8192]
    """
    a = uring.DIRECT_ALIGN
    off = offsets.astype(np.int64)
    return -(-(off + nbytes.astype(np.int64)) // a) * a - off // a * a


def read_runs(
    raw: Callable[[int], RawChunk],
    name: str,
    runs: range,
    run_chunk: np.ndarray,
    run_row: np.ndarray,
    run_iov: np.ndarray,
    iov: np.ndarray,
    chunk_end: np.ndarray,
    files: OpenChunks | None = None,
) -> None:
    """Reader thread: read runs ``runs`` of one array (run ``r``: file rows from
    ``run_row[r]`` of chunk ``run_chunk[r]`` into iovecs ``run_iov[r]:run_iov[r + 1]``).

    Each chunk file is taken from ``files`` (opened and ``fstat``-ed once an epoch; default:
    opened for this call) and its size checked against ``chunk_end[r]`` (the file rows the
    group needs from run ``r``'s chunk) before any read. The arguments of every call are
    computed with numpy first, the chunks' descriptors and places included (a group may hold
    pieces of every chunk: no Python step per chunk); then all calls go to the kernel in one
    io_uring batch (:mod:`.uring`), or, where io_uring cannot be used, one ``preadv`` each (the
    loop around ``preadv`` is then the per-piece cost of small pieces).
    """
    p0, p1 = runs.start, runs.stop
    chunks = run_chunk[p0:p1]
    files = files if files is not None else OpenChunks(limit=0)
    fds, start, row_bytes, owned = files.lookup(raw, name, chunks, chunk_end[p0:p1])
    try:
        offs = start + run_row[p0:p1] * row_bytes
        first, count = run_iov[p0:p1], np.diff(run_iov[p0 : p1 + 1])
        run, f, cnt, off, want = _plan_calls(first, count, offs, iov)
        if (start < 0).any():  # never-written inner chunks: their fill, nothing read
            empty = start < 0
            _fill_runs(raw, chunks, np.flatnonzero(empty), first, count, iov)
            k = ~empty[run]
            run, f, cnt, off, want = run[k], f[k], cnt[k], off[k], want[k]
            if not len(run):
                return
        ptrs = iov.__array_interface__["data"][0] + 16 * f  # .ctypes.data: 4 us a call
        todo = np.arange(len(run))
        if READ_ROWS is not None and not files.direct:  # calls the page cache holds
            todo = np.flatnonzero(_staged_reads(fds[run], off, want, f, cnt, iov) != want)
        ring = uring.thread_ring() if len(todo) else None
        if ring is not None and not files.direct:  # through the page cache: the other calls
            t = todo
            single = (iov[f[t], 0], iov[f[t], 1])  # one-iovec calls go as plain reads
            got = ring.readv(fds[run[t]], ptrs[t].astype(np.uint64), cnt[t], off[t], single)
            bad = t[got != want[t]].tolist()  # read again through preadv
        elif ring is not None:
            got = np.empty(len(run), np.int64)
            # small calls from O_DIRECT descriptors, past the page cache
            span = plan_direct_spans(off, want)
            dfds = files.direct_fds(raw, name, chunks)[run]
            direct = (dfds >= 0) & (span <= DIRECT_MAX_SPAN)
            if direct.any():
                d = np.flatnonzero(direct)
                depth = max(1, DIRECT_BOUNCE_BYTES // int(span[d].max()))
                got[d] = ring.read_direct(
                    dfds[d],
                    off[d],
                    want[d],
                    ptrs[d].astype(np.uint64),
                    cnt[d],
                    depth=depth,
                    first=iov[f[d], 0],
                )
            b = np.flatnonzero(~direct)
            if len(b):
                single = (iov[f[b], 0], iov[f[b], 1])
                got[b] = ring.readv(fds[run[b]], ptrs[b].astype(np.uint64), cnt[b], off[b], single)
            bad = np.flatnonzero(got != want).tolist()  # read again through the page cache
        else:
            bad = todo.tolist()  # every call left through preadv, below
        if bad:
            _preadv_calls(
                raw, name, chunks, fds, run[bad], ptrs[bad], cnt[bad], off[bad], want[bad]
            )
    finally:
        for fd in owned:
            os.close(fd)


def _staged_reads(
    fds: np.ndarray,
    off: np.ndarray,
    want: np.ndarray,
    f: np.ndarray,
    cnt: np.ndarray,
    iov: np.ndarray,
) -> np.ndarray:
    """A task's read calls whose bytes the page cache holds, through the compiled ``read_rows``
    (GIL released, ``RWF_NOWAIT``): each call of at most :data:`STAGE_BYTES` read into this
    thread's small buffer and its rows streamed to their places, so the kernel's copy goes to
    memory in the CPU's cache and the batch rows (memory the caches no longer hold) are written
    without being read first; longer calls are one ``preadv2`` each. Returns the bytes each call
    read: a call not read whole (not cached, short, failed; -1) goes to io_uring and ``preadv``
    after, as every call did before."""
    stage = getattr(_STAGE, "buf", None)
    if stage is None:
        stage = _STAGE.buf = np.empty(STAGE_BYTES, np.uint8)
    a = [np.ascontiguousarray(v, np.int64) for v in (fds, off, want, f, cnt)]
    got = np.empty(len(want), np.int64)
    addr = [v.__array_interface__["data"][0] for v in (*a, iov, got, stage)]
    READ_ROWS(*addr[:5], len(want), *addr[5:], STAGE_BYTES)
    return got


def _plan_calls(
    first: np.ndarray, count: np.ndarray, offs: np.ndarray, iov: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A task's read calls (:func:`plan_read_ops`): ``(run, first, count, offset, want)``."""
    if len(count) and int(count.max()) <= IOV_MAX:  # one call per run: the usual case
        i0 = int(first[0])  # the task's iovecs follow each other: its bytes by run
        want = np.add.reduceat(iov[i0 : i0 + int(count.sum()), 1], first - i0).astype(np.int64)
        return np.arange(len(count)), first, count, offs, want
    nbytes = np.concatenate(([0], np.cumsum(iov[:, 1].astype(np.int64))))
    return plan_read_ops(first, count, offs, nbytes)


def _fill_runs(
    raw: Callable[[int], RawChunk],
    chunks: np.ndarray,
    runs: np.ndarray,
    first: np.ndarray,
    count: np.ndarray,
    iov: np.ndarray,
) -> None:
    """The rows of ``runs`` (in never-written inner chunks) set to their shard's fill row."""
    for r in runs.tolist():
        shard = raw(int(chunks[r])).shard
        assert shard is not None
        row = np.frombuffer(shard.fill_row, np.uint8)
        for base, n in iov[int(first[r]) : int(first[r] + count[r])].tolist():
            dst = np.ctypeslib.as_array((ctypes.c_uint8 * n).from_address(base))
            dst.reshape(-1, len(row))[:] = row


def _preadv_calls(
    raw: Callable[[int], RawChunk],
    name: str,
    chunks: np.ndarray,
    fds: np.ndarray,
    run: np.ndarray,
    ptrs: np.ndarray,
    cnt: np.ndarray,
    off: np.ndarray,
    want: np.ndarray,
) -> None:
    """One ``preadv`` per call (where io_uring is not used, or to read its failures again and
    name the error)."""
    preadv = _preadv()
    calls = zip(run.tolist(), ptrs.tolist(), cnt.tolist(), off.tolist(), want.tolist(), strict=True)
    for r, ptr, m, o, w in calls:
        fd = int(fds[r])
        got1 = preadv(fd, ptr, m, o)
        if got1 != w:
            c = int(chunks[r])
            _read_failed(raw(c).path, name, c, got1, w, (fd, ptr, m, o))


def _read_failed(
    path: str, name: str, chunk: int, got: int, want: int, call: tuple[int, int, int, int]
) -> None:
    fd, ptr, count, off = call
    if got < 0:  # again, to read errno (the fast call keeps none)
        again = _preadv(errno=True)(fd, ptr, count, off)
        err = ctypes.get_errno() if again < 0 else 0
        why = os.strerror(err) if err else f"a read failed, then returned {again}"
    else:
        why = f"expected {want} bytes at offset {off}, got {got}"
    raise ChunkReadError(
        f"chunk {chunk} of array {name!r} could not be read or is truncated: {path} ({why})"
    )
