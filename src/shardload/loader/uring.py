"""Many ``preadv`` in one system call: Linux io_uring through ctypes, planned with numpy.

The scatter reader (:mod:`.scatter`) reads a shuffle group as hundreds of small runs (one per
piece of 16 rows with the default shuffle). One ``preadv`` per run costs a ctypes call, a GIL
hand-off and a system call each; here a whole group's runs go to the kernel as one batch of
``IORING_OP_READV`` entries, written into the submission ring by numpy field assignments, and
one ``io_uring_enter`` submits them and waits for all. Reads served from the page cache are
done inline in that call; others are handed to the kernel's own worker threads (so a store
larger than RAM gets its reads in parallel too).

No Python binding of liburing is packaged for our targets, and the ring protocol we need is
small (setup, three ``mmap``s, enter), so it is hand-rolled here (design.md says why). Where
io_uring is missing or refused (kernels before 5.1, ``kernel.io_uring_disabled``, container
seccomp profiles, locked-memory limits), :func:`thread_ring` returns None and the caller falls
back to one ``preadv`` per run. ``SHARDLOAD_IO_URING=0`` turns it off.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import mmap
import os
import platform
import sys
import threading
from typing import Any

import numpy as np

#: io_uring_setup / io_uring_enter: the same numbers on every Linux architecture we run on.
_SYS_SETUP, _SYS_ENTER = 425, 426
_ARCHES = {"x86_64", "amd64", "aarch64", "arm64"}
_OP_READV, _OP_READ = 1, 22  # IORING_OP_READ: Linux 5.6+
_EINVAL = 22
_ENTER_GETEVENTS = 1
_OFF_SQ_RING, _OFF_CQ_RING, _OFF_SQES = 0, 0x8000000, 0x10000000
#: Entries of a ring (its memory: about 64 B per entry for the submissions, 32 B for completions).
RING_ENTRIES = 256

SQE = np.dtype(
    [("opcode", "u1"), ("flags", "u1"), ("ioprio", "<u2"), ("fd", "<i4"), ("off", "<u8"),
     ("addr", "<u8"), ("len", "<u4"), ("rw_flags", "<u4"), ("user_data", "<u8"),
     ("buf_index", "<u2"), ("personality", "<u2"), ("splice_fd_in", "<i4"), ("addr3", "<u8"),
     ("pad", "<u8")]
)  # fmt: skip
CQE = np.dtype([("user_data", "<u8"), ("res", "<i4"), ("flags", "<u4")])

_SYSCALL: list[Any] = []
_STATE: dict[str, Any] = {}
_LOCAL = threading.local()


def _syscall() -> Any:
    if not _SYSCALL:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        proto = ctypes.CFUNCTYPE(ctypes.c_long, *[ctypes.c_long] * 7, use_errno=True)
        _SYSCALL.append(proto(("syscall", lib)))
    return _SYSCALL[0]


def _u32(m: mmap.mmap, offset: int, n: int = 1) -> np.ndarray:
    return np.frombuffer(m, np.uint32, n, offset)


class Ring:
    """One io_uring instance, used by one thread at a time (each reader thread has its own).

    Raises OSError when the kernel refuses one.
    """

    def __init__(self, entries: int = RING_ENTRIES) -> None:
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
            self.batch = min(sq_n, cq_n)  # a round never overflows the completion queue
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
        m = mmap.mmap(self.fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE,
                      offset=offset)  # fmt: skip
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
        self, fds: np.ndarray, iovs: np.ndarray, counts: np.ndarray, offsets: np.ndarray,
        single: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> np.ndarray:  # fmt: skip
        """``preadv(fds[i], iovs[i], counts[i], offsets[i])`` for every ``i``, in rounds of
        up to ``batch`` entries (one ``io_uring_enter`` each, which submits and waits for the
        whole round, the GIL released). Returns each read's result (bytes, or ``-errno``).

        ``single``: ``(base, length)`` of each entry's first iovec; an entry of one iovec then
        goes as a plain ``IORING_OP_READ`` into it (no iovec array for the kernel to copy and
        check: a few % of a one-row read), where the kernel has it (Linux 5.6+; an entry that
        fails with ``EINVAL`` turns them off for the process, and the caller reads it again).
        """
        n = len(fds)
        res = np.empty(n, np.int64)
        enter = _syscall()
        sqes, done = self.sqes, 0
        ops, addrs, lens = np.full(n, _OP_READV, np.uint8), iovs, counts
        one = None
        if single is not None and _STATE.get("read_op", True):
            one = counts == 1
            ops[one] = _OP_READ
            addrs = np.where(one, single[0].astype(np.uint64), iovs.astype(np.uint64))
            lens = np.where(one, single[1].astype(np.uint32), counts.astype(np.uint32))
        while done < n:
            k = min(n - done, self.batch)
            sl = slice(done, done + k)
            sqes["opcode"][:k], sqes["fd"][:k], sqes["off"][:k] = ops[sl], fds[sl], offsets[sl]
            sqes["addr"][:k], sqes["len"][:k] = addrs[sl], lens[sl]
            sqes["user_data"][:k] = np.arange(done, done + k, dtype=np.uint64)
            tail = int(self.sq_tail[0])
            self.sq_array[(tail + np.arange(k)) & self.sq_mask] = np.arange(k, dtype=np.uint32)
            self.sq_tail[0] = (tail + k) & 0xFFFFFFFF
            submit, got = k, 0
            while got < k:
                r = enter(_SYS_ENTER, self.fd, submit, k - got, _ENTER_GETEVENTS, 0, 0, 0)
                if r < 0:
                    err = ctypes.get_errno()
                    if err in (4, 11):  # EINTR, EAGAIN: ask again
                        continue
                    raise OSError(err, f"io_uring_enter: {os.strerror(err)}")
                submit = max(0, submit - int(r))
                head, ctail = int(self.cq_head[0]), int(self.cq_tail[0])
                m = (ctail - head) & 0xFFFFFFFF
                if m:
                    c = self.cqes[(head + np.arange(m)) & self.cq_mask]
                    res[c["user_data"].astype(np.int64)] = c["res"]
                    self.cq_head[0] = ctail
                    got += m
            done += k
        if one is not None and (res[one] == -_EINVAL).any():  # no IORING_OP_READ here
            _STATE["read_op"] = False
        return res


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


def thread_ring() -> Ring | None:
    """This thread's ring (set up on first use; a forked child sets up its own), or None
    where io_uring cannot be used (the caller reads with one ``preadv`` per run)."""
    if not _usable():
        return None
    ring = getattr(_LOCAL, "ring", None)
    if ring is None or ring.pid != os.getpid():
        try:
            ring = Ring()
        except OSError:  # e.g. out of locked memory for one more ring: this thread falls back
            return None
        _LOCAL.ring = ring
    return ring


def reset_for_tests(enabled: bool | None) -> None:
    """Forget whether io_uring is usable (``None``), or force it on (where it works) or off."""
    _STATE.clear()
    _LOCAL.__dict__.clear()
    if enabled is False:
        _STATE["usable"] = False
