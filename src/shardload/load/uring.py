"""Many ``preadv`` in one system call: Linux io_uring through ctypes, planned with numpy.

The scatter reader (:mod:`.scatter`) reads a shuffle group as hundreds of small runs (one per
piece of 16 rows with the default shuffle). One ``preadv`` per run costs a ctypes call, a GIL
hand-off and a system call each; here a whole group's runs go to the kernel as one batch of
``IORING_OP_READV`` entries, written into the submission ring by numpy field assignments, and
``io_uring_enter`` calls keep up to a ring's depth (1,024) of them in flight, refilling as
they complete. Reads served from the page cache are done inline in that call; others wait on
the device in parallel (a store larger than RAM). :meth:`Ring.read_direct` reads byte ranges
from ``O_DIRECT`` descriptors through aligned bounce slots (stores larger than memory).

No Python binding of liburing is packaged for our targets, and the ring protocol we need is
small (setup, three ``mmap``s, enter), so it is hand-rolled here (design.md says why). Where
io_uring is missing or refused (kernels before 5.1, ``kernel.io_uring_disabled``, container
seccomp profiles, locked-memory limits), :func:`thread_ring` returns None and the caller falls
back to one ``preadv`` per run. ``SHARDLOAD_IO_URING=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import platform
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from shardload.util.libc import libc

#: io_uring_setup / io_uring_enter: the same numbers on every Linux architecture we run on.
_SYS_SETUP, _SYS_ENTER = 425, 426
_ARCHES = {"x86_64", "amd64", "aarch64", "arm64"}
_OP_READV, _OP_READ = 1, 22  # IORING_OP_READ: Linux 5.6+
_EINVAL = 22
#: Alignment of ``O_DIRECT`` reads (offset, length, buffer): a page, which every block size
#: divides on the file systems and devices we meet.
DIRECT_ALIGN = 4096
_ENTER_GETEVENTS = 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
#: Entries of a ring, tried in turn (its memory: 64 B per entry for the submissions, 32 B for
#: completions, so 96 KiB for 1,024; kernels before 5.12 count it against ``RLIMIT_MEMLOCK``,
#: often 64 KiB, and refuse the larger one). Also the reads one ring keeps in flight: a disk's
#: random-read rate still grows from 256 to 1,024 (docs/benchmarks.md, session 10).
RING_ENTRIES = (1024, 256)

SQE = np.dtype(
    [
        ("opcode", "u1"),
        ("flags", "u1"),
        ("ioprio", "<u2"),
        ("fd", "<i4"),
        ("off", "<u8"),
        ("addr", "<u8"),
        ("len", "<u4"),
        ("rw_flags", "<u4"),
        ("user_data", "<u8"),
        ("buf_index", "<u2"),
        ("personality", "<u2"),
        ("splice_fd_in", "<i4"),
        ("addr3", "<u8"),
        ("pad", "<u8"),
    ]
)
CQE = np.dtype([("user_data", "<u8"), ("res", "<i4"), ("flags", "<u4")])

_SYSCALL: list[Any] = []
_STATE: dict[str, Any] = {}
_LOCAL = threading.local()


def _syscall() -> Any:
    if not _SYSCALL:
        lib = libc(use_errno=True)
        proto = ctypes.CFUNCTYPE(ctypes.c_long, *[ctypes.c_long] * 7, use_errno=True)
        _SYSCALL.append(proto(("syscall", lib)))
    return _SYSCALL[0]


def _u32(m: mmap.mmap, offset: int, n: int = 1) -> np.ndarray:
    return np.frombuffer(m, np.uint32, n, offset)


class Ring:
    """One io_uring instance, used by one thread at a time (each reader thread has its own).

    Raises OSError when the kernel refuses one.
    """

    def __init__(self, entries: int = RING_ENTRIES[0]) -> None:
        params = (ctypes.c_uint32 * 30)()  # struct io_uring_params: 120 bytes
        fd = _syscall()(_SYS_SETUP, entries, ctypes.addressof(params), 0, 0, 0, 0, 0)
        if fd < 0:
            err = ctypes.get_errno()
            raise OSError(err, f"io_uring_setup: {os.strerror(err)}")
        self.fd, self.pid = int(fd), os.getpid()
        self._maps: list[mmap.mmap] = []
        try:
            p = np.frombuffer(memoryview(params).cast("B"), np.uint32)
            sq_n, cq_n, sq, cq = int(p[0]), int(p[1]), p[10:20], p[20:30]
            sq_map = self._map(int(sq[6]) + 4 * sq_n, _OFF_SQ_RING)
            cq_map = self._map(int(cq[5]) + 16 * cq_n, _OFF_CQ_RING)
            sqe_map = self._map(64 * sq_n, _OFF_SQES)
            # reads in flight at most: the completion queue never overflows
            self.depth = min(sq_n, cq_n)
            self.sq_tail, self.sq_mask = _u32(sq_map, int(sq[1])), int(_u32(sq_map, int(sq[2]))[0])
            self.sq_array = _u32(sq_map, int(sq[6]), sq_n)
            self.cq_head, self.cq_tail = _u32(cq_map, int(cq[0])), _u32(cq_map, int(cq[1]))
            self.cq_mask = int(_u32(cq_map, int(cq[2]))[0])
            self.cqes = np.frombuffer(cq_map, CQE, cq_n, int(cq[5]))
            self.sqes = np.frombuffer(sqe_map, SQE, sq_n)  # fields we do not set stay zero
        except BaseException:
            self.close()
            raise

    def _map(self, size: int, offset: int) -> mmap.mmap:
        m = mmap.mmap(
            self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE, offset=offset
        )
        self._maps.append(m)
        return m

    def close(self) -> None:
        # numpy views keep the mmaps' buffers exported: drop them before closing
        for attr in ("sq_tail", "sq_array", "cq_head", "cq_tail", "cqes", "sqes"):
            self.__dict__.pop(attr, None)
        for m in self._maps:
            with contextlib.suppress(BufferError):  # a view still alive: the GC unmaps it
                m.close()
        self._maps = []
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def __del__(self) -> None:
        if getattr(self, "fd", -1) >= 0 and getattr(self, "pid", None) == os.getpid():
            self.close()

    def readv(
        self,
        fds: np.ndarray,
        iovs: np.ndarray,
        counts: np.ndarray,
        offsets: np.ndarray,
        single: tuple[np.ndarray, np.ndarray] | None = None,
        *,
        depth: int | None = None,
    ) -> np.ndarray:
        """``preadv(fds[i], iovs[i], counts[i], offsets[i])`` for every ``i``, with up to
        ``depth`` (default and at most :attr:`depth`) in flight. Returns each read's result
        (bytes, or ``-errno``); the results do not depend on ``depth``.

        Submission is continuous: each ``io_uring_enter`` (the GIL released) submits the
        entries that completions have made room for and waits for about ``depth / 8`` more
        completions, so the kernel always holds close to ``depth`` reads, where rounds that
        wait for their slowest read leave the device idle at each round's end (a disk's random
        reads are fast only at high queue depth: docs/benchmarks.md, session 10).

        ``single``: ``(base, length)`` of each entry's first iovec; an entry of one iovec then
        goes as a plain ``IORING_OP_READ`` into it (no iovec array for the kernel to copy and
        check: a few % of a one-row read), where the kernel has it (Linux 5.6+; an entry that
        fails with ``EINVAL`` turns them off for the process, and the caller reads it again).
        """
        n = len(fds)
        res = np.empty(n, np.int64)
        if n == 0:
            return res
        todo = np.zeros(n, SQE)  # every entry, written once; copied into the ring in slices
        todo["opcode"], todo["fd"], todo["off"] = _OP_READV, fds, offsets
        todo["addr"], todo["len"] = iovs, counts
        todo["user_data"] = np.arange(n, dtype=np.uint64)
        one = None
        if single is not None and _STATE.get("read_op", True):
            one = counts == 1
            todo["opcode"][one] = _OP_READ
            todo["addr"][one], todo["len"][one] = single[0][one], single[1][one]

        def done(idx: np.ndarray, r: np.ndarray) -> None:
            res[idx] = r

        self._run(todo, depth, None, done)
        if one is not None and (res[one] == -_EINVAL).any():  # no IORING_OP_READ here
            _STATE["read_op"] = False
        return res

    def read_direct(
        self,
        fds: np.ndarray,
        offsets: np.ndarray,
        nbytes: np.ndarray,
        iov_ptrs: np.ndarray,
        counts: np.ndarray,
        *,
        depth: int | None = None,
        first: np.ndarray | None = None,
    ) -> np.ndarray:
        """Read ``nbytes[i]`` bytes at ``offsets[i]`` of ``fds[i]`` (opened with ``O_DIRECT``)
        into the ``counts[i]`` iovecs at ``iov_ptrs[i]``: the kernel reads the aligned span of
        ``DIRECT_ALIGN``-byte blocks holding them into a bounce slot, the wanted bytes are
        copied out as each read completes and the slot is reused. Slots: one per read in
        flight (``depth``, default and at most :attr:`depth`), each the largest span.
        ``first``: the base of each read's first iovec (saves reading it back).

        Returns ``nbytes[i]`` for each read that delivered, else its result (``-errno``, or a
        short count): the caller reads those again through the page cache (a file system that
        refuses unaligned or direct reads says ``EINVAL`` here).
        """
        n = len(fds)
        res = np.empty(n, np.int64)
        if n == 0:
            return res
        a = np.uint64(DIRECT_ALIGN)
        offsets, nbytes = offsets.astype(np.uint64), nbytes.astype(np.uint64)
        lo = offsets // a * a
        hi = -(-(offsets + nbytes) // a) * a
        skip = (offsets - lo).astype(np.int64)
        slot_bytes = int((hi - lo).max())
        depth = min(n, self.depth if depth is None else max(1, min(int(depth), self.depth)))
        bounce = np.empty(depth * slot_bytes + DIRECT_ALIGN, np.uint8)
        base = -bounce.ctypes.data % DIRECT_ALIGN + bounce.ctypes.data
        todo = np.zeros(n, SQE)
        todo["opcode"], todo["fd"], todo["off"] = _OP_READ, fds, lo
        todo["len"] = (hi - lo).astype(np.uint32)
        todo["user_data"] = np.arange(n, dtype=np.uint64)
        free = list(range(depth))
        slot_of = np.empty(n, np.int64)
        want = (skip + nbytes.astype(np.int64)).tolist()
        skips, sizes, ptrs, cnts = (
            skip.tolist(),
            nbytes.tolist(),
            iov_ptrs.tolist(),
            counts.tolist(),
        )
        bases = first.tolist() if first is not None else None
        move = ctypes.memmove

        def fill(idx: np.ndarray, sqes: np.ndarray) -> None:
            slots = np.array(free[-len(idx) :], np.int64)
            del free[-len(idx) :]
            slot_of[idx] = slots
            sqes["addr"] = (base + slot_bytes * slots).astype(np.uint64)

        def done(idx: np.ndarray, r: np.ndarray) -> None:
            for i, got in zip(idx.tolist(), r.tolist(), strict=True):
                slot = int(slot_of[i])
                free.append(slot)
                if got < want[i]:
                    res[i] = got if got < 0 else max(0, got - skips[i])
                    continue
                src = base + slot * slot_bytes + skips[i]
                if cnts[i] == 1:
                    dst = bases[i] if bases is not None else _IOV.from_address(ptrs[i]).base
                    move(dst, src, sizes[i])
                else:
                    iov = (_IOV * cnts[i]).from_address(ptrs[i])
                    for v in iov:
                        move(v.base, src, v.len)
                        src += v.len
                res[i] = sizes[i]

        self._run(todo, depth, fill, done)
        del bounce  # the kernel is done with every slot
        return res

    def _run(
        self,
        todo: np.ndarray,
        depth: int | None,
        fill: Callable[[np.ndarray, np.ndarray], None] | None,
        done: Callable[[np.ndarray, np.ndarray], None],
    ) -> None:
        """Submit the entries ``todo`` (their ``user_data``: their index) with up to ``depth``
        in flight, continuously: each ``io_uring_enter`` submits what completions made room for
        and waits for about ``depth / 8`` more. ``fill(idx, sqes)`` may finish the entries
        ``idx`` (``sqes``: their copies in the ring) before they go; ``done(idx, res)`` gets
        each batch of completions."""
        n = len(todo)
        depth = self.depth if depth is None else max(1, min(int(depth), self.depth))
        enter = _syscall()
        sqes, sq_array, sq_mask = self.sqes, self.sq_array, self.sq_mask
        slots = np.arange(len(sqes), dtype=np.uint32)
        sent = got = pending = 0  # pending: written into the ring, not yet taken by the kernel
        while got < n:
            k = min(n - sent, depth - (sent - got)) if pending == 0 else 0
            if k > 0:  # the kernel took every earlier entry: their slots are free again
                sqes[:k] = todo[sent : sent + k]
                if fill is not None:
                    fill(np.arange(sent, sent + k), sqes[:k])
                tail = int(self.sq_tail[0])
                sq_array[(tail + slots[:k]) & sq_mask] = slots[:k]
                self.sq_tail[0] = (tail + k) & 0xFFFFFFFF
                sent += k
                pending = k
            flight = sent - got
            wait = flight if sent == n else max(1, min(flight, depth // 8))
            r = enter(_SYS_ENTER, self.fd, pending, wait, _ENTER_GETEVENTS, 0, 0, 0)
            if r < 0:
                err = ctypes.get_errno()
                if err not in (4, 11, 16):  # EINTR, EAGAIN, EBUSY: reap, then ask again
                    raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
            else:
                pending -= min(pending, int(r))
            head, ctail = int(self.cq_head[0]), int(self.cq_tail[0])
            m = (ctail - head) & 0xFFFFFFFF
            if m:
                c = self.cqes[(head + np.arange(m)) & self.cq_mask]
                self.cq_head[0] = ctail
                got += m
                done(c["user_data"].astype(np.int64), c["res"].astype(np.int64))


class _IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_size_t), ("len", ctypes.c_size_t)]


def _usable() -> bool:
    """Whether this process may use io_uring (checked once: a ring is set up and closed)."""
    if "usable" not in _STATE:
        ok = (
            sys.platform.startswith("linux")
            and platform.machine().lower() in _ARCHES
            and os.environ.get("SHARDLOAD_IO_URING", "1").strip().lower()
            not in ("0", "false", "no", "off")
        )
        if ok:
            try:
                Ring(8).close()
            except (OSError, ValueError, AttributeError):
                ok = False
        _STATE["usable"] = ok
    return bool(_STATE["usable"])


def usable() -> bool:
    """Whether this process reads through io_uring (else one ``preadv`` per run)."""
    return _usable()


def thread_ring() -> Ring | None:
    """This thread's ring (set up on first use; a forked child sets up its own), or None
    where io_uring cannot be used (the caller reads with one ``preadv`` per run)."""
    if not _usable():
        return None
    ring = getattr(_LOCAL, "ring", None)
    if ring is None or ring.pid != os.getpid():
        ring = None
        for entries in RING_ENTRIES:
            try:
                ring = Ring(entries)
                break
            except OSError:  # e.g. out of locked memory: a smaller ring, or preadv
                continue
        if ring is None:
            return None
        _LOCAL.ring = ring
    return ring


def reset_for_tests(enabled: bool | None) -> None:
    """Forget whether io_uring is usable (``None``), or force it on (where it works) or off."""
    _STATE.clear()
    _LOCAL.__dict__.clear()
    if enabled is False:
        _STATE["usable"] = False
