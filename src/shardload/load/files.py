"""The chunk files a scatter reader keeps open for an epoch, and whether it reads them past
the page cache (``O_DIRECT``, for stores larger than the memory that could cache them)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.base import RawChunk
from shardload.load import uring

#: Direct reads when the store is more than this many times the memory that could cache it.
#: Measured (docs/benchmarks.md, session 10): at 3.2x (6.2 KB rows) direct reads ran 1.3-1.55x
#: the page cache's rate; at 1.4x (1 KB rows, most reads hitting the cache) 0.68x.
DIRECT_STORE_FACTOR = 2
_NO_END = np.iinfo(np.int64).max // 2
_O_CLOEXEC, _O_DIRECT = getattr(os, "O_CLOEXEC", 0), getattr(os, "O_DIRECT", 0)


class OpenChunks:
    """The chunk files one scatter reader keeps open for an epoch, shared by its reader
    threads: each opened and ``fstat``-ed once, where opening it for every group cost about 5%
    of an epoch's CPU with 512 pieces a group. Per array, a table indexed by chunk id holds
    each open chunk's descriptor, data offset, row size and end (the file's size, or its inner
    chunk's end), so a group's chunks are looked up and checked with numpy (:meth:`lookup`).

    A file may hold several chunks: ``per_file[name]`` consecutive ones (the inner chunks of a
    shard, :class:`~shardload.formats.base.RawShard`; default 1). Such a file is opened once,
    its chunks' entries filled from its index at once, all with its one descriptor. At most
    ``limit`` files stay open (default: a quarter of the soft ``RLIMIT_NOFILE``, at most
    1,024); past that a reader opens and closes its own. :meth:`close` once no reader uses
    them."""

    def __init__(
        self,
        limit: int | None = None,
        *,
        direct: bool = False,
        per_file: Mapping[str, int] | None = None,
    ) -> None:
        self.limit = _fd_budget() if limit is None else limit
        #: whether small reads go through ``O_DIRECT`` descriptors (:meth:`direct_fds`)
        self.direct = direct
        self.per_file = dict(per_file or {})
        self._tables: dict[str, np.ndarray] = {}  # name -> (4, chunks): fd, offset, row, end
        self._direct: dict[str, np.ndarray] = {}  # name -> O_DIRECT fd per chunk (-2: refused)
        self._count = 0
        self._gen = 0  # one more at each close (files opened meanwhile are the opener's)
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
                rc = raw(c)
                if rc.opener is not None:  # a node cache's copy: opened by it, never by path
                    t[c] = -2
                    continue
                try:
                    t[c] = os.open(rc.path, os.O_RDONLY | _O_CLOEXEC | _O_DIRECT)
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
        descriptors the caller closes (the cache was full). A never-written inner chunk has
        offset -1 (its rows are its shard's ``fill_row``)."""
        per = self.per_file.get(name, 1)
        todo: list[int] = []
        with self._lock:
            t = self._tables.get(name)
            if t is None or t.shape[1] <= int(chunks.max(initial=-1)):
                t = self._table(name, int(chunks.max()) + 1)
            got = t[:, chunks]
            miss = got[0] < 0
            if miss.any():  # first use of these files this epoch
                todo = np.unique(chunks[miss] // per).tolist()[: max(0, self.limit - self._count)]
                self._count += len(todo)
            gen = self._gen
        owned: list[int] = []
        if todo:
            got, miss = self._open_new(raw, name, chunks, todo, gen, owned)
        try:
            if miss.any():  # over the limit: opened here, closed by the caller
                for f in np.unique(chunks[miss] // per).tolist():
                    fd, _, cols = self._open_file(raw, name, f, per)
                    owned.append(fd)
                    _fill(got, chunks, per, f, cols)
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

    def _open_file(
        self, raw: Callable[[int], RawChunk], name: str, f: int, per: int
    ) -> tuple[int, RawChunk, np.ndarray]:
        """Open file ``f`` (chunks ``f * per`` on): its descriptor, the chunk it was found
        from, and the table's columns of its chunks (the chunk, or every inner chunk)."""
        c = f * per
        rc = raw(c)  # a shard: checked against its checksum here, before any read
        shard = rc.shard
        what = f"chunk {c}" if shard is None else f"shard {f}"
        fd, rc, st = _open_sized(rc, name, what)
        size = st.st_size
        if shard is None:
            return fd, rc, np.array([[fd], [rc.offset], [rc.row_bytes], [size]], np.int64)
        if shard.version is not None and shard.version != _version(st):
            os.close(fd)  # replaced or rewritten between its index's look-up and this open
            raise ChunkReadError(
                f"shard {f} of array {name!r} changed while it was being read: {shard.path} "
                "is not the file its index was read from (the store was rewritten under the reader)"
            )
        if size < shard.file_bytes:
            os.close(fd)
            raise ChunkReadError(
                f"shard {f} of array {name!r} is truncated or corrupt: {shard.path} has "
                f"{size} bytes, its index places inner chunks up to byte {shard.file_bytes}"
            )
        cols = np.empty((4, len(shard.offsets)), np.int64)
        cols[0], cols[1], cols[2] = fd, shard.offsets, shard.row_bytes
        # each inner chunk's end: its rows' bytes; a never-written one's rows: its fill, no end
        cols[3] = np.where(shard.offsets < 0, _NO_END, shard.offsets + shard.chunk_bytes)
        return fd, rc, cols

    def _open_new(
        self,
        raw: Callable[[int], RawChunk],
        name: str,
        chunks: np.ndarray,
        todo: list[int],
        gen: int,
        owned: list[int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """Open files ``todo`` (counted already) outside the lock: an opener may fetch the file
        (a node cache's fill) and a local file may be hashed first (its check), while the other
        readers go on. A file another reader opened meanwhile, or opened after :meth:`close`,
        goes to ``owned``. Returns the table's entries of ``chunks`` and which are missing."""
        per = self.per_file.get(name, 1)
        opened: list[tuple[int, int, RawChunk, np.ndarray]] = []
        try:
            for f in todo:
                opened.append((f, *self._open_file(raw, name, f, per)))
        except BaseException:
            for _, fd, _, _ in opened:
                os.close(fd)
            with self._lock:
                self._count -= len(todo) if gen == self._gen else 0
            raise
        with self._lock:
            top = max(f * per + cols.shape[1] for f, _, _, cols in opened)
            t = self._table(name, max(top, int(chunks.max()) + 1))
            for f, fd, rc, cols in opened:
                lo = f * per
                if gen != self._gen or t[0, lo] >= 0 or rc.transient:
                    owned.append(fd)
                    self._count -= 1 if gen == self._gen else 0
                else:
                    t[:, lo : lo + cols.shape[1]] = cols
            got = t[:, chunks]
        for f, _, rc, cols in opened:  # this task's own descriptors
            if rc.transient:
                _fill(got, chunks, per, f, cols)
        return got, got[0] < 0

    def close(self) -> None:
        with self._lock:
            # with numpy: a table has an entry per chunk (8,192 for the default store), a
            # Python loop over them cost 1.3 ms an epoch; its descriptors are a few
            tables = [t[0] for t in self._tables.values()] + list(self._direct.values())
            every = np.concatenate(tables) if tables else np.zeros(0, np.int64)
            fds = np.unique(every[every >= 0]).tolist()
            self._tables.clear()
            self._direct.clear()
            self._count = 0
            self._gen += 1
        for fd in fds:
            os.close(fd)


def _fill(got: np.ndarray, chunks: np.ndarray, per: int, f: int, cols: np.ndarray) -> None:
    """The entries of ``chunks`` in file ``f`` set from its columns (:meth:`OpenChunks._open_file`)."""
    sel = chunks // per == f
    got[:, sel] = cols[:, chunks[sel] - f * per]


def _fd_budget() -> int:
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ImportError, OSError, ValueError):
        return 64
    if soft == resource.RLIM_INFINITY:
        return 1024
    return max(0, min(1024, int(soft) // 4))


def _version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns)


def _open_sized(rc: RawChunk, name: str, what: str) -> tuple[int, RawChunk, os.stat_result]:
    try:
        if rc.opener is not None:  # a node cache's copy: checked, and its offset known, once open
            fd, rc = rc.opener()
        else:
            fd = os.open(rc.path, os.O_RDONLY | _O_CLOEXEC)
    except OSError as exc:
        raise ChunkReadError.from_os_error(exc, what, name, rc.path) from exc
    try:
        st = os.fstat(fd)
    except OSError as exc:
        os.close(fd)
        raise ChunkReadError.from_os_error(exc, what, name, rc.path) from exc
    return fd, rc, st


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
