"""The node's ledger of verified chunk files: each local chunk file is hashed once per node,
not once per process or per epoch.

``verify="auto"`` checks every local chunk file (npy chunks, Zarr chunks and shards) against
its checksum before its rows are used. A DataLoader's workers are new processes every epoch
(unless ``persistent_workers``), and every rank of a node is a process of its own: with a
per-process record of checked chunks, each would hash the whole store again, one more pass
over every byte, about +30% of a raw-row epoch's CPU. The ledger records, per store and per
node, which file versions matched their checksum, so the next process trusts them.

A file version is ``(size, mtime_ns, inode, device)``: a chunk file rewritten, replaced,
copied or restored has another, and is hashed again. What the ledger cannot see is a change
that keeps all four (a bit rotting on the disk after it was checked): it promises what
``"first-epoch"`` promises, that no chunk reaches a batch unchecked the first time this node
reads it. ``shardload verify`` (or ``verify="always"``) re-hashes everything.

Where: ``$SHARDLOAD_VERIFY_LEDGER`` (a folder; ``off`` disables the ledger), else
``$XDG_CACHE_HOME/shardload/verified`` (``~/.cache/...``); one file per node and store,
``HOST-HASH.v1`` (the host name in it keeps a shared home's ledgers per node; the hash is of
the store's real path and of its ``checksums.npz``'s version, so a store prepared again in
place starts a new ledger). Where no ledger can be written, checks fall back to once per
process.

The file is an append-only log of fixed-size records (:data:`RECORD`: a key, the file
version, the checksum it matched, the record's own XXH3), appended under an ``flock`` on
``FILE.lock`` by every process of the node (DataLoader workers, ranks) and read without a
lock: a torn or garbled record fails its own checksum and is ignored, so the worst a crash,
a full disk or a stray write can do is make a chunk be hashed again. When it holds more
than twice as many records as files, the next reader rewrites it (atomically) with the
latest record of each.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from pathlib import Path

import numpy as np
import xxhash

from shardload.layout import CHECKSUMS_NAME
from shardload.util.locks import locked

log = logging.getLogger("shardload.verify")

LEDGER_ENV = "SHARDLOAD_VERIFY_LEDGER"
#: key (XXH3 of the file's path in the store), size, mtime_ns, inode, device, checksum, own XXH3
RECORD = np.dtype(
    [
        ("key", "<u8"),
        ("size", "<u8"),
        ("mtime_ns", "<u8"),
        ("ino", "<u8"),
        ("dev", "<u8"),
        ("digest", "<u8"),
        ("check", "<u8"),
    ]
)
_BODY = RECORD.itemsize - 8
_FIELDS = ("size", "mtime_ns", "ino", "dev", "digest")
#: Compact when there are more than this many records and over twice as many as keys.
COMPACT_MIN = 4096

_Version = tuple[int, int, int, int, int]  # size, mtime_ns, ino, dev, digest
_M64 = (1 << 64) - 1


def ledger_dir() -> Path | None:
    """The folder of this node's ledgers, or None when ``$SHARDLOAD_VERIFY_LEDGER`` is off."""
    env = os.environ.get(LEDGER_ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "none") else Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "shardload" / "verified"


def open_ledger(root: str) -> Ledger | None:
    """The ledger of the local store at ``root`` on this node, or None (disabled, no checksum
    file, or the folder cannot be created: then each process checks each chunk once).

    Its name holds the host, the store's real path and its checksum file's version: a store
    prepared again at the same path starts a new ledger."""
    folder = ledger_dir()
    if folder is None:
        return None
    real = os.path.realpath(root)
    try:
        sums = os.stat(os.path.join(real, CHECKSUMS_NAME))
    except OSError:
        return None  # the check itself reports a missing checksum file
    ident = f"{real}\0{file_version(sums)}".encode()
    name = f"{os.uname().nodename}-{xxhash.xxh3_64_hexdigest(ident)}.v1"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        log.warning("verify: no ledger of checked chunks (%s): each process checks them", exc)
        return None
    return Ledger(folder / name, root)


def file_version(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


class Ledger:
    """One store's verified file versions on this node (thread-safe; one per process)."""

    def __init__(self, path: Path, root: str) -> None:
        self.path, self.root = path, root.rstrip("/")
        self._seen: dict[int, _Version] = {}
        self._ino: int | None = None  # the ledger file read so far, and how far
        self._offset = 0
        self._records = 0
        self._lock = threading.Lock()
        self._broken = False  # an append failed (full or read-only disk): stop trying

    def key(self, path: str) -> int:
        rel = path[len(self.root) + 1 :] if path.startswith(self.root + "/") else path
        return int(xxhash.xxh3_64_intdigest(rel.encode()))

    def trusted(self, path: str, st: os.stat_result) -> bool:
        """Whether this version of file ``path`` (``st``) was found to match its checksum."""
        key, want = self.key(path), file_version(st)
        with self._lock:
            got = self._seen.get(key)
            if got is None or got[:4] != want:
                self._refresh()  # another process may have checked it meanwhile
                got = self._seen.get(key)
            return got is not None and got[:4] == want

    def record(self, path: str, st: os.stat_result, digest: int) -> None:
        """Note that version ``st`` of file ``path`` matched ``digest`` (for every process)."""
        key, version = self.key(path), (*file_version(st), digest & _M64)
        raw = encode_records({key: version})
        with self._lock:
            self._seen[key] = version
            if self._broken:
                return
            try:
                with locked(f"{self.path}.lock"):
                    fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
                    try:
                        size = os.fstat(fd).st_size
                        if size % RECORD.itemsize:  # a torn record (a writer killed mid-write)
                            os.ftruncate(fd, size - size % RECORD.itemsize)
                        os.write(fd, raw)
                    finally:
                        os.close(fd)
            except OSError as exc:
                self._broken = True
                log.warning("verify: cannot write the ledger %s (%s)", self.path, exc)

    def _refresh(self) -> None:
        """Read the records appended since the last call (all of them if the file was
        replaced by a compaction); compact when due."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:  # none yet, or not ours to read: vouches for nothing
            return
        try:
            st = os.fstat(fd)
            if st.st_ino != self._ino:
                self._ino, self._offset, self._records = st.st_ino, 0, 0
            end = st.st_size - st.st_size % RECORD.itemsize
            if end <= self._offset:
                return
            data = os.pread(fd, end - self._offset, self._offset)
        finally:
            os.close(fd)
        self._offset += len(data)
        self._records += len(data) // RECORD.itemsize
        self._seen.update(parse_records(data))
        if self._records > max(COMPACT_MIN, 2 * len(self._seen)):
            self._compact()

    def _compact(self) -> None:
        """Rewrite the file with the latest record of each file (under the writers' lock)."""
        with contextlib.suppress(OSError), locked(f"{self.path}.lock"):
            with open(self.path, "rb") as f:
                latest = parse_records(f.read())
            from shardload.util.durable import write_atomic  # its import looks up libc: lazily

            write_atomic(self.path, encode_records(latest))
            self._seen.update(latest)
            self._ino = os.stat(self.path).st_ino
            self._offset = len(latest) * RECORD.itemsize
            self._records = len(latest)


def parse_records(data: bytes) -> dict[int, _Version]:
    """The valid records of ``data`` (whole records only), the last one of each key."""
    recs = np.frombuffer(data, RECORD, count=len(data) // RECORD.itemsize)
    out: dict[int, _Version] = {}
    for rec in recs:
        if xxhash.xxh3_64_intdigest(rec.tobytes()[:_BODY]) != int(rec["check"]):
            continue  # torn or garbled: ignored (the chunk is hashed again)
        size, mtime_ns, ino, dev, digest = (int(rec[f]) for f in _FIELDS)
        out[int(rec["key"])] = (size, mtime_ns, ino, dev, digest)
    return out


def encode_records(versions: dict[int, _Version]) -> bytes:
    """Records of ``versions`` (key -> file version and checksum), each with its own XXH3."""
    recs = np.zeros(len(versions), RECORD)
    for j, (key, v) in enumerate(versions.items()):
        recs[j] = (key, *(x & _M64 for x in v), 0)
    raw = bytearray(recs.tobytes())
    for a in range(0, len(raw), RECORD.itemsize):
        check = xxhash.xxh3_64_intdigest(bytes(raw[a : a + _BODY]))
        raw[a + _BODY : a + RECORD.itemsize] = check.to_bytes(8, "little")
    return bytes(raw)
