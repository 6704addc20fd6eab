"""Reading Zarr v3 stores (the default format), and plain Zarr v2/v3 data (e.g. written by
xarray, described by :func:`shardload.formats.zarr.plain.manifest_from_zarr`).

Local arrays in the layouts shardload writes are read chunk by chunk straight into the caller's
buffer (:mod:`.chunks`, :mod:`.shards`, :mod:`.rows`); everything else through zarr-python.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, ShardloadError, StoreError
from shardload.formats.base import RawChunk, RawShard, is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, verify_file
from shardload.formats.copies import is_cached
from shardload.formats.ragged.read import GroupedRagged
from shardload.formats.zarr.ahead import ahead_for, fetch_ahead
from shardload.formats.zarr.cf import CFDecoding
from shardload.formats.zarr.chunks import (
    ChunkLayout,
    StoredObjects,
    load_chunk_layout,
    load_stored_objects,
)
from shardload.formats.zarr.files import CarriedMetadata, StoredFiles, meta_path
from shardload.formats.zarr.kept import kept_for, plan_kept
from shardload.formats.zarr.meta import check_zarr_meta
from shardload.formats.zarr.ranges import RawUrlReads, raw_layout
from shardload.formats.zarr.rows import read_rows_into
from shardload.formats.zarr.shard_fetch import read_url_spans_into
from shardload.formats.zarr.shard_local import raw_shard
from shardload.formats.zarr.shard_spans import read_spans_into
from shardload.formats.zarr.shards import RangeOpener, ShardIndexCache
from shardload.formats.zarr.url_rows import DecodedRowsByUrl
from shardload.manifest.core import Manifest


def open_reader(
    fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
) -> ZarrReader:
    return ZarrReader(fs, root, manifest, verify=verify)


def open_group_readonly(fs: Any, root: str, *, strict: bool = False) -> Any:
    """The Zarr group at ``root``, read-only. A remote store is read through the same
    filesystem as the other formats (:class:`shardload.move.remote.RemoteFileSystem`: retries,
    errors naming the URL, the optional bounded cache), handed to zarr's async core with
    fsspec's ``AsyncFileSystemWrapper``. ``strict`` (a shardload store): a chunk missing there
    raises :class:`~shardload.errors.ChunkReadError` instead of reading as the fill value
    (:mod:`.strict`; local chunks are checked before each read, :meth:`ZarrReader.check_files`)."""
    import zarr
    import zarr.errors
    from zarr.storage import FsspecStore, LocalStore

    if is_local(fs):
        store: Any = LocalStore(root, read_only=True)
    else:
        from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper

        from shardload.move.remote import RemoteFileSystem, open_fs

        if not isinstance(fs, RemoteFileSystem):  # a plain fsspec filesystem
            fs, root = open_fs(_url(fs, root), storage_options=_so(fs))
        from shardload.formats.zarr.strict import StrictFsspecStore, widen_zarr_threads

        widen_zarr_threads()
        store = (StrictFsspecStore if strict else FsspecStore)(
            AsyncFileSystemWrapper(fs.fsspec_view, asynchronous=True), read_only=True, path=root
        )
        # Zarr v3 first: one request (zarr.json) instead of also probing the three v2 keys
        try:
            return zarr.open_group(store=store, mode="r", zarr_format=3)
        except (FileNotFoundError, zarr.errors.NodeNotFoundError):
            pass  # plain Zarr v2 data
    return zarr.open_group(store=store, mode="r")


class ZarrReader(CarriedMetadata, DecodedRowsByUrl):
    """Reads row ranges. Local arrays in the simple layouts shardload writes (chunk files, or
    shards of inner chunks along rows; no codec but Blosc) are read straight into the caller's
    memory (:mod:`.chunks`, :mod:`.shards`, :mod:`.shard_rows`); the rest through zarr-python.

    In a shardload store (a manifest, not plain Zarr) a missing chunk or shard is an error on
    every path, never zarr's fill value; stored files are checked against the store's
    checksums as ``verify`` says (one unit per chunk file, or per shard file)."""

    def __init__(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.fs, self.root, self.manifest = fs, root, manifest
        self._group: Any = None
        self._arrays: dict[str, Any] = {}
        self._layouts: dict[str, ChunkLayout | None] = {}
        self._ranged: dict[str, ChunkLayout | None] = {}
        self._objects: dict[str, StoredObjects | None] = {}
        self._indexes = ShardIndexCache()  # parsed shard indexes (sharded arrays)
        self._lock = threading.Lock()
        self.files = StoredFiles(fs)  # by URL: a file one request, zarr.json once per reader
        # CF mask and scale of plain (e.g. xarray-written) arrays: stored -> served values
        self._cf = {
            k: CFDecoding.from_dict(a.attrs["cf"])
            for k, a in manifest.arrays.items()
            if "cf" in a.attrs
        }
        self.strict = manifest.provenance.get("source") != "plain zarr"
        self.verifier = Verifier(fs, root, manifest, verify, files=True)
        self.raw_url = RawUrlReads(fs, self.verifier)  # raw chunk files by URL (:meth:`ranged`)

    def _opener(self) -> Any:
        return self.files.opener()

    def objects(self, name: str) -> StoredObjects | None:
        """The stored files of array ``name`` (chunks or shards), from its ``zarr.json``."""
        if name not in self._objects:
            info = self.manifest.arrays[name]
            folder = f"{self.root.rstrip('/')}/{info.path}"
            self._objects[name] = load_stored_objects(folder, opener=self.files.meta_opener())
        return self._objects[name]

    def check_metadata(self, where: str) -> None:
        """Each fixed array's ``zarr.json`` against the manifest ``where`` (data type, shape,
        chunk grid): one small read per array, when the store is opened. Plain Zarr data has
        no manifest of its own to disagree with."""
        if not self.strict:
            return
        fixed = {k: a for k, a in self.manifest.arrays.items() if not a.is_ragged}
        self.files.prefetch_metadata(self.root, fixed, self.verifier)  # by URL: one round trip
        for name, info in fixed.items():
            path = meta_path(self.root, info)
            try:
                meta = json.loads(self._read_small(path, what=f"zarr.json of array {name!r}"))
            except FileNotFoundError as exc:
                raise StoreError(f"array {name!r} of {where} has no {path}") from exc
            except (OSError, ValueError) as exc:
                raise StoreError(f"array {name!r}: {path} cannot be read: {exc}") from exc
            shards = self.manifest.options.get("shard_chunks")
            check_zarr_meta(meta, info, path=path, where=where, shard_chunks=shards)

    def _read_small(self, path: str, *, what: str) -> bytes:
        return self.files.read_small(path, what=what)

    def check_files(self, name: str, start: int, stop: int) -> None:
        """Before zarr-python reads rows ``[start, stop)`` of a shardload array: each stored
        file they touch exists (zarr would serve a missing one as its fill value) and matches
        its checksum when ``verify`` asks."""
        if not self.strict:
            return
        objects = self.objects(name)
        if objects is None:
            raise StoreError(
                f"array {name!r} of {self.root} has no readable zarr.json, or a chunk layout "
                "shardload did not write"
            )
        what = "shard" if objects.rows != self.manifest.arrays[name].chunk_rows else "chunk"
        for k in objects.units(start, stop):
            path = objects.path(k)
            if self.verifier.needed(name, k):
                verify_file(self.verifier, name, k, path, opener=self._opener(), what=f"{what} {k}")
            elif is_local(self.fs) and not os.path.isfile(path):
                raise ChunkReadError(f"{what} {k} of array {name!r} is missing: {path}")

    def layout(self, name: str) -> ChunkLayout | None:
        """The direct-read layout of array ``name``, or None (read through zarr-python)."""
        if name not in self._layouts:
            layout = None
            # local files, or a URL whose whole-file cache makes each chunk a local file once
            # fetched; by URL, Blosc chunk files too: one request each, checked and decoded from
            # those bytes (zarr-python fetched each twice: the check's read, then its own), and
            # shards: each inner chunk one exact range request (zarr-python reads the shard's
            # index again for every call), the index once per shard and reader
            info = self.manifest.arrays[name]
            cf = self._cf.get(name)
            ranged = not (is_local(self.fs) or is_cached(self.fs))
            layout = load_chunk_layout(
                f"{self.root.rstrip('/')}/{info.path}",
                dtype=np.dtype(cf.stored if cf is not None else info.dtype),
                shape=tuple(info.shape),
                chunk_bounds=self.manifest.bounds,
                strict=self.strict,
                opener=self._opener(),
                meta_opener=self.files.meta_opener(),
                shards=True,
                splits=not self.strict,  # anemoi's members: plain Zarr (no checksums) only
            )
            if ranged and layout is not None and layout.shard is None and not layout.blosc:
                layout = None  # raw chunk files by URL: :meth:`ranged`, a piece costs its bytes
            self._layouts[name] = layout
        return self._layouts[name]

    def ranged(self, name: str) -> ChunkLayout | None:
        """By URL (without a whole-file cache), the layout of a raw array (a shardload array
        without compression or shards): a call's rows are read in range requests planned per
        chunk file (:mod:`.ranges`), so a piece of a chunk costs its own bytes; else None."""
        if name not in self._ranged:
            layout = None
            if not is_local(self.fs) and not is_cached(self.fs) and self.strict:
                info = self.manifest.arrays[name]
                if name not in self._cf and not info.is_ragged:
                    layout = raw_layout(self.root, name, info, self.manifest, self._read_small)
            self._ranged[name] = layout
        return self._ranged[name]

    def _raw_layout(self, name: str) -> ChunkLayout | None:  # local shardload raw rows
        lay = self.layout(name)  # (a split layout is never strict: plain Zarr)
        raw = lay is not None and not lay.blosc and lay.opener is None and lay.strict
        return lay if raw and name not in self._cf else None

    def raw_chunk(self, name: str, i: int) -> RawChunk | None:
        """Chunk ``i`` of ``name`` as raw rows in a local file (uncompressed shardload arrays)."""
        layout = self._raw_layout(name)
        if layout is None or layout.shard is not None:  # inner chunks: :meth:`raw_shard`
            return None
        path = layout.chunk_path(i)  # checked before the caller's reads scatter its rows
        verify_file(self.verifier, name, i, path, what=f"chunk {i}")
        return RawChunk(path, 0, layout.row_bytes)

    def raw_shard_chunks(self, name: str) -> int | None:
        """Inner chunks per shard of a local sharded array of raw inner chunks, else None."""
        lay = self._raw_layout(name)
        return None if lay is None or lay.shard is None else lay.shard.chunks

    def raw_shard(self, name: str, k: int) -> RawShard:
        """Shard ``k`` of such an array, checked (:func:`.shard_local.raw_shard`)."""
        return raw_shard(self._raw_layout(name), name, k, self.verifier, self._indexes)

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` (C-contiguous): directly from the chunk files
        when the array's layout allows, else one zarr-python read and a copy."""
        layout = self.layout(name)
        if layout is not None and out.flags.c_contiguous and out.dtype == layout.dtype:
            read_rows_into(layout, name, start, stop, out, self.verifier, self._indexes)
            if name in self._cf:
                self._cf[name].apply_into(out, out)
            return
        ranged = self.ranged(name)
        if ranged is not None and out.flags.c_contiguous and out.dtype == ranged.dtype:
            self.raw_url.read_spans_into(ranged, name, [(start, stop)], [out])
        else:
            out[...] = self._read_zarr(name, start, stop)

    def read_spans_into(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None:
        """Several spans, each into its ``out``: a sharded array's shards opened once per call
        (:mod:`.shard_spans`), a raw array's by URL in requests planned per chunk file
        (:mod:`.ranges`); otherwise span by span, as :meth:`read_into`."""
        lay = None if name in self._cf else self.layout(name)  # CF arrays: decoded by read_into
        if lay is not None and all(o.flags.c_contiguous and o.dtype == lay.dtype for o in outs):
            read = read_url_spans_into if isinstance(lay.opener, RangeOpener) else read_spans_into
            return read(lay, name, spans, outs, self.verifier, self._indexes)
        raw = self.ranged(name)
        if raw is not None and all(o.flags.c_contiguous and o.dtype == raw.dtype for o in outs):
            return self.raw_url.read_spans_into(raw, name, spans, outs)
        for (start, stop), out in zip(spans, outs, strict=True):
            self.read_into(name, start, stop, out)

    def plan_reads(self, names: Sequence[str], first: np.ndarray, last: np.ndarray) -> None:
        """By URL, a worker's row spans ``[first, last)`` this epoch: its first shards to
        check asked for now (:mod:`.ahead`), the chunks to keep planned (:mod:`.kept`)."""
        if not (self.files.local or self.files.cached):
            layouts = {n: self.layout(n) for n in names}
            native = {n: lay for n, lay in layouts.items() if n not in self._cf}  # as read
            fetch_ahead(ahead_for(self._indexes), native, self.verifier, first)
            plan_kept(kept_for(self._indexes), layouts, first, last)

    def array(self, name: str) -> Any:
        with self._lock:  # reader threads may open arrays concurrently
            return self._array(name)

    def _array(self, name: str) -> Any:
        if name not in self._arrays:
            if self._group is None:
                self._group = open_group_readonly(self.fs, self.root, strict=self.strict)
            try:
                self._arrays[name] = self._group[self.manifest.arrays[name].path]
            except KeyError as exc:
                raise StoreError(
                    f"array {name!r} is missing from the Zarr store {self.root}"
                ) from exc
        return self._arrays[name]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        layout = self.layout(name)
        if layout is not None and name not in self._cf:  # the same checked path as the loader's
            info = self.manifest.arrays[name]
            out = np.empty((max(0, stop - start), *info.row_shape), dtype=layout.dtype)
            read_rows_into(layout, name, start, stop, out, self.verifier, self._indexes)
            return out
        ranged = self.ranged(name)
        if ranged is not None:
            info = self.manifest.arrays[name]
            out = np.empty((max(0, stop - start), *info.row_shape), dtype=ranged.dtype)
            self.raw_url.read_spans_into(ranged, name, [(start, stop)], [out])
            return out
        return self._read_zarr(name, start, stop)

    def _read_zarr(self, name: str, start: int, stop: int) -> np.ndarray:
        try:
            self.check_files(name, start, stop)
            raw = np.asarray(self.array(name)[start:stop])
        except StoreError:
            raise
        except Exception as exc:  # zarr raises many kinds for corrupt data
            bounds = np.asarray(self.manifest.chunk_bounds)
            first = int(np.searchsorted(bounds, start, side="right") - 1)
            last = int(np.searchsorted(bounds, max(start, stop - 1), side="right") - 1)
            raise ChunkReadError(
                f"array {name!r}, chunk(s) {first}..{last} of store {self.root} could not be read: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        cf = self._cf.get(name)
        return raw if cf is None else cf.apply(raw)

    def checksum_units(self, name: str) -> int:
        """Checksum units of array ``name``: its stored files (chunks, or shards)."""
        objects = self.objects(name)
        if objects is None:  # plain Zarr of another layout: its chunks are read instead
            return self.manifest.num_chunks
        return len(objects.units(0, self.manifest.length))

    def check_unit(self, name: str, k: int) -> None:
        """Check stored file ``k`` against its checksum, or, in a store without checksums,
        read its rows (a missing chunk of plain Zarr data reads as its fill value)."""
        objects = self.objects(name)
        if objects is None:
            self.read(name, *self.manifest.chunk_range(k))
            return
        if self.verifier.enabled:
            what = "shard" if objects.rows != self.manifest.arrays[name].chunk_rows else "chunk"
            verify_file(
                self.verifier, name, k, objects.path(k), opener=self._opener(), what=f"{what} {k}"
            )
        else:
            self.read(name, k * objects.rows, min((k + 1) * objects.rows, self.manifest.length))

    def close(self) -> None:
        ahead_for(self._indexes).clear()
        self._arrays.clear()
        self._layouts.clear()
        self._ranged.clear()
        self.raw_url.clear()
        self._objects.clear()
        self._indexes.clear()
        self._group = None


def _url(fs: Any, root: str) -> str:
    return fs.unstrip_protocol(root) if hasattr(fs, "unstrip_protocol") else root


def _so(fs: Any) -> dict[str, Any]:
    return dict(getattr(fs, "storage_options", {}) or {})


class ZarrRagged(GroupedRagged):
    """The ragged arrays of a Zarr store: groups ``NAME`` of 1-D ``values`` and ``offsets``
    (:class:`shardload.formats.ragged.read.RaggedSource`)."""

    def __init__(self, fs: Any, root: str, manifest: Manifest) -> None:
        super().__init__(fs, root, manifest)
        self.local = is_local(fs)
        self._group: Any = None

    def _read(self, name: str, part: str, a: int, b: int, *, what: str, path: str) -> np.ndarray:
        try:
            if self._group is None:
                self._group = open_group_readonly(self.fs, self.root)
            arr = self._group[f"{name}/{part}"]
            self._check_chunks(arr, name, part, a, b, what=what)
            return np.asarray(arr[a:b])
        except ShardloadError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"{what} could not be read: {path}: {type(exc).__name__}: {exc}"
            ) from exc

    def _check_chunks(self, arr: Any, name: str, part: str, a: int, b: int, *, what: str) -> None:
        """zarr-python serves a missing chunk as the fill value: a shardload store refuses it."""
        if b <= a:
            return
        step = int(arr.chunks[0])
        for k in range(a // step, (b - 1) // step + 1):
            key = f"{self.root}/{name}/{part}/c/{k}"
            exists = os.path.exists(key) if self.local else self.fs.exists(key)
            if not exists:
                raise ChunkReadError(f"{what} is missing a Zarr chunk: {key}")

    def close(self) -> None:
        self._group = None


def open_ragged(fs: Any, root: str, manifest: Manifest) -> ZarrRagged:
    return ZarrRagged(fs, root, manifest)
