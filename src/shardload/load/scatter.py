"""Scatter reads: a shuffle group's rows go from the page cache straight to their batch rows.

For uncompressed local chunk files (:class:`~shardload.formats.base.RawChunk`: shardload's
Zarr arrays without compression, npy stacks), a shuffle needs no gather. Each row of a group
has a known place in the worker's stream of batches (its position in the group's ``order``),
so the batches of a group are allocated first and the file's rows are copied into their
places: one copy from the page cache, where reading into a group buffer and gathering out of
it costs two, and no group buffer at all.

A group is planned with numpy as a whole (it may hold thousands of small pieces, or single
rows with ``shuffle="uniform"``): its rows sorted by (chunk, file row), cut into runs of
consecutive file rows, one ``preadv`` per run (at most 1,024 iovecs a call), destinations
that follow each other merged into one iovec. ``preadv`` runs through ctypes, which releases
the GIL, in the reader threads; each chunk file is opened once per reader task.

A store larger than the memory that could cache it (:func:`read_past_cache`) has its small
reads (the single rows of ``shuffle="uniform"``) read with ``O_DIRECT`` through io_uring
(:meth:`.uring.Ring.read_direct`): aligned blocks into bounce slots, the row copied out,
past the page cache.

Memory: the batches of the group being yielded and of the groups read ahead (``prefetch``, in
chunks, rounded up to whole groups), which is what the batches would cost anyway; with
``O_DIRECT`` reads, at most ``DIRECT_BOUNCE_BYTES`` of bounce slots per reader thread.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, PlanError
from shardload.formats.base import RawChunk, RawChunks
from shardload.load import uring
from shardload.load.checks import check_indices
from shardload.load.recycle import Allocate
from shardload.plan.epoch import EpochPlan, group_batches, iter_worker_spans
from shardload.plan.spans import Spans, spans_chunks, spans_rows
from shardload.store.core import Store

#: Linux's IOV_MAX: iovecs per ``preadv`` call.
IOV_MAX = 1024

#: A read call goes ``O_DIRECT`` (when the loader reads past the page cache) only when the
#: aligned span it covers is at most this: single rows and short runs, the reads of
#: ``shuffle="uniform"``; longer runs are sequential enough for the page cache's readahead.
DIRECT_MAX_SPAN = 64 << 10
#: Direct reads when the store is more than this many times the memory that could cache it.
#: Measured (docs/benchmarks.md, session 10): at 3.2x (6.2 KB rows) direct reads ran 1.3-1.55x
#: the page cache's rate; at 1.4x (1 KB rows, most reads hitting the cache) 0.68x.
DIRECT_STORE_FACTOR = 2
#: Bounce memory of one reader thread's ``O_DIRECT`` reads in flight (one slot per read).
DIRECT_BOUNCE_BYTES = 16 << 20
#: With direct reads, one reader task per group (not one per reader thread).
DIRECT_ONE_TASK = True

_PREADV: dict[bool, Any] = {}
_O_CLOEXEC, _O_DIRECT = getattr(os, "O_CLOEXEC", 0), getattr(os, "O_DIRECT", 0)


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
                lib = ctypes.util.find_library("c") or "libc.so.6"
                proto = ctypes.CFUNCTYPE(
                    ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                    ctypes.c_int64, use_errno=errno,
                )  # fmt: skip
                fn = proto(("preadv", ctypes.CDLL(lib, use_errno=errno)))
            except (OSError, AttributeError):
                fn = None
        _PREADV[errno] = fn
    return _PREADV[errno]


def raw_rows(store: Store, names: Sequence[str]) -> bool:
    """True when every array in ``names`` is stored as raw rows in local files (uncompressed
    shardload Zarr, local npy stacks): reading part of a chunk costs no more per row than the
    whole chunk. Depends on the store only (never on the platform), so every rank agrees."""
    reader = store.reader
    if not isinstance(reader, RawChunks) or not names:
        return False
    try:
        return all(reader.raw_chunk(n, 0) is not None for n in names)
    except Exception:  # e.g. a missing first chunk: the gather path reports it, naming it
        return False


def raw_sources(store: Store, names: Sequence[str]) -> Callable[[str, int], RawChunk] | None:
    """``raw(name, chunk)`` when every array in ``names`` is raw rows in local files and this
    platform has ``preadv``; else None (the loader reads into group buffers and gathers)."""
    reader = store.reader
    if _preadv() is None or not raw_rows(store, names):
        return None
    assert isinstance(reader, RawChunks)

    def raw(name: str, chunk: int) -> RawChunk:
        got = reader.raw_chunk(name, chunk)
        assert got is not None
        return got

    return raw


def plan_group_reads(
    chunks: np.ndarray, file_rows: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort a group's wanted rows by (chunk, file row) and cut them into *runs* of consecutive
    file rows of one chunk, each read by one ``preadv`` (pure).

    Returns ``(order, run_starts, run_chunk)``: ``order`` sorts the rows; run ``r`` is the
    sorted rows ``run_starts[r]:run_starts[r + 1]`` (``run_starts`` ends with the row count).

    >>> o, s, c = plan_group_reads(np.array([1, 0, 1, 0, 1]), np.array([5, 9, 4, 8, 7]))
    >>> o.tolist(), s.tolist(), c.tolist()
    ([3, 1, 2, 0, 4], [0, 2, 4, 5], [0, 1, 1])
    """
    if len(file_rows) and int(file_rows.max()) < 1 << 32:  # one int64 key: 1/4 of lexsort
        order = np.argsort((chunks.astype(np.int64) << 32) | file_rows.astype(np.int64))
    else:
        order = np.lexsort((file_rows, chunks))
    c, r = chunks[order], file_rows[order]
    brk = np.ones(len(order), bool)
    brk[1:] = (c[1:] != c[:-1]) | (r[1:] != r[:-1] + 1)
    starts = np.flatnonzero(brk)
    return order, np.append(starts, len(order)), c[starts]


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
    raw: Callable[[int], RawChunk], name: str, runs: range, run_chunk: np.ndarray,
    run_row: np.ndarray, run_iov: np.ndarray, iov: np.ndarray, chunk_end: np.ndarray,
    files: OpenChunks | None = None,
) -> None:  # fmt: skip
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
        nbytes = np.concatenate(([0], np.cumsum(iov[:, 1].astype(np.int64))))
        run, f, cnt, off, want = plan_read_ops(first, count, offs, nbytes)
        ptrs = iov.ctypes.data + 16 * f
        ring = uring.thread_ring()
        if ring is not None:
            got = np.empty(len(run), np.int64)
            direct = np.zeros(len(run), bool)
            if files.direct:  # small calls from O_DIRECT descriptors, past the page cache
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
                single = (iov[f[b], 0], iov[f[b], 1])  # one-iovec calls go as plain reads
                got[b] = ring.readv(fds[run[b]], ptrs[b].astype(np.uint64), cnt[b], off[b], single)
            bad = np.flatnonzero(got != want).tolist()  # read again through the page cache
        else:
            bad = list(range(len(run)))  # every call through preadv, below
        preadv = _preadv()
        calls = zip(
            run[bad].tolist(), ptrs[bad].tolist(), cnt[bad].tolist(), off[bad].tolist(),
            want[bad].tolist(), strict=True,
        )  # fmt: skip
        for r, ptr, m, o, w in calls:  # io_uring's failures again, to name the error
            fd = int(fds[r])
            got1 = preadv(fd, ptr, m, o)
            if got1 != w:
                c = int(chunks[r])
                _read_failed(raw(c).path, name, c, got1, w, (fd, ptr, m, o))
    finally:
        for fd in owned:
            os.close(fd)


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


class OpenChunks:
    """The chunk files one scatter reader keeps open for an epoch, shared by its reader
    threads: each opened and ``fstat``-ed once, where opening it for every group cost about 5%
    of an epoch's CPU with 512 pieces a group. Per array, a table indexed by chunk id holds
    each open chunk's descriptor, data offset, row size and file size, so a group's chunks
    are looked up and checked with numpy (:meth:`lookup`). At most ``limit`` stay open
    (default: a quarter of the soft ``RLIMIT_NOFILE``, at most 1,024); past that a reader
    opens and closes its own. :meth:`close` once no reader uses them."""

    def __init__(self, limit: int | None = None, *, direct: bool = False) -> None:
        self.limit = _fd_budget() if limit is None else limit
        #: whether small reads go through ``O_DIRECT`` descriptors (:meth:`direct_fds`)
        self.direct = direct
        self._tables: dict[str, np.ndarray] = {}  # name -> (4, chunks): fd, offset, row, size
        self._direct: dict[str, np.ndarray] = {}  # name -> O_DIRECT fd per chunk (-2: refused)
        self._count = 0
        self._lock = threading.Lock()

    def direct_fds(
        self, raw: Callable[[int], RawChunk], name: str, chunks: np.ndarray
    ) -> np.ndarray:
        """An ``O_DIRECT`` descriptor for each of ``chunks`` (after :meth:`lookup` checked
        them), or -1 where there is none: the file system refuses ``O_DIRECT`` (the caller
        reads through the page cache), or the descriptor budget is spent."""
        with self._lock:
            t = self._direct.get(name)
            top = int(chunks.max(initial=-1)) + 1
            if t is None or len(t) < top:
                new = np.full(max(top, 2 * (0 if t is None else len(t))), -1, np.int64)
                if t is not None:
                    new[: len(t)] = t
                t = self._direct[name] = new
            for c in np.unique(chunks[t[chunks] == -1]).tolist():
                if self._count >= self.limit:
                    break
                try:
                    t[c] = os.open(raw(c).path, os.O_RDONLY | _O_CLOEXEC | _O_DIRECT)
                    self._count += 1
                except OSError:  # EINVAL: no O_DIRECT here; a vanished file: lookup names it
                    t[c] = -2
            return np.maximum(t[chunks], -1)

    def _table(self, name: str, chunks: int) -> np.ndarray:  # under the lock
        t = self._tables.get(name)
        if t is None or t.shape[1] < chunks:
            new = np.full((4, max(chunks, 2 * (0 if t is None else t.shape[1]))), -1, np.int64)
            if t is not None:
                new[:, : t.shape[1]] = t
            t = self._tables[name] = new
        return t

    def lookup(
        self, raw: Callable[[int], RawChunk], name: str, chunks: np.ndarray, rows: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
        """``(fd, offset, row_bytes, owned)`` for each of ``chunks`` (chunk ids of ``name``,
        repeats allowed), each chunk checked to hold ``rows`` rows (per entry); ``owned``: the
        descriptors the caller closes (the cache was full)."""
        with self._lock:
            t = self._tables.get(name)
            if t is None or t.shape[1] <= int(chunks.max(initial=-1)):
                t = self._table(name, int(chunks.max()) + 1)
            got = t[:, chunks]
            miss = got[0] < 0
            if miss.any():  # first use of these chunks this epoch
                for c in np.unique(chunks[miss]).tolist():
                    if self._count >= self.limit:
                        break
                    fd, rc, size = _open_sized(raw(c), name, c)
                    t[:, c] = fd, rc.offset, rc.row_bytes, size
                    self._count += 1
                got = t[:, chunks]
                miss = got[0] < 0
        owned: list[int] = []
        try:
            if miss.any():  # over the limit: opened here, closed by the caller
                for c in np.unique(chunks[miss]).tolist():
                    fd, rc, size = _open_sized(raw(c), name, c)
                    owned.append(fd)
                    got[:, chunks == c] = np.array([fd, rc.offset, rc.row_bytes, size])[:, None]
            fd, offset, row_bytes, size = got
            short = size < offset + rows * row_bytes
            if short.any():
                i = int(np.flatnonzero(short)[0])
                c, want = int(chunks[i]), int(offset[i] + rows[i] * row_bytes[i])
                raise ChunkReadError(
                    f"chunk {c} of array {name!r} is truncated or corrupt: {raw(c).path} has "
                    f"{int(size[i])} bytes, rows up to {int(rows[i])} need {want}"
                )
        except BaseException:
            for d in owned:
                os.close(d)
            raise
        return fd, offset, row_bytes, owned

    def close(self) -> None:
        with self._lock:
            fds = [int(fd) for t in self._tables.values() for fd in t[0] if fd >= 0]
            fds += [int(fd) for t in self._direct.values() for fd in t if fd >= 0]
            self._tables.clear()
            self._direct.clear()
            self._count = 0
        for fd in fds:
            os.close(fd)


def _fd_budget() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(0, min(1024, int(soft) // 4))


def _open_sized(rc: RawChunk, name: str, chunk: int) -> tuple[int, RawChunk, int]:
    try:
        fd = os.open(rc.path, os.O_RDONLY | _O_CLOEXEC)
    except OSError as exc:
        raise ChunkReadError.from_os_error(exc, f"chunk {chunk}", name, rc.path) from exc
    try:
        size = os.fstat(fd).st_size
    except OSError as exc:
        os.close(fd)
        raise ChunkReadError.from_os_error(exc, f"chunk {chunk}", name, rc.path) from exc
    return fd, rc, size


def read_past_cache(store_bytes: int) -> bool:
    """Whether this process reads a store of ``store_bytes`` with ``O_DIRECT`` small reads: the
    store is more than ``DIRECT_STORE_FACTOR`` times the memory that could cache it
    (:func:`memory_bytes`), so a small read mostly misses the page cache anyway, and going past
    it reads aligned blocks once (a 6.2 KB row spans 2-3 pages; through the page cache, evicted
    neighbours were fetched again) with no reclaim, at the device's higher direct random-read
    rate (docs/benchmarks.md, session 10). Needs io_uring (:mod:`.uring`).
    ``SHARDLOAD_O_DIRECT=0`` / ``1`` turns it off / on whatever the sizes."""
    env = os.environ.get("SHARDLOAD_O_DIRECT", "auto").strip().lower()
    if not _O_DIRECT or env in ("0", "false", "no", "off"):
        return False
    if env not in ("1", "true", "yes", "on"):
        limit = memory_bytes()
        if limit is None or store_bytes <= DIRECT_STORE_FACTOR * limit:
            return False
    return uring.usable()


def memory_bytes() -> int | None:
    """Memory this process's page cache may hold: ``MemAvailable`` (which counts the page
    cache that can be reclaimed), or this cgroup's memory limit (v1 or v2) where lower; None
    where unknown."""
    found: list[int] = []
    try:
        with open("/proc/meminfo") as f:
            info = {ln.split(":")[0]: int(ln.split()[1]) * 1024 for ln in f if ln.strip()}
        found.append(info["MemAvailable"])
    except (OSError, KeyError, ValueError, IndexError):
        pass
    try:
        with open("/proc/self/cgroup") as f:
            lines = [ln.rstrip("\n").split(":", 2) for ln in f]
    except OSError:
        lines = []
    for _, ctrl, path in (ln for ln in lines if len(ln) == 3):
        if ctrl == "":  # v2: memory.max of this cgroup and its parents
            base, name = "/sys/fs/cgroup", "memory.max"
        elif "memory" in ctrl.split(","):
            base, name = "/sys/fs/cgroup/memory", "memory.limit_in_bytes"
        else:
            continue
        parts = [p for p in path.split("/") if p]
        for k in range(len(parts), -1, -1):
            try:
                with open(os.path.join(base, *parts[:k], name)) as f:
                    text = f.read().strip()
            except OSError:
                continue
            if text.isdigit() and int(text) < 1 << 60:  # "max" or ~2**63: no limit
                found.append(int(text))
    return min(found) if found else None


def groups_in_flight(*, prefetch: int, shuffle_chunks: int) -> int:
    """Shuffle groups a scatter reader fills at once: the current one and
    ``ceil(prefetch / shuffle_chunks)`` ahead (pure).

    >>> groups_in_flight(prefetch=4, shuffle_chunks=4), groups_in_flight(prefetch=0, shuffle_chunks=4)
    (2, 1)
    """
    return 1 + math.ceil(prefetch / max(1, shuffle_chunks))


def batches_per_group(*, chunk_rows: int, shuffle_chunks: int, batch_size: int) -> int:
    """Most batches one shuffle group's rows touch (one more when a batch straddles groups)."""
    return -(-max(1, shuffle_chunks) * chunk_rows // max(1, batch_size)) + 1


def scatter_batches(
    store: Store, names: Sequence[str], plan: EpochPlan, rank: int, worker: int, *,
    raw: Callable[[str, int], RawChunk], prefetch: int, threads: int,
    new_batch: Callable[[int], dict[str, np.ndarray]], index_key: str,
    allocate: Allocate | None = None,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """The worker's batches, in plan order, read by scatter; ``index_key`` holds the global
    rows. Batches come from ``allocate(n)`` (or ``new_batch(n)`` when it gives None).

    Groups are planned whole: the current one and ``ceil(prefetch / shuffle_chunks)`` ahead
    (more while a batch still straddles unread groups). Planning a group (allocating its
    batches, writing their index rows, cutting the iovecs) takes a few ms, so it runs in a
    planner thread of its own, off the path of the batch being yielded; the planner hands the
    group's reads to ``threads`` reader threads. A batch is yielded once every group holding
    some of its rows is read. Closing the iterator waits for the plans and reads in flight, so
    no thread writes into a batch's memory after the caller reclaims it.
    """
    b = plan.batch_size
    total = plan.workers[rank][worker].num_rows
    num_batches = -(-total // b)
    ahead = groups_in_flight(prefetch=prefetch, shuffle_chunks=plan.shuffle_chunks)
    batches: dict[int, dict[str, np.ndarray]] = {}  # written by the planner, popped here
    inflight: deque[tuple[int, int, Future[list[Future[None]]]]] = deque()
    readers = max(1, threads)
    pool = ThreadPoolExecutor(max_workers=readers, thread_name_prefix="shardload-read")
    store_bytes = sum(
        store.manifest.arrays[a].row_bytes * int(store.manifest.chunk_bounds[-1]) for a in names
    )
    files = OpenChunks(direct=read_past_cache(store_bytes))  # closed once the readers stopped
    planner = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardload-plan")
    groups = iter_worker_spans(plan, rank, worker)
    bounds = np.asarray(store.manifest.chunk_bounds, dtype=np.int64)
    at = 0  # stream position of the next group's first row (main thread only)
    raws: dict[str, dict[int, RawChunk]] = {a: {} for a in names}  # planner thread only

    def batch(k: int) -> dict[str, np.ndarray]:  # planner thread only
        if k not in batches:
            size = min(b, total - k * b)
            batches[k] = (allocate(size) if allocate else None) or new_batch(size)
        return batches[k]

    def raw_of(a: str) -> Callable[[int], RawChunk]:
        cache = raws[a]

        def get(chunk: int) -> RawChunk:
            rc = cache.get(chunk)
            if rc is None:
                rc = cache[chunk] = raw(a, chunk)
            return rc

        return get

    def plan_group(spans: Spans, order: np.ndarray, at: int, n: int) -> list[Future[None]]:
        """Planner thread: allocate the group's batches, fill their index, submit its reads
        (all of it vectorised over the group's rows: a group may hold thousands of pieces)."""
        if n <= 0:
            return []
        want = order[:n]
        where = f"worker {worker} of rank {rank}: a group's order"
        check_indices(want, int(spans.cum[-1]) if len(spans) else 0, where)
        rows = spans_rows(spans)[want]  # global rows, in stream order
        chunks = spans_chunks(spans)[want]
        cut = group_batches(at, n, b)
        k0 = int(cut[0, 0])
        outs = [batch(int(k)) for k in cut[:, 0]]
        for (_, dst, src, cnt), out in zip(cut.tolist(), outs, strict=True):
            out[index_key][dst : dst + cnt] = rows[src : src + cnt]
        srt, run_starts, run_chunk = plan_group_reads(chunks, rows - bounds[chunks])
        pos = (at + srt).astype(np.uint64)  # stream position of each sorted row
        file_rows = (rows - bounds[chunks])[srt]
        run_row = file_rows[run_starts[:-1]]
        # the file rows each run's chunk must hold: runs are sorted by (chunk, row), so the
        # end of a chunk's last run, spread over its runs
        last = np.flatnonzero(np.append(run_chunk[1:] != run_chunk[:-1], True))
        chunk_end = np.repeat(file_rows[run_starts[last + 1] - 1] + 1, np.diff(last, prepend=-1))
        k_of = (pos // np.uint64(b)).astype(np.int64) - k0
        in_b = pos % np.uint64(b)
        futs: list[Future[None]] = []
        nruns = len(run_chunk)
        # direct reads wait on the device, not the CPU: one reader thread takes the whole
        # group, so its ring stays full for longer between the drains at a task's end (the
        # next group goes to another reader meanwhile): 1.12x the rows/s of one task per
        # reader thread, peak RSS 177 against 145 MiB (docs/benchmarks.md, session 10)
        one_task = files.direct and DIRECT_ONE_TASK
        parts = np.linspace(0, nruns, (1 if one_task else readers) + 1).astype(np.int64)
        for a in names:
            bases = np.array([o[a].ctypes.data for o in outs], np.uint64)
            rb = raws_row_bytes[a]
            ptrs = bases[k_of] + in_b * np.uint64(rb)
            iov, run_iov = plan_iovecs(ptrs, run_starts, rb)
            for p0, p1 in zip(parts[:-1].tolist(), parts[1:].tolist(), strict=True):
                if p1 > p0:
                    futs.append(pool.submit(
                        read_runs, raw_of(a), a, range(p0, p1), run_chunk, run_row, run_iov,
                        iov, chunk_end, files,
                    ))  # fmt: skip
        return futs

    raws_row_bytes = {
        a: int(np.prod(store.manifest.arrays[a].row_shape, dtype=np.int64))
        * np.dtype(store.manifest.arrays[a].dtype).itemsize
        for a in names
    }

    try:
        exhausted = False
        for k in range(num_batches):
            end = min((k + 1) * b, total)
            while not exhausted and (len(inflight) < ahead or at < end):
                g = next(groups, None)
                if g is None:
                    exhausted = True
                else:
                    n = min(len(g[1]), total - at)
                    inflight.append((at, at + n, planner.submit(plan_group, *g, at, n)))
                    at += n
            if at < end:
                raise PlanError(f"worker {worker} of rank {rank}: the plan ended inside a batch")
            for start, _, planned in inflight:
                if start >= end:
                    break
                for f in planned.result():
                    f.result()  # re-raises a plan or read error here, in the consuming thread
            out = batches.pop(k)
            while inflight and inflight[0][1] <= end:
                inflight.popleft()
            yield out
    finally:
        planner.shutdown(wait=True, cancel_futures=True)
        pool.shutdown(wait=True, cancel_futures=True)
        files.close()
