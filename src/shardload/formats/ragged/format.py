"""Variable-length (ragged) arrays in every format: values + offsets.

Layout (``NAME`` a ragged array of a store with ``N`` samples):

- npy: ``NAME/values/CCCCCC.npy``, the values of sample chunk ``C`` (1-D), and
  ``NAME/offsets.npy`` (``N + 1`` int64, global: row ``i`` is ``values[offsets[i]:offsets[i+1]]``
  of the concatenation of the chunk files).
- zarr: a group ``NAME`` with the 1-D arrays ``NAME/values`` (chunked so that a sample chunk's
  values span about one Zarr chunk) and ``NAME/offsets`` (chunked like the sample axis).
- hdf5: ``ragged.h5`` holds, per ragged array, the group ``NAME`` with the datasets ``values``
  and ``offsets`` (a file of its own, written whole at publish: see below).

Writing goes through the commit protocol (:mod:`shardload.prep.commit`). A write task writes the
values of its sample chunks, one ``.npy`` per chunk (temporary file, fsync, rename): for npy
straight into ``NAME/values``, for zarr and hdf5 into ``_ragged/NAME/`` (staging); the block's
row lengths go into its progress record. Once every block is recorded, the driver
(:func:`finish_ragged`) computes the global offsets from the records (a prefix sum) and writes
``offsets`` (and, for zarr and hdf5, ``values`` from the staged chunks, from scratch), marks
``_progress/ragged.json`` and removes the staging. A run killed there redoes this step.

Checksums: unit ``c`` of a ragged array is sample chunk ``c``'s values, over their C-ordered
bytes as a reader decodes them (in every format); unit ``num_chunks`` is the offsets array.
Readers check them as ``verify`` says; ``"auto"`` is ``"first-epoch"`` (the reader holds a
chunk's values anyway).
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardload.errors import ChunkReadError, ShardloadError, StoreError
from shardload.formats.base import FormatOptions, is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.manifest.ragged import RaggedRows, offsets_of

STAGING_DIR = "_ragged"
MARKER = "ragged.json"
HDF5_FILE = "ragged.h5"
CHUNK_NAME = "{:06d}.npy"


def array_path(fmt: str, name: str) -> str:
    """The manifest's ``path`` of ragged array ``name``."""
    return f"{HDF5_FILE}/{name}" if fmt == "hdf5" else name


def chunk_dir(fmt: str, root: Path, name: str) -> Path:
    """Where a task writes the values of its sample chunks (final for npy, staged otherwise)."""
    return Path(root) / (f"{name}/values" if fmt == "npy" else f"{STAGING_DIR}/{name}")


def create_ragged(fmt: str, root: Path, names: Sequence[str]) -> None:
    for name in names:
        chunk_dir(fmt, root, name).mkdir(parents=True, exist_ok=True)


def write_ragged_block(
    fmt: str, root: Path, name: str, chunk: int, data: RaggedRows, *, bounds: Sequence[int]
) -> dict[int, int]:
    """Write the values of the sample chunks ``data`` covers (whole chunks from ``chunk``),
    each durably; their checksums by chunk."""
    from shardload.util.durable import write_atomic

    off = offsets_of(data.lengths)
    sums: dict[int, int] = {}
    i, r = chunk, 0
    folder = chunk_dir(fmt, root, name)
    folder.mkdir(parents=True, exist_ok=True)
    while r < len(data.lengths):
        rows = int(bounds[i + 1] - bounds[i])
        part = np.ascontiguousarray(data.values[off[r] : off[r + rows]])
        write_atomic(folder / CHUNK_NAME.format(i), _npy_writer(part))
        sums[i] = digest(part)
        r += rows
        i += 1
    return sums


def _npy_writer(arr: np.ndarray) -> Callable[[BinaryIO], None]:
    def write(f: BinaryIO) -> None:
        np.lib.format.write_array(f, arr, allow_pickle=False)

    return write


def length_stats(lengths: np.ndarray) -> dict[str, Any]:
    """What the manifest records about a ragged array's row lengths."""
    n = len(lengths)
    return {
        "max_length": int(lengths.max()) if n else 0,
        "min_length": int(lengths.min()) if n else 0,
        "mean_length": float(lengths.mean()) if n else 0.0,
        "num_values": int(lengths.sum()),
    }


def finish_ragged(
    fmt: str,
    root: Path,
    infos: Mapping[str, tuple[np.dtype, np.ndarray]],
    *,
    bounds: Sequence[int],
    options: FormatOptions,
    progress: Path,
) -> dict[str, int]:
    """Build the final layout of every ragged array (``name -> (dtype, lengths)``) once all
    blocks are recorded; the offsets' checksum per array. Idempotent: a marker in ``progress``
    says it is done; without it, it is redone from the staged chunks."""
    from shardload.util.durable import fsync_tree, write_atomic

    offsets = {n: offsets_of(lengths) for n, (_, lengths) in infos.items()}
    sums = {n: digest(o) for n, o in offsets.items()}
    marker = Path(progress) / MARKER
    if not infos or marker.exists():
        return sums
    bounds = [int(b) for b in bounds]
    if fmt == "npy":
        for name, off in offsets.items():
            write_atomic(Path(root) / name / "offsets.npy", _npy_writer(off))
    elif fmt == "zarr":
        _finish_zarr(root, infos, offsets, bounds, options)
    elif fmt == "hdf5":
        _finish_hdf5(root, infos, offsets, bounds, options)
    else:
        raise StoreError(f"format {fmt!r} cannot store variable-length arrays")
    fsync_tree(Path(root))
    write_atomic(marker, json.dumps(sorted(infos)).encode())
    shutil.rmtree(Path(root) / STAGING_DIR, ignore_errors=True)
    return sums


def _value_chunk(lengths: np.ndarray, bounds: Sequence[int]) -> int:
    """Values per storage chunk: about one sample chunk's values."""
    chunks = max(1, len(bounds) - 1)
    return max(1024, int(np.ceil(int(lengths.sum()) / chunks)))


def _staged_values(root: Path, name: str, bounds: Sequence[int]) -> Any:
    for c in range(len(bounds) - 1):
        yield np.load(Path(root) / STAGING_DIR / name / CHUNK_NAME.format(c), mmap_mode="r")


def _finish_zarr(
    root: Path,
    infos: Mapping[str, tuple[np.dtype, np.ndarray]],
    offsets: Mapping[str, np.ndarray],
    bounds: Sequence[int],
    options: FormatOptions,
) -> None:
    import zarr

    from shardload.formats.zarr.format import compressors

    group = zarr.open_group(store=str(root), mode="a", zarr_format=3)
    rows = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 1
    for name, (dtype, lengths) in infos.items():
        if name in group:
            del group[name]
        sub = group.create_group(name, attributes={"shardload_ragged": True})
        step = _value_chunk(lengths, bounds)
        total = int(lengths.sum())
        values = sub.create_array(
            "values",
            shape=(total,),
            chunks=(step,),
            dtype=np.dtype(dtype),
            compressors=compressors(options),
            fill_value=0,
            overwrite=True,
            config={"write_empty_chunks": True},
            dimension_names=(f"{name}_value",),
        )
        off = offsets[name]
        o = sub.create_array(
            "offsets",
            shape=off.shape,
            chunks=(rows,),
            dtype=np.int64,
            compressors=compressors(options),
            fill_value=0,
            overwrite=True,
            config={"write_empty_chunks": True},
            dimension_names=(f"{name}_offset",),
        )
        o[:] = off
        # sequential, in writes aligned to the values' chunks (no read-modify-write)
        pending: list[np.ndarray] = []
        at = held = 0
        for part in _staged_values(root, name, bounds):
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
        if at != total:
            raise StoreError(f"ragged array {name!r}: staged {at} values, records say {total}")


def _finish_hdf5(
    root: Path,
    infos: Mapping[str, tuple[np.dtype, np.ndarray]],
    offsets: Mapping[str, np.ndarray],
    bounds: Sequence[int],
    options: FormatOptions,
) -> None:
    import h5py

    from shardload.formats.hdf5.format import _filter

    path = Path(root) / HDF5_FILE
    tmp = path.with_name(path.name + ".tmp")
    rows = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 1
    with h5py.File(tmp, "w") as f:
        for name, (dtype, lengths) in infos.items():
            g = f.create_group(name)
            total = int(lengths.sum())
            step = min(_value_chunk(lengths, bounds), max(1, total))
            values = g.create_dataset(
                "values",
                shape=(total,),
                dtype=np.dtype(dtype),
                chunks=(step,) if total else None,
                **_filter(options),
            )
            at = 0
            for part in _staged_values(root, name, bounds):
                values[at : at + len(part)] = part
                at += len(part)
            off = offsets[name]
            g.create_dataset(
                "offsets", data=off, chunks=(min(rows + 1, len(off)),), **_filter(options)
            )
        f.flush()
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


# -- reading ------------------------------------------------------------------------------------
class RaggedReader:
    """Reads rows of a store's ragged arrays (any format), opened lazily in the reading
    process; checks the offsets (once) and each sample chunk's values against the store's
    checksums as ``verify`` says."""

    def __init__(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest
        self.fmt = manifest.format
        self.local = is_local(fs)
        self.verifier = Verifier(fs, self.root, manifest, verify, raw_rows=False)
        self.bounds = np.asarray(manifest.chunk_bounds, dtype=np.int64)
        self._offsets: dict[str, np.ndarray] = {}
        self._handles: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def info(self, name: str) -> ArrayInfo:
        info = self.manifest.arrays[name]
        if not info.is_ragged:
            raise StoreError(f"array {name!r} is not a variable-length array")
        return info

    def _where(self, name: str) -> str:
        return f"{self.root}/{self.info(name).path}"

    def _open(self, key: str) -> Any:
        """A zarr group / h5py file, per process (handles do not survive fork)."""
        if self._pid != os.getpid():
            self._handles.clear()
            self._pid = os.getpid()
        with self._lock:
            if key not in self._handles:
                if self.fmt == "zarr":
                    from shardload.formats.zarr.format import open_group_readonly

                    self._handles[key] = open_group_readonly(self.fs, self.root)
                else:
                    import h5py

                    path = f"{self.root}/{HDF5_FILE}"
                    if self.manifest.options.get("compression", "none") != "none":
                        import hdf5plugin  # noqa: F401 - registers the Blosc2 filter
                    try:
                        src = path if self.local else self.fs.open(path, "rb")
                        self._handles[key] = h5py.File(src, "r")
                    except (OSError, FileNotFoundError) as exc:
                        raise ChunkReadError(
                            f"the variable-length arrays' file {path} cannot be opened: {exc}"
                        ) from exc
            return self._handles[key]

    def _read_npy(
        self, path: str, what: str, *, shape: tuple[int, ...], dtype: np.dtype
    ) -> np.ndarray:
        try:
            if self.local:
                arr = np.load(path, allow_pickle=False)
            else:
                import io

                from shardload.move.remote import read_bytes

                arr = np.load(io.BytesIO(read_bytes(self.fs, path, what=what)), allow_pickle=False)
        except FileNotFoundError as exc:
            raise ChunkReadError(f"{what} is missing: {path}") from exc
        except (OSError, ValueError, EOFError) as exc:
            raise ChunkReadError(f"{what} is truncated or corrupt: {path}: {exc}") from exc
        if arr.dtype != dtype or arr.shape != shape:
            raise ChunkReadError(
                f"{what} does not match the manifest: {path} holds dtype {arr.dtype}, shape "
                f"{arr.shape}; the store says {dtype}, {shape}"
            )
        return arr

    def offsets(self, name: str) -> np.ndarray:
        """The ``N + 1`` offsets of ``name``, read and checked once per process."""
        if name in self._offsets:
            return self._offsets[name]
        info = self.info(name)
        n = self.manifest.length
        what = f"the offsets of array {name!r}"
        path = self._where(name) + ("/offsets.npy" if self.fmt == "npy" else "/offsets")
        if self.fmt == "npy":
            off = self._read_npy(path, what, shape=(n + 1,), dtype=np.dtype(np.int64))
        else:
            off = self._dataset(name, "offsets", 0, n + 1, what=what, path=path)
        num_values = int((info.ragged or {}).get("num_values", -1))
        if (
            off.shape != (n + 1,)
            or off[0] != 0
            or (n and np.any(np.diff(off) < 0))
            or int(off[-1]) != num_values
        ):
            raise ChunkReadError(
                f"{what} are corrupt: {path} (not {n + 1} ascending offsets from 0 to {num_values})"
            )
        unit = self.manifest.num_chunks
        if self.verifier.needed(name, unit):
            self.verifier.check(
                name, unit, digest(np.ascontiguousarray(off)), path=path, what="offsets"
            )
        self._offsets[name] = off
        return off

    def _dataset(self, name: str, part: str, a: int, b: int, *, what: str, path: str) -> np.ndarray:
        try:
            if self.fmt == "zarr":
                arr = self._open("zarr")[f"{name}/{part}"]
                self._check_zarr_chunks(arr, name, part, a, b, what=what, path=path)
            else:
                arr = self._open("hdf5")[f"{name}/{part}"]
            return np.asarray(arr[a:b])
        except ShardloadError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"{what} could not be read: {path}: {type(exc).__name__}: {exc}"
            ) from exc

    def _check_zarr_chunks(
        self, arr: Any, name: str, part: str, a: int, b: int, *, what: str, path: str
    ) -> None:
        """zarr-python serves a missing chunk as the fill value: a shardload store refuses it."""
        if b <= a:
            return
        step = int(arr.chunks[0])
        for k in range(a // step, (b - 1) // step + 1):
            key = f"{self.root}/{name}/{part}/c/{k}"
            exists = os.path.exists(key) if self.local else self.fs.exists(key)
            if not exists:
                raise ChunkReadError(f"{what} is missing a Zarr chunk: {key}")

    def chunk_values(self, name: str, c: int) -> np.ndarray:
        """The values of sample chunk ``c`` (checked as ``verify`` says)."""
        off = self.offsets(name)
        a, b = int(self.bounds[c]), int(self.bounds[c + 1])
        v0, v1 = int(off[a]), int(off[b])
        dtype = np.dtype(self.info(name).dtype)
        what = f"chunk {c} (rows {a}:{b}) of array {name!r}"
        if self.fmt == "npy":
            path = f"{self._where(name)}/values/{CHUNK_NAME.format(c)}"
            vals = self._read_npy(path, what, shape=(v1 - v0,), dtype=dtype)
        else:
            path = f"{self._where(name)}/values"
            vals = self._dataset(name, "values", v0, v1, what=what, path=path)
            if vals.dtype != dtype or vals.shape != (v1 - v0,):
                raise ChunkReadError(f"{what} does not match the manifest: {path}")
        if self.verifier.needed(name, c):
            self.verifier.check(
                name, c, digest(np.ascontiguousarray(vals)), path=path, what=f"chunk {c}"
            )
        return vals

    def read(self, name: str, start: int, stop: int) -> RaggedRows:
        """Rows ``[start, stop)`` as ``(values, lengths)``."""
        off = self.offsets(name)
        dtype = np.dtype(self.info(name).dtype)
        if stop <= start:
            return RaggedRows(np.zeros(0, dtype), np.zeros(0, np.int64))
        first = int(np.searchsorted(self.bounds, start, side="right") - 1)
        last = int(np.searchsorted(self.bounds, stop - 1, side="right") - 1)
        parts = []
        for c in range(first, last + 1):
            vals = self.chunk_values(name, c)
            base = int(off[self.bounds[c]])
            a, b = max(start, int(self.bounds[c])), min(stop, int(self.bounds[c + 1]))
            parts.append(vals[int(off[a]) - base : int(off[b]) - base])
        values = np.concatenate(parts) if len(parts) > 1 else np.array(parts[0])
        return RaggedRows(values, np.diff(off[start : stop + 1]))

    def checksum_units(self, name: str) -> int:
        """Sample chunks, then the offsets."""
        return self.manifest.num_chunks + 1

    def check_unit(self, name: str, k: int) -> None:
        if k == self.manifest.num_chunks:
            self._offsets.pop(name, None)
            self.offsets(name)
        else:
            self.chunk_values(name, k)

    def close(self) -> None:
        for h in self._handles.values():
            if hasattr(h, "close") and self._pid == os.getpid():
                h.close()
        self._handles.clear()
        self._offsets.clear()

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_handles"], d["_offsets"], d["_lock"] = {}, {}, None
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()
