"""Reading variable-length (ragged) arrays: one reader for every format, over the format's
:class:`RaggedSource` (where its offsets and values lie; ``open_ragged`` in the format's
``read.py``). The layout and the checksum units are in :mod:`shardload.formats.ragged`.
"""

from __future__ import annotations

import io
import os
import threading
from typing import Any, Protocol

import numpy as np

from shardload.errors import ChunkReadError, StoreError
from shardload.formats.base import is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest
from shardload.formats.registry import open_ragged
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.manifest.ragged import RaggedRows

#: a sample chunk's values file (npy in place; zarr and hdf5 while staged)
CHUNK_NAME = "{:06d}.npy"


class RaggedSource(Protocol):
    """One format's storage of the ragged arrays of a store, opened in the reading process."""

    def offsets_path(self, name: str) -> str:
        """The file (or dataset) of ``name``'s offsets, for error messages."""
        ...

    def read_offsets(self, name: str, n: int, *, what: str) -> np.ndarray:
        """The ``n`` stored offsets of ``name`` (checked by the caller)."""
        ...

    def values_path(self, name: str, c: int) -> str:
        """The file (or dataset) holding sample chunk ``c``'s values."""
        ...

    def read_values(
        self, name: str, c: int, v0: int, v1: int, *, dtype: np.dtype, what: str
    ) -> np.ndarray:
        """Values ``[v0, v1)`` of ``name``: those of sample chunk ``c``."""
        ...

    def close(self) -> None: ...


class GroupedRagged:
    """A :class:`RaggedSource` keeping each ragged array as a group ``NAME`` of two 1-D arrays,
    ``values`` (every chunk's) and ``offsets`` (Zarr, HDF5): subclasses read a range of one."""

    def __init__(self, fs: Any, root: str, manifest: Manifest) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest

    def _where(self, name: str) -> str:
        return f"{self.root}/{self.manifest.arrays[name].path}"

    def offsets_path(self, name: str) -> str:
        return f"{self._where(name)}/offsets"

    def values_path(self, name: str, c: int) -> str:
        return f"{self._where(name)}/values"

    def read_offsets(self, name: str, n: int, *, what: str) -> np.ndarray:
        return self._read(name, "offsets", 0, n, what=what, path=self.offsets_path(name))

    def read_values(
        self, name: str, c: int, v0: int, v1: int, *, dtype: np.dtype, what: str
    ) -> np.ndarray:
        return self._read(name, "values", v0, v1, what=what, path=self.values_path(name, c))

    def _read(self, name: str, part: str, a: int, b: int, *, what: str, path: str) -> np.ndarray:
        raise NotImplementedError


def read_npy_file(
    fs: Any, path: str, what: str, *, shape: tuple[int, ...], dtype: np.dtype
) -> np.ndarray:
    """A whole ``.npy`` file (local or remote), checked against the shape and dtype expected."""
    try:
        if is_local(fs):
            arr = np.load(path, allow_pickle=False)
        else:
            from shardload.move.remote import read_bytes

            arr = np.load(io.BytesIO(read_bytes(fs, path, what=what)), allow_pickle=False)
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


class RaggedReader:
    """Reads rows of a store's ragged arrays (any format), opened lazily in the reading
    process; checks the offsets (once) and each sample chunk's values against the store's
    checksums as ``verify`` says."""

    def __init__(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest
        self.verifier = Verifier(fs, self.root, manifest, verify, files=False)
        self.bounds = np.asarray(manifest.chunk_bounds, dtype=np.int64)
        self._offsets: dict[str, np.ndarray] = {}
        self._source: RaggedSource | None = None
        self._lock = threading.Lock()
        self._pid = os.getpid()

    def info(self, name: str) -> ArrayInfo:
        info = self.manifest.arrays[name]
        if not info.is_ragged:
            raise StoreError(f"array {name!r} is not a variable-length array")
        return info

    def source(self) -> RaggedSource:
        """The format's storage, per process (zarr groups and h5py files do not survive fork)."""
        with self._lock:
            if self._pid != os.getpid():
                self._source, self._pid = None, os.getpid()
            if self._source is None:
                self._source = open_ragged(self.manifest.format, self.fs, self.root, self.manifest)
            return self._source

    def offsets(self, name: str) -> np.ndarray:
        """The ``N + 1`` offsets of ``name``, read and checked once per process."""
        if name in self._offsets:
            return self._offsets[name]
        info = self.info(name)
        n = self.manifest.length
        what = f"the offsets of array {name!r}"
        src = self.source()
        path = src.offsets_path(name)
        off = src.read_offsets(name, n + 1, what=what)
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

    def chunk_values(self, name: str, c: int) -> np.ndarray:
        """The values of sample chunk ``c`` (checked as ``verify`` says)."""
        off = self.offsets(name)
        a, b = int(self.bounds[c]), int(self.bounds[c + 1])
        v0, v1 = int(off[a]), int(off[b])
        dtype = np.dtype(self.info(name).dtype)
        what = f"chunk {c} (rows {a}:{b}) of array {name!r}"
        src = self.source()
        path = src.values_path(name, c)
        vals = src.read_values(name, c, v0, v1, dtype=dtype, what=what)
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
        if self._source is not None and self._pid == os.getpid():
            self._source.close()
        self._source = None
        self._offsets.clear()

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_source"], d["_offsets"], d["_lock"] = None, {}, None
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()
