"""The small protocols every on-disk format implements: a writer (``formats/NAME/write.py``)
that writes blocks of rows into a store folder being prepared, and a reader
(``formats/NAME/read.py``) of a finished store (local path or fsspec URL). Optional read
capabilities are small runtime-checkable protocols. Formats are picked by name in
:mod:`shardload.formats.registry`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shardload.manifest.core import ArraySpec

#: The codec an array gets when nothing else decides it (``FormatOptions()``, a
#: variable-length array of a store with ``compression: auto``).
DEFAULT_COMPRESSION = "lz4"
#: The config's default ``compression``: lz4 for each array whose first chunks it shrinks,
#: none for the others (decided per array before the store is created: :mod:`shardload.prep.codecs`).
AUTO = "auto"
#: Blosc levels when the config gives none (the writers' and ``auto``'s measure).
DEFAULT_LEVELS = {"zstd": 3, "lz4": 5}
#: The manifest option (``shardload.json``'s ``options``) naming each array's stored codec
#: when the config said ``compression: auto``.
ARRAY_COMPRESSION = "array_compression"


@dataclass(frozen=True)
class FormatOptions:
    compression: str = DEFAULT_COMPRESSION
    level: int | None = None
    shard_chunks: int | None = None  # zarr: chunks per shard (None: no sharding codec)
    #: with ``compression: auto``: each fixed-size array's codec ("lz4" or "none"), decided
    #: once before the store is created; arrays not named get :data:`DEFAULT_COMPRESSION`
    codecs: Mapping[str, str] = field(default_factory=dict)

    def for_array(self, name: str) -> FormatOptions:
        """The options array ``name`` is written with: its own codec under ``auto``.

        >>> FormatOptions(AUTO, codecs={"x": "none"}).for_array("x").compression
        'none'
        >>> FormatOptions(AUTO, codecs={"x": "none"}).for_array("y").compression
        'lz4'
        >>> FormatOptions("zstd").for_array("x").compression
        'zstd'
        """
        if self.compression != AUTO:
            return self
        codec = self.codecs.get(name, DEFAULT_COMPRESSION)
        return FormatOptions(codec, self.level, self.shard_chunks)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "compression": self.compression,
            "level": self.level,
            "shard_chunks": self.shard_chunks,
        }
        if self.compression == AUTO:
            d[ARRAY_COMPRESSION] = dict(sorted(self.codecs.items()))
        return d


def array_compression(options: Mapping[str, Any], name: str) -> str:
    """The codec array ``name`` of a store is stored with, from its manifest's ``options``
    (pure): the store's ``compression``, or under ``auto`` the array's own.

    >>> array_compression({"compression": "none"}, "x")
    'none'
    >>> opts = {"compression": "auto", "array_compression": {"x": "none"}}
    >>> array_compression(opts, "x"), array_compression(opts, "ragged")
    ('none', 'lz4')
    """
    compression = str(options.get("compression", "none"))
    if compression != AUTO:
        return compression
    return str((options.get(ARRAY_COMPRESSION) or {}).get(name, DEFAULT_COMPRESSION))


class ArrayReader(Protocol):
    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``[start, stop)`` of array ``name`` (a new array the caller owns)."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class ReadsInto(Protocol):
    """Optional capability: read rows into a caller's buffer (saves one copy per read)."""

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None: ...


@runtime_checkable
class ReadsSpansInto(Protocol):
    """Optional capability: read several row spans of one array, each into its own buffer, in
    one call (a reader pays its per-file costs once per call: a shard opened once)."""

    def read_spans_into(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None: ...


@runtime_checkable
class ChecksMetadata(Protocol):
    """Optional capability: check each fixed-shape array's own metadata (a Zarr array's
    ``zarr.json``, an npy chunk's header, an HDF5 dataset) against the manifest, with one small
    read per array; called when a store is opened, before any buffer is sized from the
    manifest. Raises :class:`~shardload.errors.StoreError` naming ``where`` (the manifest)
    and the file that disagrees."""

    def check_metadata(self, where: str) -> None: ...


@runtime_checkable
class CarriesMetadata(Protocol):
    """Optional capability (by URL): the metadata files this reader fetched and checked, as
    ``{path: bytes}`` (:meth:`carried_metadata`), handed with a pickled Store to the reader of
    a DataLoader worker, which keeps them (:meth:`take_metadata`) and checks them against the
    manifest in :meth:`ChecksMetadata.check_metadata` as if it had fetched them, fetching none
    of them again."""

    def carried_metadata(self) -> dict[str, bytes]: ...

    def take_metadata(self, carried: Mapping[str, bytes]) -> None: ...


@dataclass(frozen=True)
class RawChunk:
    """Where a chunk's rows lie, uncompressed and C-ordered, in a local file: row ``r`` is the
    ``row_bytes`` bytes at ``offset + r * row_bytes``."""

    path: str
    offset: int
    row_bytes: int
    #: a node cache's copy (``formats/npy/cached.py``): opens the checked copy and returns a
    #: descriptor the caller closes and the chunk with its offset; ``path`` names it in errors
    opener: Callable[[], tuple[int, RawChunk]] | None = field(default=None, compare=False)
    #: its descriptor serves one read task, not the epoch (a bounded node cache may evict the
    #: copy: a descriptor kept open would keep its bytes in ``/dev/shm`` past the bound)
    transient: bool = False
    #: the shard file holding this inner chunk (:class:`RawShard`), which it shares with them
    shard: RawShard | None = field(default=None, compare=False)


@dataclass(frozen=True)
class RawShard:
    """Where a local shard file's raw inner chunks lie (checked against the store's checksum
    and its index's, as the reader's ``verify`` asks): inner chunk ``j``'s rows from byte
    ``offsets[j]`` (-1: never written, its rows are ``fill_row``), C-ordered, ``row_bytes``
    each, ``chunk_bytes`` an inner chunk; the file holds at least ``file_bytes``. ``version``:
    the file these offsets are of (inode, device, size, mtime in ns; None: not known), which
    the file a reader opens must still be."""

    path: str
    offsets: np.ndarray = field(compare=False)  # int64, one per inner chunk
    row_bytes: int
    chunk_bytes: int
    file_bytes: int
    fill_row: bytes = field(compare=False)  # one row of the fill value
    version: tuple[int, int, int, int] | None = field(default=None, compare=False)


@runtime_checkable
class RawChunks(Protocol):
    """Optional capability: say where a chunk's raw rows are (None: not a plain local file)."""

    def raw_chunk(self, name: str, i: int) -> RawChunk | None: ...


@runtime_checkable
class RawShards(Protocol):
    """Optional capability: a sharded array's raw inner chunks in local shard files.
    :meth:`raw_shard_chunks`: inner chunks per shard, or None (not raw local shards; no I/O);
    :meth:`raw_shard`: shard ``k``, checked first."""

    def raw_shard_chunks(self, name: str) -> int | None: ...

    def raw_shard(self, name: str, k: int) -> RawShard: ...


@runtime_checkable
class DecodesRows(Protocol):
    """Optional capability: compressed chunks decoded straight into the places their rows go.
    :meth:`decoded_rows`: whether ``name`` is served (no I/O); :meth:`decode_rows_into`: row
    ``rows[i]`` (sorted, each once) to memory address ``to[i]``, each stored file checked first."""

    def decoded_rows(self, name: str) -> bool: ...

    def decode_rows_into(self, name: str, rows: np.ndarray, to: np.ndarray) -> None: ...


class FormatWriter(Protocol):
    """Writes a store's fixed-shape arrays (``WRITER`` in ``formats/NAME/write.py``)."""

    name: str
    #: True when tasks in any process may write blocks concurrently, each durable on its own
    #: (zarr, npy); False: tasks stage blocks and the driver builds the file at the end (one
    #: HDF5 file; see shardload.prep.commit).
    parallel_write: bool

    def create(
        self,
        root: Any,
        specs: Mapping[str, ArraySpec],
        bounds: Sequence[int],
        options: FormatOptions,
    ) -> dict[str, str]:
        """Create empty arrays; return each array's path inside the store."""
        ...

    def write_block(
        self,
        root: Any,
        name: str,
        chunk_index: int,
        start: int,
        data: np.ndarray,
        *,
        bounds: Sequence[int],
    ) -> dict[int, int]:
        """Write rows ``[start, start+len(data))``; they span whole chunks from ``chunk_index``.

        Returns the checksum (:func:`shardload.formats.checksums.digest`) of every checksum unit it
        wrote, by unit number (see :mod:`shardload.formats.checksums` for what a unit is per format)."""
        ...

    def finish(self, root: Any) -> None:
        """Flush and close what the writer holds (called once, by the driver)."""
        ...

    def array_path(self, name: str, *, ragged: bool = False) -> str:
        """The manifest's ``path`` of array ``name`` (inside the store)."""
        ...


def is_local(fs: Any) -> bool:
    """True for fsspec's local filesystem (fast paths: np.fromfile, mmap, h5py by path)."""
    protocol = getattr(fs, "protocol", "file")
    protocols = protocol if isinstance(protocol, (tuple, list)) else (protocol,)
    return "file" in protocols or "local" in protocols


class LocalFS:
    """fsspec's local filesystem, imported on first use: what a local store's readers ask of
    it (:func:`is_local`) needs no fsspec, and the default load reads its files directly, so a
    process loading a local store never pays fsspec's import (0.27 s of its first epoch,
    docs/benchmarks.md, 2026-11-28). Any other attribute is the real ``LocalFileSystem``'s."""

    protocol = ("file", "local")
    # what the loader asks of a filesystem that fsspec's local one has not (a node cache's
    # filesystem has them: load/cache_hook.py, formats/zarr/files.py): None, without fsspec
    plan_cache = node_cache = spec = None

    def release(self) -> None:
        """Nothing to release (``Store.close`` asks every filesystem; asking fsspec's would
        import it, at every close of a store opened from a path)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickle, copy and friends: this object's own
            raise AttributeError(name)
        fs = self.__dict__.get("_fs")
        if fs is None:
            from fsspec.implementations.local import LocalFileSystem

            fs = self.__dict__["_fs"] = LocalFileSystem()
        return getattr(fs, name)

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (LocalFS, ())

    def __repr__(self) -> str:
        return "LocalFS()"


def readinto_full(f: Any, dst: memoryview) -> int:
    """Fill ``dst`` from file ``f`` with as many ``readinto`` calls as it takes; the number of
    bytes read (less than ``len(dst)`` only at the end of the file)."""
    got = 0
    while got < len(dst):
        n = f.readinto(dst[got:])
        if not n:
            break
        got += n
    return got


#: Alignment of the buffers the read side reads whole files into (a page).
READ_ALIGN = 4096


def aligned_empty(nbytes: int, align: int = READ_ALIGN) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose first byte is ``align``-aligned.

    ``np.empty`` of a large array starts 16 bytes into a page, and the kernel's copy of a file
    into such a buffer (``read``/``readinto``) measured 3-4x the CPU of the same copy into a
    page-aligned one on the reference machine (AMD EPYC, ``rep movsb``: 8.7 against 2.8 ms per
    20 MB from the page cache; docs/design.md, "Aligned read buffers")."""
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off : off + nbytes]
