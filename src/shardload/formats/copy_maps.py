"""Node cache copies read through read-only mappings, kept by the process for its next reads.

A Blosc chunk file's copy of :data:`MAP_MIN_BYTES` or more is decoded from a mapping of it, not
from its bytes read into a buffer: reading a file on tmpfs (``/dev/shm``) copies it out page by
page at about twice the CPU of a disk file system's page cache (docs/design.md, "The node
cache"). With an unbounded cache (nothing evicts a copy, so a kept mapping holds no memory
beyond the cache's own) the process keeps up to :data:`KEEP_MAPPED_BYTES` of such mappings,
least recently used out first, keyed by the copy's device, inode, size, mtime and ctime: a later
read of the same copy (another epoch, a new handle, in this process) maps nothing and takes no
page fault. A copy is used through a mapping only after its descriptor passed the cache's trust
check, and only a mapping of that very inode with that very stat is reused; a copy changed since
has another stat, so its old mapping is never read again (and leaves as the least recently used).

The cache never truncates a copy nor writes one in place (a fill writes a new file and renames
it in; an eviction unlinks it: a mapping keeps the old inode's bytes). Someone else truncating a
copy while a process decodes from its mapping would end that process with ``SIGBUS``, where a
read would have raised ``ChunkReadError`` for the short file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import threading
from collections import OrderedDict
from typing import Any

#: Copies smaller than this are read, not mapped: a mapping's setup costs more than their copy.
MAP_MIN_BYTES = 1 << 18
#: Bytes of mappings a process keeps for its next reads (page tables: about 2 MiB per GiB).
KEEP_MAPPED_BYTES = 1 << 30

Mapped = tuple[mmap.mmap, bool]  # the mapping, and whether it is kept (not closed after use)


class _Kept:
    """This process's kept mappings, by the copy's stat."""

    def __init__(self) -> None:
        self.maps: OrderedDict[tuple[int, ...], mmap.mmap] = OrderedDict()
        self.bytes = 0
        self.pid = os.getpid()
        self.lock = threading.Lock()

    def get(self, key: tuple[int, ...]) -> mmap.mmap | None:
        with self.lock:
            if self.pid != os.getpid():  # a forked child: its own, from nothing
                self.maps, self.bytes, self.pid = OrderedDict(), 0, os.getpid()
            m = self.maps.get(key)
            if m is not None:
                self.maps.move_to_end(key)
            return m

    def put(self, key: tuple[int, ...], m: mmap.mmap) -> None:
        gone = []
        with self.lock:
            if key in self.maps:
                return
            self.maps[key] = m
            self.bytes += key[2]
            while self.bytes > KEEP_MAPPED_BYTES and len(self.maps) > 1:
                old_key, old = self.maps.popitem(last=False)
                self.bytes -= old_key[2]
                gone.append(old)
        for old in gone:
            _close(old)


KEPT = _Kept()


def map_copy(f: Any, *, keep: bool) -> Mapped | None:
    """The whole node cache copy open as ``f`` (checked), mapped read-only and valid after
    ``f`` closes; ``keep``: reuse and keep the process's mapping of it (an unbounded cache).
    None when the copy is small or cannot be mapped. Give it back with :func:`unmap`."""
    try:
        fd = f.fileno()
        st = os.fstat(fd)
        if st.st_size < MAP_MIN_BYTES:
            return None
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        m = KEPT.get(key) if keep else None
        if m is None:
            m = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
            if keep:
                KEPT.put(key, m)
        return m, keep
    except (OSError, ValueError, AttributeError):
        return None


def unmap(mapped: Mapped, view: memoryview) -> None:
    """Release ``view``; close the mapping unless it is kept."""
    view.release()
    if not mapped[1]:
        _close(mapped[0])


def _close(m: mmap.mmap) -> None:
    # a view still held (another thread's read, an error's traceback): unmapped when it goes
    with contextlib.suppress(BufferError):
        m.close()
