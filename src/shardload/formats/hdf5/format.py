"""One HDF5 file, ``data.h5``, one dataset per array, chunked ``(chunk_rows, *row_shape)``.

HDF5 allows one writer per file and cannot make one block durable on its own (a kill mid-write
loses or corrupts what the library held): ``parallel_write = False`` makes the commit protocol
stage each block in its own fsynced file and have the driver build ``data.h5`` from all of them,
from a new file, before publishing (``shardload.prep.commit``). zstd / lz4 use
hdf5plugin's Blosc2 filter (readable by any HDF5 with the plugin).

Checksums: HDF5 places chunks inside ``data.h5`` itself (its B-tree, its filters), so the unit
is one shardload chunk of rows and the digest is over its decoded, C-ordered row bytes: what a
reader is served. Corruption anywhere (chunk bytes, filters, the index that finds a chunk)
either fails in h5py or changes the decoded rows.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, StoreError, require
from shardload.formats.base import FormatOptions, is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest
from shardload.manifest.core import Manifest

FILE_NAME = "data.h5"
#: Feature names live in datasets ``/_features/NAME`` (one UTF-8 string per feature): an HDF5
#: attribute is limited to 64 KiB (object header), i.e. a few thousand names.
FEATURES_GROUP = "_features"
_LOCK = threading.Lock()


def _write_features(f: Any, name: str, features: Sequence[str]) -> None:
    import h5py

    group = f.require_group(FEATURES_GROUP)
    if name in group:
        del group[name]
    group.create_dataset(
        name, data=np.array(features, dtype=object), dtype=h5py.string_dtype("utf-8")
    )


def _filter(options: FormatOptions) -> dict[str, Any]:
    if options.compression == "none":
        return {}
    plugin = require("hdf5plugin", "hdf5")
    # Blosc2, not Blosc: Blosc's HDF5 "set_local" callback fails when netCDF4's own copy of
    # libhdf5 was loaded first (as it is when sources are netCDF files).
    level = options.level or (3 if options.compression == "zstd" else 5)
    return dict(
        plugin.Blosc2(cname=options.compression, clevel=level, filters=plugin.Blosc2.SHUFFLE)
    )


class Hdf5Format:
    name = "hdf5"
    parallel_write = False

    def __init__(self) -> None:
        self._files: dict[str, Any] = {}

    def create(
        self, root: Path, specs: Mapping[str, Any], bounds: Sequence[int], options: FormatOptions
    ) -> dict[str, str]:
        import h5py

        rows = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 1
        path = Path(root) / FILE_NAME
        # "w": a fresh file each time; the commit protocol rebuilds it from staged blocks
        with _LOCK, h5py.File(path, "w") as f:
            for name, spec in specs.items():
                try:
                    if name in f:
                        del f[name]
                    ds = f.create_dataset(
                        name,
                        shape=tuple(spec.shape),
                        dtype=np.dtype(spec.dtype),
                        chunks=(max(1, rows), *spec.shape[1:]) if spec.shape[0] else None,
                        **_filter(options),
                    )
                    if spec.features:
                        _write_features(f, name, spec.features)
                        ds.attrs["features"] = f"/{FEATURES_GROUP}/{name}"
                except (OSError, ValueError, TypeError, RuntimeError) as exc:
                    raise StoreError(
                        f"cannot create array {name!r} (shape {tuple(spec.shape)}, "
                        f"dtype {np.dtype(spec.dtype)}) in {path}: {exc}"
                    ) from exc
        return {name: f"{FILE_NAME}/{name}" for name in specs}

    def _file(self, root: Path) -> Any:
        import h5py

        key = f"{os.getpid()}:{root}"
        if key not in self._files:
            self._files[key] = h5py.File(Path(root) / FILE_NAME, "r+")
        return self._files[key]

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
        with _LOCK:
            self._file(root)[name][start : start + len(data)] = data
        return self.row_checksums(chunk_index, data, bounds=bounds)

    def row_checksums(
        self, chunk_index: int, data: np.ndarray, *, bounds: Sequence[int]
    ) -> dict[int, int]:
        """The checksums of the chunks of rows ``data`` (whole chunks from ``chunk_index``):
        over their C-ordered bytes, as a reader decodes them (pure)."""
        rows = np.ascontiguousarray(data)
        sums, i, a = {}, chunk_index, 0
        while a < len(rows):
            b = a + bounds[i + 1] - bounds[i]
            sums[i] = digest(rows[a:b])
            a, i = b, i + 1
        return sums

    def finish(self, root: Path) -> None:
        with _LOCK:
            key = f"{os.getpid()}:{root}"
            f = self._files.pop(key, None)
            if f is not None:
                f.flush()
                f.close()

    def open_reader(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> Hdf5Reader:
        return Hdf5Reader(fs, root, manifest, verify=verify)


class Hdf5Reader:
    """Opens the file lazily in the process that reads (h5py handles do not survive fork)."""

    def __init__(
        self, fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest
        self._file: Any = None
        self._pid = -1
        self.verifier = Verifier(fs, self.root, manifest, verify, raw_rows=False)
        self.bounds = np.asarray(manifest.chunk_bounds, dtype=np.int64)

    def file(self) -> Any:
        import h5py

        if self._file is None or self._pid != os.getpid():
            require("hdf5plugin", "hdf5") if self.manifest.options.get(
                "compression", "none"
            ) != "none" else None
            path = f"{self.root}/{FILE_NAME}"
            try:
                if is_local(self.fs):
                    self._file = h5py.File(path, "r")
                else:
                    self._file = h5py.File(self.fs.open(path, "rb"), "r")
            except (OSError, FileNotFoundError) as exc:
                raise StoreError(f"cannot open HDF5 file {path}: {exc}") from exc
            self._pid = os.getpid()
        return self._file

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        if stop <= start:
            return self._read(name, start, start)
        first = int(np.searchsorted(self.bounds, start, side="right") - 1)
        last = int(np.searchsorted(self.bounds, stop - 1, side="right") - 1)
        check = [i for i in range(first, last + 1) if self.verifier.needed(name, i)]
        if not check:
            return self._read(name, start, stop)
        # whole chunks, so that each can be hashed, then the rows asked for
        a, b = int(self.bounds[check[0]]), int(self.bounds[check[-1] + 1])
        a, b = min(a, start), max(b, stop)
        rows = self._read(name, a, b)
        for i in check:
            c0, c1 = int(self.bounds[i]), int(self.bounds[i + 1])
            self.verifier.check(
                name,
                i,
                digest(rows[c0 - a : c1 - a]),
                path=f"{self.root}/{FILE_NAME}",
                what=f"chunk {i} (rows {c0}:{c1})",
            )
        return rows[start - a : stop - a]

    def _read(self, name: str, start: int, stop: int) -> np.ndarray:
        try:
            ds = self.file()[name]
            info = self.manifest.arrays[name]
            if ds.dtype != np.dtype(info.dtype) or tuple(ds.shape) != tuple(info.shape):
                raise ChunkReadError(
                    f"dataset {name!r} in {self.root}/{FILE_NAME} does not match the manifest: "
                    f"it is {ds.dtype} {tuple(ds.shape)}, the store says {info.dtype} "
                    f"{tuple(info.shape)}"
                )
            return np.asarray(ds[start:stop])
        except StoreError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"rows {start}:{stop} of array {name!r} in {self.root}/{FILE_NAME} could not be read: {exc}"
            ) from exc

    def checksum_units(self, name: str) -> int:
        """Checksum units of array ``name``: its chunks of rows."""
        return self.manifest.num_chunks

    def check_unit(self, name: str, k: int) -> None:
        """Read chunk ``k``'s rows (checked against its checksum when the store has them)."""
        self.read(name, *self.manifest.chunk_range(k))

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_file"], d["_pid"] = None, -1
        return d


FORMAT = Hdf5Format()
