"""Reading HDF5 stores: one file, ``data.h5``, one dataset per array (layout and checksum units:
:mod:`shardload.formats.hdf5.write`); ragged arrays in ``ragged.h5``. Files open lazily in the
process that reads (h5py handles do not survive fork).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, ShardloadError, StoreError, require
from shardload.formats.base import is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest
from shardload.formats.ragged.read import GroupedRagged
from shardload.manifest.core import Manifest

FILE_NAME = "data.h5"
#: the file of the ragged arrays: a group ``NAME`` per array, datasets ``values`` and ``offsets``
RAGGED_FILE = "ragged.h5"


def open_reader(
    fs: Any, root: str, manifest: Manifest, *, verify: str = DEFAULT_VERIFY
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
        self.verifier = Verifier(fs, self.root, manifest, verify, files=False)
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


class Hdf5Ragged(GroupedRagged):
    """The ragged arrays of an HDF5 store, in ``ragged.h5``
    (:class:`shardload.formats.ragged.read.RaggedSource`)."""

    def __init__(self, fs: Any, root: str, manifest: Manifest) -> None:
        super().__init__(fs, root, manifest)
        self._file: Any = None

    def _open(self) -> Any:
        import h5py

        if self._file is None:
            path = f"{self.root}/{RAGGED_FILE}"
            if self.manifest.options.get("compression", "none") != "none":
                import hdf5plugin  # noqa: F401 - registers the Blosc2 filter
            try:
                src = path if is_local(self.fs) else self.fs.open(path, "rb")
                self._file = h5py.File(src, "r")
            except (OSError, FileNotFoundError) as exc:
                raise ChunkReadError(
                    f"the variable-length arrays' file {path} cannot be opened: {exc}"
                ) from exc
        return self._file

    def _read(self, name: str, part: str, a: int, b: int, *, what: str, path: str) -> np.ndarray:
        try:
            return np.asarray(self._open()[f"{name}/{part}"][a:b])
        except ShardloadError:
            raise
        except Exception as exc:
            raise ChunkReadError(
                f"{what} could not be read: {path}: {type(exc).__name__}: {exc}"
            ) from exc

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = None


def open_ragged(fs: Any, root: str, manifest: Manifest) -> Hdf5Ragged:
    return Hdf5Ragged(fs, root, manifest)
