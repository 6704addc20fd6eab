"""Reading Parquet stores: one Parquet file per chunk and array, ``NAME/CCCCCC.parquet`` (the
mapping of arrays onto columns: :mod:`shardload.formats.parquet.write`).

A chunk is read whole (one ranged request for a URL; through a node cache, its copy, trusted
by its record when that vouches for it: ``formats/copies.py``), checked against its checksum
(over the file's bytes) as ``verify`` says, decoded by pyarrow and its rows copied out; the last decoded
chunk of each array is kept, so row ranges inside one chunk decode it once.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, require
from shardload.formats.base import is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest
from shardload.formats.copies import is_cached, read_checked_copy
from shardload.manifest.core import Manifest

CHUNK_NAME = "{:06d}.parquet"


def chunk_path(array_path: str, i: int) -> str:
    return f"{array_path}/{CHUNK_NAME.format(i)}"


def open_reader(
    fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
) -> ParquetReader:
    return ParquetReader(fs, root, manifest, verify=verify)


def from_table(table: Any, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The rows of a one-column table (see the write module's mapping) as ``shape``."""
    column = table.column(0).combine_chunks()
    flat = column.values if column.type.num_fields else column  # FixedSizeList: its values
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=dtype).reshape(shape)


class ParquetReader:
    """Reads row ranges chunk by chunk (local files or URLs)."""

    def __init__(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        require("pyarrow", "parquet")
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest
        self.local = is_local(fs)
        self.cached = not self.local and is_cached(fs)  # read from a node cache's copies
        self.bounds = np.asarray(manifest.chunk_bounds, dtype=np.int64)
        self.verifier = Verifier(fs, self.root, manifest, verify, files=False)
        self._last: dict[str, tuple[int, np.ndarray]] = {}
        self._lock = threading.Lock()

    def path(self, name: str, i: int) -> str:
        return f"{self.root}/{chunk_path(self.manifest.arrays[name].path, i)}"

    def _bytes(self, name: str, i: int, path: str) -> bytes:
        what = f"chunk {i} of array {name!r}"
        try:
            if self.local:
                with open(path, "rb") as f:
                    return f.read()
            from shardload.move.remote import read_bytes

            return bytes(read_bytes(self.fs, path, what=what))
        except FileNotFoundError as exc:
            raise ChunkReadError(f"{what} is missing: {path}") from exc
        except OSError as exc:
            raise ChunkReadError.from_os_error(exc, f"chunk {i}", name, path) from exc

    def chunk(self, name: str, i: int) -> np.ndarray:
        """Chunk ``i`` of ``name``, decoded (checked as ``verify`` says)."""
        with self._lock:
            last = self._last.get(name)
        if last is not None and last[0] == i and not self.verifier.needed(name, i):
            return last[1]
        import pyarrow as pa
        import pyarrow.parquet as pq

        path = self.path(name, i)
        if self.cached:  # a node cache's copy, trusted by its record when it vouches for it
            blob = read_checked_copy(self.fs, self.verifier, name, i, path, what=f"chunk {i}")
        else:
            blob = self._bytes(name, i, path)
            if self.verifier.needed(name, i):
                self.verifier.check(name, i, digest(blob), path=path, what=f"chunk {i}")
        info = self.manifest.arrays[name]
        c0, c1 = self.manifest.chunk_range(i)
        shape = (c1 - c0, *info.row_shape)
        try:
            table = _decode(pq.ParquetFile(pa.BufferReader(blob)))
            rows = from_table(table, np.dtype(info.dtype), shape)
        except (OSError, ValueError, pa.ArrowException) as exc:
            raise ChunkReadError(
                f"chunk {i} of array {name!r} is truncated or corrupt: {path}: {exc}"
            ) from exc
        dtype = table.schema.field(0).type
        if (
            table.num_columns != 1
            or rows.dtype != np.dtype(info.dtype)
            or _arrow_mismatch(dtype, np.dtype(info.dtype))
        ):
            raise ChunkReadError(
                f"chunk {i} of array {name!r} does not match the manifest: {path} holds "
                f"{table.schema}; the store says {info.dtype}, {shape}"
            )
        with self._lock:
            self._last[name] = (i, rows)
        return rows

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        info = self.manifest.arrays[name]
        out = np.empty((max(0, stop - start), *info.row_shape), dtype=np.dtype(info.dtype))
        self.read_into(name, start, stop, out)
        return out

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out``: each touched chunk decoded, its rows copied."""
        if stop <= start:
            return
        i = int(np.searchsorted(self.bounds, start, side="right") - 1)
        pos = start
        while pos < stop:
            c0, c1 = int(self.bounds[i]), int(self.bounds[i + 1])
            b = min(stop, c1)
            out[pos - start : b - start] = self.chunk(name, i)[pos - c0 : b - c0]
            pos, i = b, i + 1

    def checksum_units(self, name: str) -> int:
        """Checksum units of array ``name``: its chunk files."""
        return self.manifest.num_chunks

    def check_unit(self, name: str, k: int) -> None:
        """Read chunk file ``k`` (checked against its checksum when the store has them)."""
        with self._lock:
            self._last.pop(name, None)
        self.chunk(name, k)

    def close(self) -> None:
        with self._lock:
            self._last.clear()

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_last"], d["_lock"] = {}, None
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._lock = threading.Lock()


def _decode(pf: Any) -> Any:
    """The file's table: its one row group read alone (no dataset layer, no thread pool: the
    loader's threads read chunks in parallel), measured 2x faster than ``pq.read_table``."""
    if pf.metadata.num_row_groups == 1:
        return pf.read_row_group(0, use_threads=False)
    return pf.read(use_threads=False)


def _arrow_mismatch(arrow_type: Any, dtype: np.dtype) -> bool:
    """True when a column's Arrow type is not ``dtype`` (or a list of it)."""
    import pyarrow as pa

    value = arrow_type.value_type if pa.types.is_fixed_size_list(arrow_type) else arrow_type
    return bool(value != pa.from_numpy_dtype(dtype))
