"""Per-chunk checksums: recorded when a store is written, checked when it is read.

A store's checksums live in one small binary sidecar beside the manifest, ``checksums.npz``:
one ``uint64`` array per store array, one entry per *checksum unit*. What a unit is depends on
the format (each format module says which and computes the digests as it writes):

- npy: one chunk file (``NAME/000000.npy``), header included;
- Zarr: one stored object, i.e. a chunk file, or a shard file with ``shard_chunks``;
- HDF5: one chunk of rows, over the decoded C-ordered row bytes (HDF5 places chunks inside
  ``data.h5`` itself; what shardload promises is the values, so that is what is hashed).

The digest is XXH3-64 (:mod:`xxhash`): the fastest widely used non-cryptographic hash (measured
on this machine: about 30 GB/s, 2.5x crc32c's 12 GB/s, see docs/design.md), with 64 bits,
so random corruption goes unnoticed with probability 2**-64.

Verification (``open_store(..., verify=...)``) is done by the format readers, in the process
that reads: :class:`Verifier` holds the digests and which units this process already checked.
"""

from __future__ import annotations

import io
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import xxhash

from shardload.errors import ChunkReadError, ConfigError, ShardloadError, StoreError
from shardload.formats.copies import CopyOpener, open_checked_copy
from shardload.formats.ledger import file_version, open_ledger
from shardload.layout import CHECKSUMS_NAME
from shardload.util.npy_header import load_npz

ALGORITHM = "xxh3_64"
VERIFY_MODES = ("auto", "always", "first-epoch", "never")
#: The default of ``open_store(verify=None)`` when set (e.g. to measure, or to trust a store).
VERIFY_ENV = "SHARDLOAD_VERIFY"
#: Every chunk is checked before its rows are used: a local chunk file (npy, Zarr chunk or
#: shard) once per node and file version (:mod:`.ledger`: raw rows are copied straight from
#: the page cache into batches, and hashing them in every process, every epoch, would add about
#: 30% to an epoch's CPU); anything else, and every file read by URL, the first time each
#: process reads it ("first-epoch"). docs/loading.md ("Integrity") has the measured cost.
DEFAULT_VERIFY = "auto"


def check_verify(mode: str) -> str:
    if mode not in VERIFY_MODES:
        raise ConfigError(f"verify: unknown value {mode!r}; choose one of {list(VERIFY_MODES)}")
    return mode


def digest(*buffers: Any) -> int:
    """XXH3-64 of the concatenated bytes of ``buffers`` (anything exposing the buffer protocol)."""
    if len(buffers) == 1:
        return int(xxhash.xxh3_64_intdigest(_bytes(buffers[0])))
    h = xxhash.xxh3_64()
    for b in buffers:
        h.update(_bytes(b))
    return int(h.intdigest())


def _bytes(b: Any) -> Any:
    if isinstance(b, np.ndarray):
        return np.ascontiguousarray(b).reshape(-1).view(np.uint8).data
    return b


def file_digest(path: str, *, opener: Any = None) -> int:
    """XXH3-64 of a whole file (local files through ``mmap``: no copy out of the page cache).

    Raises ``FileNotFoundError`` / ``OSError`` as opening the file does."""
    if opener is not None:
        with opener(path) as f:
            return digest(f.read())
    import mmap

    with open(path, "rb", buffering=0) as f:
        try:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
                return int(xxhash.xxh3_64_intdigest(m))
        except ValueError:  # an empty file cannot be mapped
            return digest(b"")


def encode_checksums(sums: Mapping[str, np.ndarray]) -> bytes:
    """The sidecar's bytes: an ``.npz`` of one ``uint64`` array per store array."""
    buf = io.BytesIO()
    arrays: dict[str, Any] = {k: np.asarray(v, dtype=np.uint64) for k, v in sums.items()}
    np.savez(buf, **arrays)
    return buf.getvalue()


def decode_checksums(data: bytes, *, where: str) -> dict[str, np.ndarray]:
    # reader threads load this file concurrently: parsed without ast (util.npy_header)
    try:
        z = load_npz(data)
        return {k: np.asarray(z[k], dtype=np.uint64) for k in z}
    except Exception as exc:
        raise StoreError(f"checksum file {where} is not readable: {exc}") from exc


def read_checksums(fs: Any, root: str) -> dict[str, np.ndarray]:
    """The sidecar of the store at ``root`` (local path or a remote filesystem's path)."""
    from shardload.formats.base import is_local

    path = f"{root.rstrip('/')}/{CHECKSUMS_NAME}"
    try:
        if is_local(fs):
            with open(path, "rb") as f:
                data = f.read()
        else:
            from shardload.move.remote import read_bytes

            data = read_bytes(fs, path, what="the checksum file")
    except FileNotFoundError as exc:
        raise StoreError(
            f"checksum file {path} is missing, but the manifest says the store has checksums"
        ) from exc
    return decode_checksums(data, where=path)


class CheckedUnit:
    """One unit's lock (:meth:`Verifier.unit_lock`), its threads in or waiting for it, and the
    bytes its check read, while a waiting thread may use them."""

    __slots__ = ("data", "lock", "users")

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.users = 0
        self.data: Any = None  # bytes, or a read-only memoryview (a shard by URL)


class Verifier:
    """One reader's checksum state: the store's digests (loaded on first use), the units this
    process already verified, and, for ``"auto"`` on local chunk files, the node's
    :class:`~shardload.formats.ledger.Ledger` of verified file versions."""

    def __init__(self, fs: Any, root: str, manifest: Any, mode: str, *, files: bool) -> None:
        """``files``: the units are whole stored files the reader passes by path (npy chunks,
        Zarr chunks and shards); ``"auto"`` then checks local ones once per node, else it means
        ``"first-epoch"``."""
        from shardload.formats.base import is_local

        self.fs, self.root = fs, root
        mode = check_verify(mode)
        self.node = mode == "auto" and files and is_local(fs)
        self.by_url = files and not is_local(fs)
        if mode == "auto":
            mode = "first-epoch"
        self.mode = mode
        # stores written before checksums existed, and plain Zarr data, have none to check
        self.enabled = mode != "never" and bool(getattr(manifest, "checksums", None))
        self._sums: dict[str, np.ndarray] | None = None
        self._done: set[tuple[str, int]] = set()
        self._ledger: Any = None  # opened on first use (False: none on this node)
        self._pending: dict[tuple[str, int], os.stat_result] = {}
        self.hashed = 0  # digests this process computed and compared (tests, benchmarks)
        self.vouched = 0  # units a node cache's record vouched for, unhashed (:meth:`vouch`)
        self._locks: dict[tuple[str, int], CheckedUnit] = {}
        self._locks_pid = -1  # the process the locks belong to (a forked child makes its own)
        self._table_lock = threading.Lock()  # guards ``_locks``

    def sums(self) -> dict[str, np.ndarray]:
        if self._sums is None:
            with self.unit_lock("", -1):  # the reader's threads ask at once: one read of it
                if self._sums is None:
                    self._sums = read_checksums(self.fs, self.root)
        return self._sums

    def sums_path(self) -> str | None:
        """The checksum file, while it is still to be read and will be (else None): a reader by
        URL fetches it together with its other metadata (:meth:`take_sums`)."""
        if not self.enabled or self._sums is not None:
            return None
        return f"{self.root.rstrip('/')}/{CHECKSUMS_NAME}"

    def take_sums(self, data: bytes) -> None:
        """The checksum file's bytes, fetched by the reader with its other metadata. A file
        that does not parse is left for :meth:`sums` to read again and report, at the first
        check (as when nothing was fetched ahead)."""
        path = self.sums_path()
        if path is None:
            return
        try:
            sums = decode_checksums(data, where=path)
        except StoreError:
            return
        with self.unit_lock("", -1):
            if self._sums is None:
                self._sums = sums

    @contextmanager
    def unit_lock(self, name: str, unit: int) -> Iterator[CheckedUnit]:
        """Held while one thread checks unit ``unit`` of ``name`` by URL: the reader's other
        threads wanting the same unit wait for that check (then :meth:`needed` says False)
        instead of each fetching the whole file again (a shard of 64 MiB, eight times). The
        checking thread may leave the bytes it checked in the :class:`CheckedUnit` for the
        threads that waited meanwhile; they go when the last of those leaves."""
        with self.unit_use(name, unit) as held, held.lock:
            yield held

    @contextmanager
    def unit_use(self, name: str, unit: int) -> Iterator[CheckedUnit]:
        """This thread counted among those wanting unit ``unit`` of ``name`` (the bytes a
        check leaves stay for it) before it takes the unit's lock (``held.lock``): a thread
        that decodes a shard by URL while it arrives, then waits for its check
        (``formats/zarr/streamed.py``)."""
        pid = os.getpid()
        if self._locks_pid != pid:  # never a lock a parent's thread held at the fork
            self._locks, self._locks_pid, self._table_lock = {}, pid, threading.Lock()
        with self._table_lock:
            held = self._locks.setdefault((name, unit), CheckedUnit())
            held.users += 1
        try:
            yield held
        finally:
            with self._table_lock:
                held.users -= 1
                if not held.users:  # no thread waits for these bytes: not kept
                    held.data = None

    def ledger(self) -> Any:
        """The node's ledger of this store, or None (not ``"auto"`` on local files, or none
        can be written here)."""
        if self._ledger is None:
            self._ledger = (open_ledger(self.root) if self.node else None) or False
        return self._ledger or None

    def needed(self, name: str, unit: int, path: str | None = None) -> bool:
        """Whether unit ``unit`` of array ``name`` must be checked before it is trusted;
        ``path``: the local file that is the unit (then the node's ledger may vouch for it)."""
        if not self.enabled:
            return False
        if self.mode == "always":
            return True
        if (name, unit) in self._done:
            return False
        ledger = self.ledger() if path is not None else None
        if ledger is not None:
            assert path is not None
            try:
                st = os.stat(path)
            except OSError:
                return True  # the check itself reports it, naming the chunk
            if ledger.trusted(path, st):
                self._done.add((name, unit))
                return False
            self._pending[(name, unit)] = st
        return True

    def _want(self, name: str, unit: int, path: str, what: str) -> int:
        try:
            sums = self.sums()
        except ShardloadError as exc:
            # the digests load lazily, on the first check: say which chunk was being read
            # (same error class, so callers that catch e.g. RemoteError still do)
            raise type(exc)(f"cannot verify {what} of array {name!r} ({path}): {exc}") from exc
        if name not in sums or not 0 <= unit < len(sums[name]):
            raise StoreError(
                f"checksum file {self.root}/{CHECKSUMS_NAME} has no entry for {what} of array "
                f"{name!r} ({path})"
            )
        return int(sums[name][unit])

    def recorded(self, name: str, unit: int, *, path: str, what: str) -> int:
        """The store's checksum of unit ``unit`` of ``name`` (raises as a check would)."""
        return self._want(name, unit, path, what)

    def vouch(self, name: str, unit: int) -> None:
        """Unit ``unit`` of ``name`` is checked without hashing it here: its node cache copy's
        record holds the digest of those very bytes, equal to :meth:`recorded`."""
        self.vouched += 1
        self._done.add((name, unit))

    def check(self, name: str, unit: int, got: int, *, path: str, what: str) -> None:
        """Compare a computed digest with the recorded one; raise naming the file if they differ."""
        want = self._want(name, unit, path, what)
        self.hashed += 1
        if got != want:
            self._pending.pop((name, unit), None)
            raise ChunkReadError(
                f"{what} of array {name!r} is corrupt: {path} has checksum {got:016x}, the store "
                f"recorded {want:016x} ({ALGORITHM}) when it was written"
            )
        if self.by_url and not getattr(self.fs, "pinned", lambda p: True)(path):
            return  # later range reads could not be tied to this version: checked again then
        self._done.add((name, unit))
        before = self._pending.pop((name, unit), None)
        ledger = self.ledger() if before is not None else None
        if ledger is not None and before is not None:
            try:
                after = os.stat(path)
            except OSError:
                return
            if file_version(after) == file_version(before):  # not rewritten while hashed
                ledger.record(path, after, want)


def verify_file(
    verifier: Verifier, name: str, unit: int, path: str, *, opener: Any = None, what: str
) -> None:
    """Check one stored file (a chunk or a shard) against its checksum, if ``verifier`` asks.
    A file read through ``opener`` (by URL) is fetched by one of the reader's threads at a time
    (:meth:`Verifier.unit_lock`), and by the others not at all once
    it passed; a node cache's copy (a :class:`~.copies.CopyOpener`) is trusted by its record,
    unread, when that vouches for it (:mod:`.copies`)."""
    if not verifier.needed(name, unit, path if opener is None else None):
        return
    if opener is not None:
        with verifier.unit_lock(name, unit):
            if not verifier.needed(name, unit):
                return
            if isinstance(opener, CopyOpener):
                os.close(open_checked_copy(opener.fs, verifier, name, unit, path, what=what))
            else:
                _verify_file(verifier, name, unit, path, opener=opener, what=what)
        return
    _verify_file(verifier, name, unit, path, opener=None, what=what)


def _verify_file(
    verifier: Verifier, name: str, unit: int, path: str, *, opener: Any, what: str
) -> None:
    try:
        got = file_digest(path, opener=opener)
    except OSError as exc:
        raise ChunkReadError.from_os_error(exc, what, name, path) from exc
    verifier.check(name, unit, got, path=path, what=what)
