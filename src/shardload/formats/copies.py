"""Stored files read through a node cache (``cache_dir``): each one a checked local copy,
trusted across processes by its record, and read in place.

A store opened with ``cache_dir`` is read by URL, every stored file through the node cache
(``move/cache.py``), which hands out a descriptor on a local copy of it. Every format reading
such copies (an npy stack, Zarr chunk files and shards, Parquet chunk files) checks a copy here, once per process,
before any of its bytes are used:

- **vouched**: the copy's record in the cache holds the XXH3-64 computed from these very bytes
  when they were written into the cache (or last hashed), the record's stamp (size, inode,
  mtime, ctime, boot id) still equals the open copy's, and that digest equals the store's
  checksum as this process read it from the store's checksum file. Nothing is read or hashed;
- otherwise the open copy is hashed (mapped: no copy out of the page cache), and a mismatch
  raises ``ChunkReadError`` naming the file. The cache itself first fetches again a copy whose
  bytes no longer match the store's checksum (``RemoteFileSystem.cached_copy``), so a copy
  changed on disk is refetched, and a store changed on the server is refused by name.

``verify="always"`` hashes the copy at every check, as it does every local file.

A Blosc chunk file's large copy is decoded from a read-only mapping of it, not from its
bytes read into a buffer (:mod:`.copy_maps`).
"""

from __future__ import annotations

import mmap
import os
from typing import Any

import xxhash

from shardload.errors import ChunkReadError


def keeps_maps(fs: Any) -> bool:
    """Whether mappings of the cache's copies may outlive a read (:mod:`.copy_maps`): the
    cache is unbounded, so nothing evicts a copy a mapping would keep in memory."""
    return getattr(getattr(fs, "spec", None), "cache_bytes", 0) is None


def is_cached(fs: Any) -> bool:
    """A remote filesystem with a whole-file cache (each stored file a local copy once fetched)."""
    return getattr(getattr(fs, "spec", None), "cache_dir", None) is not None


class CopyOpener:
    """Opens a stored file's node cache copy for reading (a Zarr layout's ``opener``); its
    checks go through :func:`open_checked_copy` (:func:`~.checksums.verify_file`)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs

    def __call__(self, path: str) -> Any:
        # unbuffered, as a local chunk file is opened (one read of the whole file follows)
        return os.fdopen(self.fs.cached_copy(path, what="", digest=None)[0], "rb", buffering=0)


def open_checked_copy(fs: Any, verifier: Any, name: str, unit: int, path: str, *, what: str) -> int:
    """A descriptor (the caller closes it) on the node cache's copy of stored file ``path``,
    unit ``unit`` of array ``name`` (fetched when missing or not matching the store's checksum),
    checked as the module docstring says when ``verifier`` (a reader's
    :class:`~.checksums.Verifier`) still needs it."""
    want = verifier.recorded(name, unit, path=path, what=what) if verifier.enabled else None
    try:
        fd, vouched = fs.cached_copy(path, what=f"{what} of array {name!r}", digest=want)
    except OSError as exc:
        raise ChunkReadError.from_os_error(exc, what, name, path) from exc
    try:
        if verifier.needed(name, unit):
            if want is not None and vouched == want and verifier.mode != "always":
                verifier.vouch(name, unit)
            else:
                verifier.check(name, unit, fd_digest(fd), path=path, what=what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def open_copy_checked(
    opener: CopyOpener, verifier: Any, name: str, unit: int, path: str, *, what: str
) -> Any:
    """Stored file ``path`` (unit ``unit`` of ``name``) open for reading from its node cache
    copy, unbuffered, checked first as :func:`open_checked_copy` says when ``verifier`` still
    needs it (once per process and file; the reader's threads wait for one check): the
    descriptor checked is the one read, not a second open of the copy."""
    if verifier.needed(name, unit):
        with verifier.unit_lock(name, unit):
            if verifier.needed(name, unit):
                fd = open_checked_copy(opener.fs, verifier, name, unit, path, what=what)
                return os.fdopen(fd, "rb", buffering=0)
    return opener(path)


def read_checked_copy(
    fs: Any, verifier: Any, name: str, unit: int, path: str, *, what: str
) -> bytes:
    """The bytes of stored file ``path`` (unit ``unit`` of ``name``) from its node cache copy,
    checked as :func:`open_checked_copy` says (a Parquet chunk, decoded whole anyway)."""
    fd = open_checked_copy(fs, verifier, name, unit, path, what=what)
    with os.fdopen(fd, "rb") as f:
        return f.read()


def fd_digest(fd: int) -> int:
    """XXH3-64 of the whole open file ``fd`` (mapped: no copy out of the page cache)."""
    if os.fstat(fd).st_size == 0:
        return int(xxhash.xxh3_64_intdigest(b""))
    with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as m:
        return int(xxhash.xxh3_64_intdigest(m))
