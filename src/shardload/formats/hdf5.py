"""One HDF5 file, ``data.h5``, one dataset per array, chunked ``(chunk_rows, *row_shape)``.

HDF5 allows one writer per file and cannot make one block durable on its own (a kill mid-write
loses or corrupts what the library held): ``parallel_write = False`` makes the commit protocol
stage each block in its own fsynced file and have the driver build ``data.h5`` from all of them,
from a new file, before publishing (``shardload.commit``). zstd / lz4 use
hdf5plugin's Blosc2 filter (readable by any HDF5 with the plugin).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ChunkReadError, StoreError, require
from ..manifest import Manifest
from .base import FormatOptions, is_local

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
                        name, shape=tuple(spec.shape), dtype=np.dtype(spec.dtype),
                        chunks=(max(1, rows), *spec.shape[1:]) if spec.shape[0] else None, **_filter(options),
                    )  # fmt: skip
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
    ) -> None:
        with _LOCK:
            self._file(root)[name][start : start + len(data)] = data

    def finish(self, root: Path) -> None:
        with _LOCK:
            key = f"{os.getpid()}:{root}"
            f = self._files.pop(key, None)
            if f is not None:
                f.flush()
                f.close()

    def open_reader(self, fs: Any, root: str, manifest: Manifest) -> Hdf5Reader:
        return Hdf5Reader(fs, root, manifest)


class Hdf5Reader:
    """Opens the file lazily in the process that reads (h5py handles do not survive fork)."""

    def __init__(self, fs: Any, root: str, manifest: Manifest) -> None:
        self.fs, self.root, self.manifest = fs, root.rstrip("/"), manifest
        self._file: Any = None
        self._pid = -1

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
        try:
            return np.asarray(self.file()[name][start:stop])
        except StoreError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"rows {start}:{stop} of array {name!r} in {self.root}/{FILE_NAME} could not be read: {exc}"
            ) from exc

    def close(self) -> None:
        if self._file is not None and self._pid == os.getpid():
            self._file.close()
        self._file = None

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_file"], d["_pid"] = None, -1
        return d


FORMAT = Hdf5Format()
