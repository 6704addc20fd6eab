"""Direct chunk reads for simple local Zarr v3 arrays: the chunk file straight into the caller's
buffer, bypassing zarr-python's async codec pipeline.

Used only when an array's ``zarr.json`` says exactly what shardload writes: a regular chunk grid
chunked along axis 0 only (matching the manifest's chunk bounds), the default chunk key encoding,
a ``bytes`` codec (little endian, on a little-endian machine), then either nothing or one
``blosc`` codec, no storage transformers. With ``shards=True`` (the reader), the same inside
Zarr's ``sharding_indexed`` codec: shards and inner chunks along axis 0 only, the index
``bytes`` (+ ``crc32c``) at either end (read by :mod:`.zarr_shards`). A Zarr v2 array whose
``.zarray`` describes the same bytes (C order, no filters, Blosc or no compressor: an
anemoi-datasets store) is read the same way (:func:`.foreign.v2_as_v3`; its chunk keys have no ``c``
prefix). With ``splits=True`` (the reader, for plain Zarr), chunks may also cut a row along
one other axis (:class:`.foreign.BlockSplit`: an anemoi-datasets store with several ensemble members is
chunked ``(1, variables, 1, cells)``): each block of a row is decoded whole and copied into
its slice of the destination rows. Anything else (other codecs, nested shards, URLs) keeps
going through zarr-python (:meth:`ZarrReader.read`).

Uncompressed chunks are read with ``readinto`` on a view of the destination rows (one copy, from
the page cache); Blosc chunks are decoded by ``numcodecs`` straight into the destination, in C
without the GIL, so the loader's reader threads decode in parallel.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

# imported with the module (a Zarr store's open), not at its first chunk: importing numcodecs
# takes about 0.1 s, which would otherwise land in the first epoch's first batch
from numcodecs import Blosc, blosc

from shardload.errors import ChunkReadError
from shardload.formats.base import aligned_empty, readinto_full
from shardload.formats.zarr.foreign import BlockSplit, plan_block_split, v2_as_v3

_CODECS_OK = ({"bytes"}, {"bytes", "blosc"})


@dataclass(frozen=True)
class ShardSpec:
    """The sharding codec's settings a native shard read needs (see :mod:`.zarr_shards`)."""

    chunks: int  # inner chunks per shard (all along axis 0)
    index_at_end: bool  # index_location "end" (zarr's default), else "start"
    index_crc: bool  # index_codecs end with crc32c (zarr's default)

    @property
    def index_nbytes(self) -> int:
        """Bytes of the stored index: (offset, nbytes) uint64 per inner chunk (+ its crc32c)."""
        return 16 * self.chunks + (4 if self.index_crc else 0)


@dataclass(frozen=True)
class ChunkLayout:
    """How to find and decode one array's chunks (see :func:`plan_chunk_layout`)."""

    folder: str  # the array's folder (holds zarr.json and c/...)
    chunk_rows: int
    ndim: int
    dtype: np.dtype
    row_bytes: int
    separator: str
    blosc_config: dict[str, Any] | None  # the blosc codec's configuration, or None: raw bytes
    strict: bool  # a missing chunk is an error (shardload stores); else it is fill_value
    fill_value: Any
    #: Opens a chunk file for binary reading (default: the local file, unbuffered); e.g. a
    #: remote filesystem's ``open`` when its whole-file cache makes every chunk a local file.
    opener: Any = None
    #: Sharded: ``chunk_rows`` are the inner chunks' rows, ``chunk_path(k)`` is shard ``k``.
    shard: ShardSpec | None = None
    #: what chunk keys start with: ``c`` in Zarr v3's default encoding, nothing in Zarr v2
    key_prefix: tuple[str, ...] = ("c",)
    #: chunks that also cut each row along one axis (plain Zarr, e.g. anemoi's members)
    split: BlockSplit | None = None

    def open(self, path: str) -> Any:
        return self.opener(path) if self.opener is not None else open(path, "rb", buffering=0)

    @property
    def blosc(self) -> bool:
        return self.blosc_config is not None

    @property
    def blosc_header(self) -> tuple[tuple[int, int], int]:
        """The type sizes a chunk's Blosc header may carry and its flags' shuffle bits (byte
        shuffle 0x01, bit shuffle 0x04; -1: any). shardload's writers (``strict``) write the
        dtype's item size (1 above 255, as c-blosc does) and the codec's shuffle, even where the
        chunk is stored uncompressed: one flipped bit there otherwise decodes, silently, to other
        values. Other writers may write 1 for any item size."""
        size = self.dtype.itemsize
        if not self.strict:
            return (1, size), -1
        shuffle = str((self.blosc_config or {}).get("shuffle"))
        return (size if size <= 255 else 1,) * 2, {"noshuffle": 0, "shuffle": 1}.get(shuffle, 4)

    def chunk_path(self, i: int, block: int = 0) -> str:
        """The file of chunk ``i`` (and, with a split, of its block ``block``)."""
        rest = ["0"] * (self.ndim - 1)
        if self.split is not None:
            rest[self.split.axis - 1] = str(block)
        key = self.separator.join([*self.key_prefix, str(i), *rest])
        return f"{self.folder}/{key}"


def plan_chunk_layout(
    meta: dict[str, Any],
    *,
    folder: str,
    dtype: np.dtype,
    shape: tuple[int, ...],
    chunk_bounds: list[int] | tuple[int, ...] | np.ndarray,
    strict: bool,
    shards: bool = False,
    splits: bool = False,
) -> ChunkLayout | None:
    """The layout of an array from its ``zarr.json`` (pure), or None when it is not simple.

    ``shards``: also plan arrays stored with the sharding codec (for the reader; the writer
    leaves those to zarr-python). ``splits``: also plan chunks that cut rows along one other
    axis (:class:`.foreign.BlockSplit`; not sharded, for the reader of plain Zarr)."""
    if sys.byteorder != "little" or meta.get("zarr_format") != 3:
        return None
    if meta.get("storage_transformers") or meta.get("node_type") != "array":
        return None
    grid, keys = meta.get("chunk_grid") or {}, meta.get("chunk_key_encoding") or {}
    if grid.get("name") != "regular" or keys.get("name") != "default":
        return None
    chunk_shape = tuple(int(c) for c in (grid.get("configuration") or {}).get("chunk_shape", ()))
    if tuple(int(s) for s in meta.get("shape", ())) != tuple(shape) or len(chunk_shape) != len(
        shape
    ):
        return None
    if not shape or chunk_shape[0] <= 0:
        return None
    split = None
    if chunk_shape[1:] != tuple(shape[1:]):
        split = plan_block_split(chunk_shape, tuple(shape)) if splits else None
        if split is None:
            return None
    codecs = meta.get("codecs") or []
    if split is not None and any((c or {}).get("name") == "sharding_indexed" for c in codecs):
        return None
    shard = None
    if shards and len(codecs) == 1 and (codecs[0] or {}).get("name") == "sharding_indexed":
        planned = _plan_shard(codecs[0].get("configuration") or {}, chunk_shape)
        if planned is None:
            return None
        shard, chunk_shape, codecs = planned
    rows = chunk_shape[0]
    bounds = np.asarray(chunk_bounds, dtype=np.int64)  # numpy: a store has thousands of chunks
    if not len(bounds) or bounds[-1] != shape[0]:
        return None
    if not np.array_equal(bounds, np.minimum(np.arange(len(bounds)) * rows, shape[0])):
        return None
    names = [c.get("name") if isinstance(c, dict) else None for c in codecs]
    if set(names) not in _CODECS_OK or len(names) != len(set(names)) or names[0] != "bytes":
        return None
    endian = (codecs[0].get("configuration") or {}).get("endian", "little")
    try:
        zdtype = np.dtype(meta["data_type"])
    except (KeyError, TypeError):
        return None
    if (endian != "little" and zdtype.itemsize > 1) or zdtype != dtype or dtype.hasobject:
        return None
    try:  # fill values zarr writes as strings ("NaN", "Infinity") convert; hex ones do not
        fill = np.array(meta.get("fill_value", 0), dtype=dtype)
    except (TypeError, ValueError):
        return None
    sep = ((keys.get("configuration") or {}).get("separator")) or "/"
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    blosc = dict(codecs[1].get("configuration") or {}) if "blosc" in names else None
    return ChunkLayout(
        folder.rstrip("/"),
        rows,
        len(shape),
        dtype,
        row_bytes,
        sep,
        blosc,
        strict,
        fill,
        shard=shard,
        split=split,
    )


def _plan_shard(
    config: dict[str, Any], shard_shape: tuple[int, ...]
) -> tuple[ShardSpec, tuple[int, ...], list[Any]] | None:
    """The shard settings, inner chunk shape and inner codecs of a ``sharding_indexed``
    configuration, or None unless shards and inner chunks split axis 0 only and the index is
    the plain one (``bytes``, little endian, optionally ``crc32c``) at either end."""
    try:
        inner = tuple(int(c) for c in config.get("chunk_shape", ()))
    except (TypeError, ValueError):
        return None
    if len(inner) != len(shard_shape) or inner[1:] != shard_shape[1:] or inner[0] <= 0:
        return None
    if shard_shape[0] % inner[0]:
        return None
    index = config.get("index_codecs") or []
    names = [c.get("name") if isinstance(c, dict) else None for c in index]
    if names not in (["bytes"], ["bytes", "crc32c"]):
        return None
    if (index[0].get("configuration") or {}).get("endian", "little") != "little":
        return None
    where = config.get("index_location", "end")
    if where not in ("end", "start"):
        return None
    codecs = config.get("codecs") or []
    if not isinstance(codecs, list):
        return None
    spec = ShardSpec(shard_shape[0] // inner[0], where == "end", names[-1] == "crc32c")
    return spec, inner, codecs


def load_chunk_layout(
    folder: str, *, opener: Any = None, meta_opener: Any = None, **kw: Any
) -> ChunkLayout | None:
    """Read ``folder/zarr.json`` (else a Zarr v2 ``.zarray``, e.g. an anemoi-datasets store's,
    as the same layout: :func:`.foreign.v2_as_v3`) and plan its layout; None if absent or not simple.

    ``opener`` (default: local files) opens the chunk files, and the metadata unless
    ``meta_opener`` is given (a reader's cache of its small files, read once by URL)."""
    meta_opener = meta_opener if meta_opener is not None else opener
    meta = _read_json(folder, "zarr.json", meta_opener)
    prefix: tuple[str, ...] = ("c",)
    if meta is None:
        meta, prefix = v2_as_v3(_read_json(folder, ".zarray", meta_opener)), ()
    layout = plan_chunk_layout(meta, folder=folder, **kw) if isinstance(meta, dict) else None
    if layout is None:
        return None
    return dataclasses.replace(layout, opener=opener, key_prefix=prefix)


def _read_json(folder: str, name: str, opener: Any) -> Any:
    try:
        path = f"{folder.rstrip('/')}/{name}"
        with opener(path) if opener is not None else open(path, "rb") as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def row_parts(start: int, stop: int, rows: int) -> Iterator[tuple[int, int, int, int]]:
    """Rows ``[start, stop)`` cut at multiples of ``rows`` (chunks, shards): ``(unit, lo, hi,
    at)`` per unit, its rows ``[lo, hi)`` within the unit, landing at row ``at`` of the
    output.

    >>> list(row_parts(5, 20, 8))
    [(0, 5, 8, 0), (1, 0, 8, 3), (2, 0, 4, 11)]
    """
    pos = start
    while pos < stop:
        i = pos // rows
        lo, hi = pos - i * rows, min(stop - i * rows, rows)
        yield i, lo, hi, pos - start
        pos += hi - lo


_SCRATCH = threading.local()


def read_whole(f: Any) -> memoryview:
    """The whole file ``f``, read into this thread's reused scratch buffer (valid until the
    thread's next call): a fresh ~20 MB ``bytes`` per compressed chunk costs page faults and a
    copy of its own. Page-aligned: the kernel copies into it at a third of the CPU
    (:func:`~shardload.formats.base.aligned_empty`)."""
    try:
        size = os.fstat(f.fileno()).st_size
    except (AttributeError, OSError, ValueError):  # not a local file (an fsspec opener)
        return memoryview(f.read())
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or len(buf) < size + 1:
        buf = _SCRATCH.buf = aligned_empty(max(size + 1, 1 << 20))
    view = buf.data.cast("B")
    got = readinto_full(f, view[: size + 1])  # one byte more: a file grown since fstat shows
    return view[:got]


def decode_into(
    layout: ChunkLayout,
    raw: memoryview,
    a: int,
    b: int,
    dst: memoryview,
    *,
    name: str,
    what: str,
    path: str,
) -> None:
    """Blosc-decode one whole stored chunk ``raw`` and put its rows ``[a, b)`` into ``dst``,
    after checking its header against ``raw`` and the chunk's size (errors name ``what``)."""
    nrows, rb = layout.chunk_rows, layout.row_bytes
    try:
        if len(raw) < 16:
            raise ValueError(f"{len(raw)} bytes, shorter than a Blosc header")
        nbytes, _, cbytes = np.frombuffer(raw, "<u4", count=3, offset=4).tolist()
        if cbytes != len(raw) or nbytes != nrows * rb:
            raise ValueError(
                f"header says {cbytes} compressed / {nbytes} decoded bytes; the file has "
                f"{len(raw)} and a chunk decodes to {nrows * rb}"
            )
        typesize, (sizes, shuffle) = int(raw[3]), layout.blosc_header
        if typesize not in sizes:  # numcodecs writes 1 for > 255 bytes
            raise ValueError(
                f"header says items of {typesize} bytes; the array's {layout.dtype} has "
                f"{layout.dtype.itemsize}"
            )
        if shuffle >= 0 and raw[2] & 0x05 != shuffle:
            raise ValueError(
                f"header says shuffle flags {raw[2] & 0x05:#x}; the array's codec writes "
                f"{shuffle:#x} ({(layout.blosc_config or {}).get('shuffle')})"
            )
        if a == 0 and b == nrows:
            blosc.decompress(raw, dst)  # in C, without the GIL, straight into the caller's rows
        else:  # part of a chunk: decode all of it, keep the rows asked for
            full = np.empty(nrows * rb, np.uint8)
            blosc.decompress(raw, full)
            dst[:] = full[a * rb : b * rb].data
    except Exception as exc:
        raise ChunkReadError(
            f"{what} of array {name!r} is truncated or corrupt (Blosc): {path}: {exc}"
        ) from exc


@dataclass(frozen=True)
class StoredObjects:
    """The files of a Zarr v3 array chunked along axis 0 only: chunk files, or shard files
    when the sharding codec is used (then ``rows`` is the rows of a shard). The unit of
    checksums for Zarr: ``path(k)`` holds rows ``[k * rows, (k + 1) * rows)``."""

    folder: str
    rows: int
    ndim: int
    separator: str

    def path(self, k: int) -> str:
        return f"{self.folder}/{self.separator.join(['c', str(k), *(['0'] * (self.ndim - 1))])}"

    def units(self, start: int, stop: int) -> range:
        return range(start // self.rows, -(-stop // self.rows)) if stop > start else range(0)


def load_stored_objects(folder: str, *, opener: Any = None) -> StoredObjects | None:
    """Read ``folder/zarr.json``; None unless a Zarr v3 array with a regular grid, default
    chunk keys and chunks (or shards) that span whole rows."""
    try:
        path = f"{folder.rstrip('/')}/zarr.json"
        with opener(path) if opener is not None else open(path, "rb") as f:
            meta = json.loads(f.read())
        grid, keys = meta.get("chunk_grid") or {}, meta.get("chunk_key_encoding") or {}
        shape = [int(s) for s in meta["shape"]]
        chunk = [int(c) for c in (grid.get("configuration") or {})["chunk_shape"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if meta.get("zarr_format") != 3 or grid.get("name") != "regular":
        return None
    if keys.get("name") != "default" or not shape or chunk[1:] != shape[1:] or chunk[0] <= 0:
        return None
    sep = ((keys.get("configuration") or {}).get("separator")) or "/"
    return StoredObjects(folder.rstrip("/"), chunk[0], len(shape), sep)


def blosc_codec(config: dict[str, Any]) -> Any:
    """numcodecs' Blosc with a Zarr v3 blosc codec's settings (zarr's codec wraps it too)."""

    shuffle = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE}.get(
        str(config.get("shuffle")), Blosc.BITSHUFFLE
    )
    return Blosc(
        cname=config.get("cname", "zstd"),
        clevel=int(config.get("clevel", 5)),
        shuffle=shuffle,
        blocksize=int(config.get("blocksize", 0)),
    )
