"""Writing Zarr v3 stores: one group, one array per name, chunked along rows only.

Compression is Blosc (zstd or lz4) with byte shuffle, or none, per array (``compression: auto``
decides each array's before :meth:`ZarrWriter.create`: :mod:`shardload.prep.codecs`). With ``shard_chunks`` the sharding
codec packs that many chunks into one shard file; write blocks are then whole shards, so two
tasks never write the same file. Plain chunks are encoded here and written as one file each
(:func:`write_chunk`); whole shards are encoded here too (:mod:`.shard_write`), other
sharded blocks go through zarr-python.

Ragged arrays: a group ``NAME`` with the 1-D arrays ``NAME/values`` and ``NAME/offsets``
(:meth:`ZarrWriter.finish_ragged`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.formats.base import DEFAULT_LEVELS, FormatOptions
from shardload.formats.checksums import digest, file_digest
from shardload.formats.ragged.write import value_chunk
from shardload.formats.zarr.chunks import (
    ChunkLayout,
    blosc_codec,
    load_chunk_layout,
    load_stored_objects,
)
from shardload.formats.zarr.shard_write import whole_shards, write_shards
from shardload.util.durable import file_written


def compressors(options: FormatOptions) -> Any:
    """An array's compressor; ``options`` resolved for it (:meth:`FormatOptions.for_array`)."""
    from zarr.codecs import BloscCname, BloscCodec

    if options.compression == "none":
        return None
    level = options.level if options.level is not None else DEFAULT_LEVELS[options.compression]
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


def _dimension_names(name: str, spec: Any) -> tuple[str, ...]:
    """``sample, NAME_dim1, ...``, or the dims a spec carries (``attrs["dims"]``: the source's,
    in a compute store) when there is one per axis."""
    dims = (getattr(spec, "attrs", None) or {}).get("dims")
    if dims is not None and len(dims) == len(spec.shape):
        return tuple(str(d) for d in dims)
    dims = ["sample", *(f"{name}_dim{i}" for i in range(1, len(spec.shape)))]
    if getattr(spec, "features", None) and len(dims) > 1:  # as Store.to_xarray names it
        dims[-1] = f"{name}_feature"
    return tuple(dims)


class ZarrWriter:
    """Writes a store's arrays as one Zarr v3 group (``WRITER``)."""

    name = "zarr"
    parallel_write = True
    ragged_staged = True  # values staged as chunk files, then written as one array

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
                compressors=compressors(options.for_array(name)),
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
        shard = None if layout else self._layout(root, name, bounds, shards=True)
        if shard is not None and whole_shards(shard, start, start + len(data), int(bounds[-1])):
            return write_shards(shard, start, data, int(bounds[-1]))
        if layout is None:  # other codecs, or not whole shards: zarr-python writes it
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

    def _layout(
        self, root: Path, name: str, bounds: Sequence[int], *, shards: bool = False
    ) -> ChunkLayout | None:
        """The plain chunk layout of an array this format created, or with ``shards`` its
        shard layout (None: use zarr-python)."""
        key = (str(root), name + ("/shards" if shards else ""))
        if key not in self._layouts:
            arr = self._array(root, name)
            layout = load_chunk_layout(
                str(root / name),
                dtype=np.dtype(arr.dtype),
                shape=tuple(arr.shape),
                chunk_bounds=tuple(bounds),
                strict=True,
                shards=shards,
            )
            if layout is not None and (layout.shard is not None) != shards:
                layout = None
            with self._lock:
                self._layouts[key] = layout
        return self._layouts[key]

    def finish(self, root: Path) -> None:
        with self._lock:
            for key in [k for k in self._arrays if k[0] == str(root)]:
                del self._arrays[key]
            for key in [k for k in self._layouts if k[0] == str(root)]:
                del self._layouts[key]

    def array_path(self, name: str, *, ragged: bool = False) -> str:
        return name

    def finish_ragged(
        self,
        root: Path,
        infos: Mapping[str, tuple[np.dtype, np.ndarray]],
        offsets: Mapping[str, np.ndarray],
        bounds: Sequence[int],
        options: FormatOptions,
        staged: Callable[[str], Iterator[np.ndarray]],
    ) -> None:
        """Each ragged array as a group ``NAME`` of two 1-D arrays, ``values`` (chunked so
        that a sample chunk's values span about one Zarr chunk) and ``offsets`` (chunked like
        the sample axis), from scratch."""
        import zarr

        group = zarr.open_group(store=str(root), mode="a", zarr_format=3)
        rows = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 1
        for name, (dtype, lengths) in infos.items():
            if name in group:
                del group[name]
            sub = group.create_group(name, attributes={"shardload_ragged": True})
            step = value_chunk(lengths, bounds)
            total = int(lengths.sum())
            opts = options.for_array(name)  # lz4 under auto: no sample decides
            values = _create_1d(sub, "values", (total,), step, dtype, f"{name}_value", opts)
            off = offsets[name]
            o = _create_1d(sub, "offsets", off.shape, rows, np.int64, f"{name}_offset", opts)
            o[:] = off
            at = _write_aligned(values, staged(name), step)
            if at != total:
                raise StoreError(f"ragged array {name!r}: staged {at} values, records say {total}")


def _create_1d(
    group: Any,
    part: str,
    shape: tuple[int, ...],
    step: int,
    dtype: Any,
    dim: str,
    options: FormatOptions,
) -> Any:
    return group.create_array(
        part,
        shape=shape,
        chunks=(step,),
        dtype=np.dtype(dtype),
        compressors=compressors(options),
        fill_value=0,
        overwrite=True,
        config={"write_empty_chunks": True},
        dimension_names=(dim,),
    )


def _write_aligned(values: Any, parts: Iterator[np.ndarray], step: int) -> int:
    """Write ``parts`` one after the other, in writes aligned to the values' chunks of
    ``step`` (no read-modify-write); the values written."""
    pending: list[np.ndarray] = []
    at = held = 0
    for part in parts:
        pending.append(np.asarray(part))
        held += len(part)
        if held >= step:
            buf = np.concatenate(pending)
            n = (len(buf) // step) * step
            values[at : at + n] = buf[:n]
            at, pending, held = at + n, [buf[n:]], len(buf) - n
    if held:
        values[at : at + held] = np.concatenate(pending)
        at += held
    return at


def _fsync_blocks(array_dir: Path, arr: Any, start: int, stop: int) -> None:
    """fsync the chunk / shard files of rows ``[start, stop)`` written by zarr-python, so a
    block is durable before its progress record (zarr-python does not fsync)."""
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


def write_chunk(layout: ChunkLayout, i: int, rows: np.ndarray) -> int:
    """Encode chunk ``i`` from ``rows`` (at most ``chunk_rows``; a short last chunk is padded
    with the fill value, as Zarr v3 stores edge chunks at full size) and write its file."""
    n = layout.chunk_rows
    if len(rows) > n:
        raise ValueError(f"{len(rows)} rows do not fit a chunk of {n} rows")
    block = np.ascontiguousarray(rows, dtype=layout.dtype)
    if len(block) < n:
        pad = np.full((n - len(block), *block.shape[1:]), layout.fill_value, layout.dtype)
        block = np.concatenate([block, pad])
    data: Any = block.data.cast("B")  # ndarray.data is memoryview(block)
    if layout.blosc_config is not None:
        data = blosc_codec(layout.blosc_config).encode(block)  # typesize: the array's item size
    path = layout.chunk_path(i)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        file_written(f.fileno(), path)  # durable before the block's progress record says done
    return digest(data)  # the file's bytes: the chunk's checksum


WRITER = ZarrWriter()
