"""Zarr v3 (the default format): one group, one array per name, chunked along rows only.

Compression is Blosc (zstd or lz4) with byte shuffle, or none. With ``shard_chunks`` the sharding
codec packs that many chunks into one shard file; write blocks are then whole shards, so two
tasks never write the same file. Plain Zarr v2/v3 data (e.g. written by xarray) opens too, via
:func:`manifest_from_zarr`.
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, StoreError
from shardload.formats.base import FormatOptions, RawChunk, is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, file_digest
from shardload.formats.zarr.cf import CFDecoding, plan_cf_decoding
from shardload.formats.zarr.chunks import (
    ChunkLayout,
    StoredObjects,
    load_chunk_layout,
    load_stored_objects,
    verify_file,
    write_chunk,
)
from shardload.formats.zarr.rows import read_rows_into
from shardload.formats.zarr.shards import ShardIndexCache
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.util.durable import file_written

_LEVELS = {"zstd": 3, "lz4": 5}
log = logging.getLogger(__name__)


def compressors(options: FormatOptions) -> Any:
    from zarr.codecs import BloscCname, BloscCodec

    if options.compression == "none":
        return None
    level = options.level if options.level is not None else _LEVELS[options.compression]
    return BloscCodec(cname=BloscCname(options.compression), clevel=level, shuffle="shuffle")


#: Above this many features the names stay out of the array's zarr.json (every reader parses
#: it); they are in the store's feature file (``_features/NAME.npz``, see manifest.py).
MAX_FEATURE_ATTRS = 4096


def _feature_attrs(features: Any) -> dict[str, Any]:
    if not features:
        return {}
    if len(features) > MAX_FEATURE_ATTRS:
        return {"num_features": len(features)}
    return {"features": list(features)}


class ZarrFormat:
    name = "zarr"
    parallel_write = True

    def __init__(self) -> None:
        self._arrays: dict[tuple[str, str], Any] = {}
        self._layouts: dict[tuple[str, str], ChunkLayout | None] = {}
        self._lock = threading.Lock()

    def create(
        self, root: Path, specs: Mapping[str, Any], bounds: Sequence[int], options: FormatOptions
    ) -> dict[str, str]:
        import zarr

        group = zarr.open_group(store=str(root), mode="a", zarr_format=3)
        rows = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 1
        for name, spec in specs.items():
            row_shape = tuple(spec.shape[1:])
            shards = None
            if options.shard_chunks:
                shards = (rows * options.shard_chunks, *row_shape)
            group.create_array(
                name,
                shape=tuple(spec.shape),
                chunks=(rows, *row_shape),
                shards=shards,
                dtype=np.dtype(spec.dtype),
                compressors=compressors(options),
                fill_value=0,
                overwrite=True,
                attributes=_feature_attrs(spec.features),
                # named dims let xarray open the store directly (xr.open_zarr)
                dimension_names=_dimension_names(name, spec),
            )
        return {name: name for name in specs}

    def _array(self, root: Path, name: str) -> Any:
        import zarr

        key = (str(root), name)
        with self._lock:
            if key not in self._arrays:
                arr = zarr.open_array(store=str(root), path=name, mode="r+")
                # every chunk and shard written, zeros too: zarr leaves out those equal to the
                # fill value, so a shard of zeros had no file (prepare failed hashing it) and
                # an inner chunk of zeros no bytes (a reader could not tell it from a loss)
                self._arrays[key] = arr.with_config({"write_empty_chunks": True})
            return self._arrays[key]

    def write_block(
        self,
        root: Path,
        name: str,
        chunk_index: int,
        start: int,
        data: np.ndarray,
        *,
        bounds: Sequence[int],
    ) -> dict[int, int]:
        layout = self._layout(root, name, bounds)
        if layout is None:  # sharded or other codecs: zarr-python writes it
            arr = self._array(root, name)
            arr[start : start + len(data)] = data
            _fsync_blocks(Path(root) / name, arr, start, start + len(data))
            # checksum units are the files written (shards): hashed from the page cache
            objects = load_stored_objects(str(Path(root) / name))
            if objects is None:
                raise StoreError(
                    f"array {name!r} in {root} has a chunk layout shardload cannot hash"
                )
            return {
                k: file_digest(objects.path(k)) for k in objects.units(start, start + len(data))
            }
        # One chunk, encoded here and written as one file: zarr-python's sync API funnels every
        # write through its single event-loop thread, which serialised concurrent write tasks.
        if start % layout.chunk_rows:
            raise ValueError(f"row {start} does not start a chunk of {layout.chunk_rows} rows")
        return {start // layout.chunk_rows: write_chunk(layout, start // layout.chunk_rows, data)}

    def _layout(self, root: Path, name: str, bounds: Sequence[int]) -> ChunkLayout | None:
        """The plain chunk layout of an array this format created (None: use zarr-python)."""
        key = (str(root), name)
        if key not in self._layouts:
            arr = self._array(root, name)
            layout = load_chunk_layout(
                str(root / name),
                dtype=np.dtype(arr.dtype),
                shape=tuple(arr.shape),
                chunk_bounds=tuple(bounds),
                strict=True,
            )
            with self._lock:
                self._layouts[key] = layout
        return self._layouts[key]

    def finish(self, root: Path) -> None:
        with self._lock:
            for key in [k for k in self._arrays if k[0] == str(root)]:
                del self._arrays[key]
                self._layouts.pop(key, None)

    def open_reader(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> ZarrReader:
        return ZarrReader(fs, root, manifest, verify=verify)


def _fsync_blocks(array_dir: Path, arr: Any, start: int, stop: int) -> None:
    """fsync the chunk / shard files of rows ``[start, stop)`` written by zarr-python, so a
    block is durable before its progress record (zarr-python does not fsync)."""
    import os

    outer = int(arr.metadata.chunk_grid.chunk_shape[0])  # the shard (or chunk) rows
    zeros = (0,) * (arr.ndim - 1)
    for k in range(start // outer, -(-stop // outer)):
        path = array_dir / arr.metadata.encode_chunk_key((k, *zeros))
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:  # an all-fill-value chunk zarr did not write
            continue
        try:
            file_written(fd, path)
        finally:
            os.close(fd)


def open_group_readonly(fs: Any, root: str) -> Any:
    """The Zarr group at ``root``, read-only.

    A remote store is read through the same filesystem as the other formats
    (:class:`shardload.move.remote.RemoteFileSystem`: retries, errors naming the URL, the optional
    bounded cache), handed to zarr's async core with fsspec's ``AsyncFileSystemWrapper``.
    """
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
        store = FsspecStore(
            AsyncFileSystemWrapper(fs, asynchronous=True), read_only=True, path=root
        )
        # Zarr v3 first: one request (zarr.json) instead of also probing the three v2 keys
        try:
            return zarr.open_group(store=store, mode="r", zarr_format=3)
        except (FileNotFoundError, zarr.errors.NodeNotFoundError):
            pass  # plain Zarr v2 data
    return zarr.open_group(store=store, mode="r")


class ZarrReader:
    """Reads row ranges. Local arrays in the simple layouts shardload writes (chunk files, or
    shards of inner chunks along rows; no codec but Blosc) are read chunk by chunk straight
    into the caller's buffer (:mod:`.zarr_chunks`, :mod:`.zarr_shards`); everything else goes
    through zarr-python.

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
        self._objects: dict[str, StoredObjects | None] = {}
        self._indexes = ShardIndexCache()  # parsed shard indexes (sharded arrays)
        self._lock = threading.Lock()
        # CF mask and scale of plain (e.g. xarray-written) arrays: stored -> served values
        self._cf = {
            k: CFDecoding.from_dict(a.attrs["cf"])
            for k, a in manifest.arrays.items()
            if "cf" in a.attrs
        }
        self.strict = manifest.provenance.get("source") != "plain zarr"
        # "auto" hashes chunks whose bytes this process holds anyway to decode them; not raw
        # rows, nor URLs read by zarr-python without a cache (hashing would fetch them twice)
        raw = manifest.options.get("compression", "none") == "none" and not manifest.options.get(
            "shard_chunks"
        )
        raw = raw or not (is_local(fs) or _cached(fs))
        self.verifier = Verifier(fs, root, manifest, verify, raw_rows=raw)

    def _opener(self) -> Any:
        return None if is_local(self.fs) else (lambda p: self.fs.open(p, "rb"))

    def objects(self, name: str) -> StoredObjects | None:
        """The stored files of array ``name`` (chunks or shards), from its ``zarr.json``."""
        if name not in self._objects:
            info = self.manifest.arrays[name]
            folder = f"{self.root.rstrip('/')}/{info.path}"
            self._objects[name] = load_stored_objects(folder, opener=self._opener())
        return self._objects[name]

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
            # fetched (without a cache, zarr-python's concurrent range requests serve better)
            if is_local(self.fs) or _cached(self.fs):
                info = self.manifest.arrays[name]
                cf = self._cf.get(name)
                layout = load_chunk_layout(
                    f"{self.root.rstrip('/')}/{info.path}",
                    dtype=np.dtype(cf.stored if cf is not None else info.dtype),
                    shape=tuple(info.shape),
                    chunk_bounds=self.manifest.chunk_bounds,
                    strict=self.strict,
                    opener=self._opener(),
                    shards=True,
                )
            self._layouts[name] = layout
        return self._layouts[name]

    def raw_chunk(self, name: str, i: int) -> RawChunk | None:
        """Chunk ``i`` of ``name`` as raw rows in a local file (uncompressed shardload arrays)."""
        layout = self.layout(name)
        if layout is None or layout.blosc or layout.opener is not None or not layout.strict:
            return None
        if layout.shard is not None:  # inner chunks lie anywhere in their shard
            return None
        if name in self._cf:
            return None
        path = layout.chunk_path(i)
        # before the caller's reads scatter the chunk's rows anywhere
        verify_file(self.verifier, name, i, path, what=f"chunk {i}")
        return RawChunk(path, 0, layout.row_bytes)

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` (C-contiguous): directly from the chunk files
        when the array's layout allows, else one zarr-python read and a copy."""
        layout = self.layout(name)
        if layout is not None and out.flags.c_contiguous and out.dtype == layout.dtype:
            read_rows_into(layout, name, start, stop, out, self.verifier, self._indexes)
            if name in self._cf:
                self._cf[name].apply_into(out, out)
        else:
            out[...] = self._read_zarr(name, start, stop)

    def array(self, name: str) -> Any:
        with self._lock:  # reader threads may open arrays concurrently
            return self._array(name)

    def _array(self, name: str) -> Any:
        if name not in self._arrays:
            if self._group is None:
                self._group = open_group_readonly(self.fs, self.root)
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
        self._arrays.clear()
        self._layouts.clear()
        self._objects.clear()
        self._indexes.clear()
        self._group = None


def manifest_from_zarr(fs: Any, root: str, *, arrays: Sequence[str] | None = None) -> Manifest:
    """Describe plain Zarr data chunked along axis 0 as a (complete, stat-less) manifest.

    With ``arrays``, exactly those (each decodable, chunked along axis 0 only, all alike: else
    a :class:`StoreError` naming the array). Without, the sample-aligned arrays: those along
    the sample dimension (the leading dimension of most data variables, by Zarr dimension
    names; without names, the longest leading length shared by the most arrays) that share the
    data variables' row chunking and that CF decoding can serve (:mod:`.cf`). Every other
    array (coordinates of other dimensions, a ``time`` coordinate stored in one chunk, CF
    times, ...) is left out with a logged note, and listed with the reason in the manifest's
    ``provenance["skipped"]``: it never blocks reading the others.
    """
    import zarr

    try:
        node = open_group_readonly(fs, root)
        members = dict(node.arrays())
    except Exception:
        try:
            arr = zarr.open_array(store=root if is_local(fs) else _url(fs, root), mode="r")
            members = {"data": arr}
        except Exception as exc:
            raise StoreError(
                f"{root} is neither a shardload store nor a Zarr array/group: {exc}"
            ) from exc
    if not members:
        raise StoreError(f"Zarr store {root} has no arrays")
    described = {k: _describe(k, m) for k, m in members.items()}
    if arrays is not None:
        missing = [a for a in arrays if a not in members]
        if missing:
            raise StoreError(
                f"array(s) {missing} not in Zarr store {root}; it has {sorted(members)}"
            )
        picked, skipped = list(arrays), dict[str, str]()
        for a in picked:
            d = described[a]
            if d.problem is not None:
                raise d.problem
            if not d.rows_only:
                raise StoreError(
                    f"array {a!r} in {root} is chunked {d.chunks} for shape {d.shape}: "
                    "shardload reads stores chunked along axis 0 only (rechunk it with "
                    "'shardload prepare')"
                )
    else:
        picked, skipped = _pick_sample_arrays(described)
        if not picked:
            reasons = "; ".join(f"{k}: {v}" for k, v in skipped.items())
            raise StoreError(f"Zarr store {root} has no array shardload can read ({reasons})")
        if skipped:
            # a data variable along the samples left out is a surprise; coordinates are not
            data_vars = [k for k in skipped if described[k].data_var and described[k].aligned]
            log.log(
                logging.WARNING if data_vars else logging.INFO,
                "%s: reading %s; left out %s",
                root,
                picked,
                "; ".join(f"{k!r} ({v})" for k, v in skipped.items()),
            )
    lengths = {a: described[a].shape[0] for a in picked}
    if len(set(lengths.values())) > 1:
        raise StoreError(f"arrays of {root} have unequal lengths: {lengths}")
    rows = {a: described[a].chunks[0] for a in picked}
    if len(set(rows.values())) > 1:
        raise StoreError(
            f"arrays of {root} have different row chunkings {rows}; pass arrays=[...] that are "
            "chunked alike"
        )
    infos: dict[str, ArrayInfo] = {}
    for a in picked:
        d = described[a]
        attrs: dict[str, Any] = {}
        if d.dims is not None:
            attrs["dims"] = list(d.dims)
        if d.decoding is not None:
            attrs["cf"] = d.decoding.to_dict()
        dtype = d.decoding.dtype if d.decoding is not None else d.dtype.str
        infos[a] = ArrayInfo(
            name=a,
            shape=d.shape,
            dtype=str(np.dtype(dtype)),
            chunk_rows=d.chunks[0],
            path=a,
            attrs=attrs,
        )
    length = next(iter(lengths.values()))
    from shardload.plan.chunks import plan_chunk_bounds

    bounds = plan_chunk_bounds(length, next(iter(rows.values())))
    provenance: dict[str, Any] = {"source": "plain zarr", "root": root}
    if skipped:
        provenance["skipped"] = skipped
    return Manifest(
        format="zarr",
        length=length,
        chunk_bounds=bounds,
        arrays=infos,
        splits={"all": tuple(range(len(bounds) - 1))},
        complete=True,
        provenance=provenance,
    )


def _cached(fs: Any) -> bool:
    """A remote filesystem with a whole-file cache (each chunk a local file once fetched)."""
    return getattr(getattr(fs, "spec", None), "cache_dir", None) is not None


@dataclass
class _Member:
    """One array of a plain Zarr group, as the manifest sees it."""

    name: str
    shape: tuple[int, ...]
    chunks: tuple[int, ...]
    dtype: np.dtype
    dims: tuple[str, ...] | None  # Zarr v3 dimension names / v2 _ARRAY_DIMENSIONS
    coordinates: tuple[str, ...]  # its CF "coordinates" attribute
    decoding: CFDecoding | None = None
    problem: StoreError | None = None  # why it cannot be served (CF decoding refused)
    data_var: bool = True
    aligned: bool = False  # along the sample dimension

    @property
    def rows_only(self) -> bool:
        return len(self.shape) >= 1 and self.chunks[1:] == self.shape[1:]


def _describe(name: str, m: Any) -> _Member:
    meta = m.metadata
    fmt = int(getattr(meta, "zarr_format", 3))
    attrs = dict(m.attrs.asdict()) if hasattr(m.attrs, "asdict") else dict(m.attrs)
    dims = getattr(meta, "dimension_names", None) if fmt == 3 else attrs.get("_ARRAY_DIMENSIONS")
    dims = tuple(str(d) for d in dims) if dims is not None and None not in dims else None
    coords = attrs.get("coordinates")
    d = _Member(
        name=name,
        shape=tuple(int(s) for s in m.shape),
        chunks=tuple(int(c) for c in m.chunks),
        dtype=np.dtype(m.dtype),
        dims=dims,
        coordinates=tuple(coords.split()) if isinstance(coords, str) else (),
    )
    if dims is not None:  # named dimensions: written by xarray or a CF-aware tool
        try:
            d.decoding = plan_cf_decoding(
                name, dtype=d.dtype, attrs=attrs, fill_value=m.fill_value, zarr_format=fmt
            )
        except StoreError as exc:
            d.problem = exc
    elif d.dtype.kind not in "biufc":
        d.problem = StoreError(f"array {name!r} has dtype {d.dtype}, not numbers")
    return d


def _pick_sample_arrays(described: Mapping[str, _Member]) -> tuple[list[str], dict[str, str]]:
    """The sample-aligned arrays and, for every other array, why it was left out (pure)."""
    dim_names = {n for d in described.values() for n in (d.dims or ())}
    coord_names = {c for d in described.values() for c in d.coordinates}
    for d in described.values():
        d.data_var = d.name not in dim_names and d.name not in coord_names
    ranked = [d for d in described.values() if d.shape]
    skipped = {d.name: "a scalar" for d in described.values() if not d.shape}
    if not ranked:
        return [], skipped
    data = [d for d in ranked if d.data_var] or ranked

    def lead(d: _Member) -> tuple[str, Any]:  # the leading dimension: by name, else by length
        return ("name", d.dims[0]) if d.dims is not None else ("length", d.shape[0])

    counts = Counter(lead(d) for d in data)
    length_of = {lead(d): d.shape[0] for d in ranked}
    sample = max(counts, key=lambda k: (counts[k], length_of[k]))
    length = length_of[sample]
    where = f"dimension {sample[1]!r}" if sample[0] == "name" else f"length {length}"
    aligned = []
    for d in ranked:
        d.aligned = lead(d) == sample or (d.dims is None and d.shape[0] == length)
        if not d.aligned:
            skipped[d.name] = f"not along the sample {where} (dims {d.dims or d.shape})"
        elif d.problem is not None:
            skipped[d.name] = str(d.problem)
        elif not d.rows_only:
            skipped[d.name] = (
                f"chunked {d.chunks} for shape {d.shape}: shardload reads arrays chunked along "
                "axis 0 only"
            )
        else:
            aligned.append(d)
    votes = Counter(d.chunks[0] for d in aligned if d.data_var) or Counter(
        d.chunks[0] for d in aligned
    )
    if not votes:
        return [], skipped
    rows = max(votes, key=lambda r: (votes[r], r))
    for d in aligned:
        if d.chunks[0] != rows:
            skipped[d.name] = (
                f"chunked {d.chunks[0]} rows along the sample {where} where the other arrays "
                f"use {rows} (open it alone: arrays=[{d.name!r}])"
            )
    picked = [d.name for d in aligned if d.chunks[0] == rows]
    return picked, {k: skipped[k] for k in described if k in skipped}


def _url(fs: Any, root: str) -> str:
    return fs.unstrip_protocol(root) if hasattr(fs, "unstrip_protocol") else root


def _so(fs: Any) -> dict[str, Any]:
    return dict(getattr(fs, "storage_options", {}) or {})


FORMAT = ZarrFormat()


def _dimension_names(name: str, spec: Any) -> tuple[str, ...]:
    """``sample, NAME_dim1, ...``, or the dims a spec carries (``attrs["dims"]``: the source's,
    in a compute store) when there is one per axis."""
    dims = (getattr(spec, "attrs", None) or {}).get("dims")
    if dims is not None and len(dims) == len(spec.shape):
        return tuple(str(d) for d in dims)
    return ("sample", *(f"{name}_dim{i}" for i in range(1, len(spec.shape))))
