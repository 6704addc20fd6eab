"""Native reads of Zarr v3 shards of small chunks (the ``sharding_indexed`` codec).

A compressed chunk is decoded whole, so mixing well at bounded memory wants small chunks, and
thousands of small chunks want to live in a few shard files. zarr-python reads such an array
through its async codec pipeline one inner chunk at a time, about 3 ms per 32-row inner chunk
(docs/benchmarks.md, issue 14): 0.07-0.11 of what reading the shards and decoding their
chunks costs. Here, as for chunk files (:mod:`.zarr_chunks`): the shard's index is read and
checked (its crc32c) once per reader and kept (:class:`ShardIndexCache`), then each inner chunk
covering the rows asked for is read with one ``pread`` and Blosc-decoded in C, without the GIL,
straight into the caller's rows.

Only the layouts :func:`.zarr_chunks.plan_chunk_layout` accepts with ``shards=True`` come here
(shards and inner chunks along axis 0 only, inner codecs ``bytes`` + optional ``blosc``, index
``bytes`` + optional ``crc32c`` at either end); anything else goes through zarr-python.

An empty inner chunk (offset and size both 2**64 - 1) is the fill value, in shardload stores
too: zarr-python, which writes shardload's shards, leaves out inner chunks that equal the fill
value. What guards against an index damaged into "empty" is its crc32c (and the shard's
checksum in shardload stores), checked before any entry is used.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import google_crc32c
import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.base import aligned_empty
from shardload.formats.checksums import Verifier, verify_file
from shardload.formats.zarr.chunks import ChunkLayout, decode_into, row_parts
from shardload.formats.zarr.empty import EMPTY

#: an empty inner chunk's offset and size in a shard index
_EMPTY = np.uint64(EMPTY)


class ShardIndexCache:
    """The parsed shard indexes of one reader, by shard file path, bounded by the bytes they
    hold (the oldest dropped first: 64 MiB is 4,096 shards of 1,024 inner chunks).

    Lookups take no lock (a ``dict.get``); adding takes one, which a forked child replaces
    (``os.register_at_fork``) so that it never inherits a lock held by a parent's thread."""

    def __init__(self, max_bytes: int = 64 << 20) -> None:
        self.max_bytes = max_bytes
        # path -> (the file's version it was read from: inode, device, size, mtime; the index)
        self._entries: dict[str, tuple[Any, np.ndarray]] = {}
        self._nbytes = 0
        self._lock = threading.Lock()
        _CACHES.add(self)

    def get(self, path: str, file: Any = None) -> np.ndarray | None:
        """``path``'s index, or None; also where ``file`` (its version) is not the one it
        came from: a shard replaced or rewritten since is read with its own index."""
        entry = self._entries.get(path)  # one look-up: the version and index put together
        if entry is None or (file is not None and entry[0] != file):
            return None
        return entry[1]

    def put(self, path: str, index: np.ndarray, file: Any = None) -> None:
        with self._lock:
            if path in self._entries:
                self._nbytes -= self._entries.pop(path)[1].nbytes
            while self._entries and self._nbytes + index.nbytes > self.max_bytes:
                oldest = next(iter(self._entries))  # only put() changes the dict: safe
                self._nbytes -= self._entries.pop(oldest)[1].nbytes
            self._entries[path] = (file, index)
            self._nbytes += index.nbytes

    def clear(self) -> None:
        with self._lock:
            self._entries, self._nbytes = {}, 0

    def __len__(self) -> int:
        return len(self._entries)


_CACHES: weakref.WeakSet[ShardIndexCache] = weakref.WeakSet()


def _new_locks() -> None:
    for cache in list(_CACHES):
        cache._lock = threading.Lock()


os.register_at_fork(after_in_child=_new_locks)


def read_shard_rows_into(
    layout: ChunkLayout,
    name: str,
    start: int,
    stop: int,
    out: np.ndarray,
    verifier: Verifier | None = None,
    indexes: ShardIndexCache | None = None,
) -> None:
    """Rows ``[start, stop)`` of a sharded array into ``out`` (C-contiguous), shard by shard;
    each shard file checked against its checksum first when ``verifier`` asks for it (the
    unit of a sharded store's checksums is the shard file)."""
    assert layout.shard is not None
    if stop <= start:
        return
    dst = out.reshape(-1).view(np.uint8).data
    rb = layout.row_bytes
    for k, lo, hi, at in row_parts(start, stop, layout.chunk_rows * layout.shard.chunks):
        part = dst[at * rb : (at + hi - lo) * rb]
        _read_shard_part(layout, name, k, lo, hi, part, verifier, indexes)


def _read_shard_part(
    layout: ChunkLayout,
    name: str,
    k: int,
    a: int,
    b: int,
    dst: memoryview,
    verifier: Verifier | None,
    indexes: ShardIndexCache | None,
) -> None:
    """Rows ``[a, b)`` of shard ``k`` (counted from the shard's first row) into ``dst``."""
    path = layout.chunk_path(k)
    if verifier is not None and verifier.needed(name, k):
        verify_file(verifier, name, k, path, opener=layout.opener, what=f"shard {k}")
    try:
        with layout.open(path) as f:
            fd = _fileno(f)
            index = shard_index(layout, name, k, path, f, fd, indexes)
            _read_inner_chunks(layout, name, k, a, b, dst, f, fd, index, path)
    except FileNotFoundError as exc:
        if layout.strict:
            raise ChunkReadError(f"shard {k} of array {name!r} is missing: {path}") from exc
        np.frombuffer(dst, dtype=layout.dtype)[...] = layout.fill_value
    except OSError as exc:
        raise ChunkReadError(
            f"shard {k} of array {name!r} could not be read: {path}: {exc}"
        ) from exc


def shard_index(
    layout: ChunkLayout,
    name: str,
    k: int,
    path: str,
    f: Any,
    fd: int | None,
    indexes: ShardIndexCache | None,
) -> np.ndarray:
    """Shard ``k``'s checked index (:func:`_read_index`), from ``indexes`` when it holds it
    for this version of the file (a local one), else read and kept there."""
    st = os.fstat(fd) if fd is not None and indexes is not None else None
    file = (st.st_ino, st.st_dev, st.st_size, st.st_mtime_ns) if st is not None else None
    index = indexes.get(path, file) if indexes is not None else None
    if index is None:
        index = _read_index(layout, name, k, path, f, fd)
        if indexes is not None:
            indexes.put(path, index, file)
    return index


def _read_index(
    layout: ChunkLayout, name: str, k: int, path: str, f: Any, fd: int | None
) -> np.ndarray:
    """Shard ``k``'s index, ``(inner chunks, 2)`` uint64 (offset, size), checked: its crc32c,
    and every entry empty or inside the shard's data."""
    spec = layout.shard
    assert spec is not None
    n = spec.index_nbytes
    size = os.fstat(fd).st_size if fd is not None else _size(f)
    if size < n:
        raise ChunkReadError(
            f"shard {k} of array {name!r} is truncated or corrupt: {path} has {size} bytes, "
            f"fewer than its index of {spec.chunks} inner chunks ({n} bytes)"
        )
    raw = bytearray(n)
    got = _pread_into(f, fd, memoryview(raw), size - n if spec.index_at_end else 0)
    if got != n:
        raise ChunkReadError(
            f"shard {k} of array {name!r} is truncated: {path}: read {got} of its index's {n} bytes"
        )
    if spec.index_crc:
        want = int.from_bytes(raw[-4:], "little")
        crc = int(google_crc32c.value(bytes(raw[:-4])))
        if crc != want:
            raise ChunkReadError(
                f"shard {k} of array {name!r} is corrupt: {path}: its index's crc32c is "
                f"{crc:08x}, the index records {want:08x}"
            )
    index = np.frombuffer(bytes(raw), "<u8", count=2 * spec.chunks).reshape(spec.chunks, 2)
    off, nbytes = index[:, 0], index[:, 1]
    lo, hi = (0, size - n) if spec.index_at_end else (n, size)
    empty = (off == _EMPTY) & (nbytes == _EMPTY)
    # uint64 throughout: hi - off wraps where off > hi, which the test before it already flags
    bad = ~empty & ((off < np.uint64(lo)) | (off > np.uint64(hi)) | (nbytes > np.uint64(hi) - off))
    if bad.any():
        j = int(np.flatnonzero(bad)[0])
        i = k * spec.chunks + j
        raise ChunkReadError(
            f"chunk {i} (inner chunk {j} of shard {k}) of array {name!r} is corrupt: {path}: "
            f"the shard's index places it at bytes [{int(off[j])}, +{int(nbytes[j])}), outside "
            f"the shard's data [{lo}, {hi})"
        )
    return index


_SCRATCH = threading.local()


def _scratch(nbytes: int) -> memoryview:
    """This thread's reused buffer for one compressed inner chunk (valid until its next call).
    Page-aligned, as whole chunk files are read (``aligned_empty``): ``pread`` of 200 KB inner
    chunks into ``np.empty``'s buffer, 16 bytes into a page, was 14% of a reader thread's time
    on 32-row inner chunks (py-spy, docs/benchmarks.md, session 11)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _SCRATCH.buf = aligned_empty(max(nbytes, 1 << 20))
    view: memoryview = buf.data.cast("B")
    return view[:nbytes]


def _read_inner_chunks(
    layout: ChunkLayout,
    name: str,
    k: int,
    a: int,
    b: int,
    dst: memoryview,
    f: Any,
    fd: int | None,
    index: np.ndarray,
    path: str,
) -> None:
    """Rows ``[a, b)`` of shard ``k`` from its inner chunks, each read with one ``pread``."""
    assert layout.shard is not None
    rows, rb = layout.chunk_rows, layout.row_bytes
    for j, lo, hi, at in row_parts(a, b, rows):
        part = dst[at * rb : (at + hi - lo) * rb]
        what = f"chunk {k * layout.shard.chunks + j} (inner chunk {j} of shard {k})"
        off, nbytes = int(index[j, 0]), int(index[j, 1])
        if off == EMPTY:  # both are (checked with the index): never written, the fill value
            np.frombuffer(part, dtype=layout.dtype)[...] = layout.fill_value
        elif not layout.blosc:
            if nbytes != rows * rb:
                raise ChunkReadError(
                    f"{what} of array {name!r} is corrupt: {path}: the shard's index says "
                    f"{nbytes} bytes, {rows} rows are {rows * rb}"
                )
            got = _pread_into(f, fd, part, off + lo * rb)
            if got != len(part):
                raise ChunkReadError(
                    f"{what} of array {name!r} is truncated: {path} (expected {len(part)} bytes "
                    f"at offset {off + lo * rb}, got {got})"
                )
        else:
            raw = _scratch(nbytes)
            got = _pread_into(f, fd, raw, off)
            if got != nbytes:
                raise ChunkReadError(
                    f"{what} of array {name!r} is truncated: {path} (expected {nbytes} bytes "
                    f"at offset {off}, got {got})"
                )
            decode_into(layout, raw, lo, hi, part, name=name, what=what, path=path)


class RangeFile:
    """A remote file read with exact range requests (each retried: ``move.remote.read_bytes``),
    for shards by URL: an fsspec file would ask the server for the size on opening and read
    ahead a block of megabytes for each inner chunk of a few kilobytes. ``read()`` with no size
    gets the whole file in one request (a shard's checksum)."""

    def __init__(self, fs: Any, path: str) -> None:
        self.fs, self.path, self._pos = fs, path, 0
        self._size: int | None = None

    @property
    def size(self) -> int:
        if self._size is None:
            self._size = int(self.fs.size(self.path))
        return self._size

    def seek(self, pos: int, whence: int = os.SEEK_SET) -> int:
        self._pos = pos if whence == os.SEEK_SET else self.size + pos
        return self._pos

    def _get(self, start: int | None, end: int | None) -> bytes:
        from shardload.move.remote import read_bytes

        return read_bytes(self.fs, self.path, start, end, what=os.path.basename(self.path))

    def _view(self, start: int | None, end: int | None) -> memoryview:
        """The bytes as a read-only view: by URL a large answer read into one buffer as it
        arrives, never joined (``move/pinned.py``)."""
        from shardload.move.remote import RemoteFileSystem

        if not isinstance(self.fs, RemoteFileSystem):
            return memoryview(self._get(start, end))
        return self.fs.cat_file(self.path, start, end, os.path.basename(self.path), view=True)

    def fetch(self, start: int, end: int) -> tuple[memoryview, int]:
        """Bytes ``[start, end)`` in one range request: the buffer and its length (shorter
        only past the end of the file)."""
        data = self._view(start, end) if end > start else memoryview(b"")
        return data, len(data)

    def whole(self) -> memoryview:
        """The whole file in one request (a shard's checksum), as a read-only view."""
        return self._view(None, None)

    def read(self, n: int = -1) -> bytes:
        if n < 0:
            data = self._get(self._pos or None, None)
        else:
            data = self._get(self._pos, self._pos + n) if n else b""
        self._pos += len(data)
        return data

    def readinto(self, dst: Any) -> int:
        view = memoryview(dst).cast("B")
        data = self._get(self._pos, self._pos + len(view)) if len(view) else b""
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def __enter__(self) -> RangeFile:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class RangeOpener:
    """Opens a stored file on ``fs`` as a :class:`RangeFile` (by URL, no whole-file cache): a
    sharded array's reads of several spans then plan their range requests together
    (:mod:`.shard_fetch`)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def __call__(self, path: str) -> RangeFile:
        return RangeFile(self.fs, path)


def _fileno(f: Any) -> int | None:
    try:
        return int(f.fileno())
    except (AttributeError, OSError, ValueError):  # not a local file (an fsspec opener)
        return None


def _size(f: Any) -> int:
    size = getattr(f, "size", None)
    if isinstance(size, int):
        return size
    return int(f.seek(0, os.SEEK_END))


def _pread_into(f: Any, fd: int | None, dst: memoryview, offset: int) -> int:
    """Fill ``dst`` from byte ``offset`` of ``f`` (``pread`` when it has a descriptor: no shared
    file position); the bytes read, fewer only at the end of the file."""
    got = 0
    if fd is not None:
        while got < len(dst):
            n = os.preadv(fd, [dst[got:]], offset + got)
            if not n:
                break
            got += n
        return got
    from shardload.formats.base import readinto_full

    f.seek(offset)
    return readinto_full(f, dst)


@contextmanager
def shard_errors(
    layout: ChunkLayout, name: str, k: int, path: str, parts: Iterable[Any]
) -> Iterator[None]:
    """How every reader of shard ``k`` names its errors: a missing file is an error naming the
    shard when the layout is strict, else ``parts`` (writable buffers of the rows asked for,
    taken only then) get the fill value; any other ``OSError`` names the shard and file."""
    try:
        yield
    except FileNotFoundError as exc:
        if layout.strict:
            raise ChunkReadError(f"shard {k} of array {name!r} is missing: {path}") from exc
        for part in parts:
            np.frombuffer(part, dtype=layout.dtype)[...] = layout.fill_value
    except OSError as exc:
        raise ChunkReadError(
            f"shard {k} of array {name!r} could not be read: {path}: {exc}"
        ) from exc
