"""Reading HDF5 stores: one file, ``data.h5``, one dataset per array (layout and checksum units:
:mod:`shardload.formats.hdf5.write`); ragged arrays in ``ragged.h5``. Files open lazily in the
process that reads (h5py handles do not survive fork).
"""

from __future__ import annotations

import contextlib
import gc
import os
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from shardload.errors import ChunkReadError, ShardloadError, StoreError, require
from shardload.formats.base import array_compression, is_local
from shardload.formats.checksums import DEFAULT_VERIFY, Verifier, digest
from shardload.formats.ragged.read import GroupedRagged
from shardload.manifest.core import Manifest

FILE_NAME = "data.h5"
#: the file of the ragged arrays: a group ``NAME`` per array, datasets ``values`` and ``offsets``
RAGGED_FILE = "ragged.h5"


_GC_LOCK = threading.Lock()
#: opening a reader's handle (threads of a process share one)
_OPEN_LOCK = threading.Lock()
_gc_state = {"holders": 0, "was_enabled": False}


@contextlib.contextmanager
def no_cyclic_gc(remote: bool) -> Iterator[None]:
    """No automatic garbage collection while h5py reads a remote file (``remote``).

    h5py holds its global lock while it calls the file object, whose reads wait on fsspec's
    event-loop thread. A garbage collection that runs in that thread and frees an h5py object
    (any cycle holding one, e.g. an exception's frames) waits for the same lock: the loop is
    stuck, every request then times out and the read fails after all its retries, even when the
    server is back (issue #26 row 3: 383 s, then ChunkReadError). Collections are allowed again
    once no thread is inside such a read; while reads overlap without end (several reader
    threads), each read starts with the collection the interpreter would have made, in the
    reading thread, before h5py takes its lock (there, freeing an h5py object only waits for
    the other reads), so cycles are still collected.
    """
    if not remote:
        yield
        return
    if _gc_state["holders"] and _gc_state["was_enabled"]:
        _collect_when_due()
    with _GC_LOCK:
        if _gc_state["holders"] == 0:
            _gc_state["was_enabled"] = gc.isenabled()
            gc.disable()
        _gc_state["holders"] += 1
    try:
        yield
    finally:
        with _GC_LOCK:
            _gc_state["holders"] -= 1
            if _gc_state["holders"] == 0 and _gc_state["was_enabled"]:
                gc.enable()


def _collect_when_due() -> None:
    """The generation the interpreter's automatic collection would collect now, if any."""
    t0, t1, t2 = gc.get_threshold()
    c0, c1, c2 = gc.get_count()
    if t0 and c0 > t0:
        gc.collect(2 if c2 > t2 else 1 if c1 > t1 else 0)


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
        """This process's handle, opened once (under a lock: threads share it)."""
        if self._file is None or self._pid != os.getpid():
            with _OPEN_LOCK:
                if self._file is None or self._pid != os.getpid():
                    self._file = self._open()
                    self._pid = os.getpid()
        return self._file

    def _open(self) -> Any:
        """A new h5py handle of the data file."""
        import h5py

        if compressed(self.manifest):
            require("hdf5plugin", "hdf5")
        path = f"{self.root}/{FILE_NAME}"
        try:
            if is_local(self.fs):
                return h5py.File(path, "r")
            with no_cyclic_gc(True):
                return h5py.File(self.fs.open(path, "rb"), "r")
        except (OSError, FileNotFoundError) as exc:
            raise StoreError(f"cannot open HDF5 file {path}: {exc}") from exc

    def check_metadata(self, where: str) -> None:
        """Each fixed array's dataset (dtype, shape) against the manifest ``where``, when the
        store is opened; the file is closed again (h5py handles do not survive fork). A missing
        file is left to the read that needs it."""
        fixed = [k for k, a in self.manifest.arrays.items() if not a.is_ragged]
        if not fixed:
            return
        # a handle of its own, closed again: the shared one may be in use by another thread
        own = self._file is None or self._pid != os.getpid()
        try:
            f = self._open() if own else self.file()
        except StoreError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                return  # left to the read that needs it (as a missing npy chunk file)
            raise
        try:
            for name in fixed:
                info = self.manifest.arrays[name]
                ds = f.get(name)
                if ds is None:
                    raise StoreError(f"array {name!r} of {where} is not in {self.root}/{FILE_NAME}")
                if ds.dtype != np.dtype(info.dtype) or tuple(ds.shape) != tuple(info.shape):
                    raise StoreError(
                        f"{where} and {self.root}/{FILE_NAME} disagree: dataset {name!r} is "
                        f"{ds.dtype} {tuple(ds.shape)}, the manifest says {info.dtype} "
                        f"{tuple(info.shape)}"
                    )
        finally:
            if own:
                f.close()

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
            with no_cyclic_gc(not is_local(self.fs)):
                ds = self.file()[name]
                info = self.manifest.arrays[name]
                if ds.dtype != np.dtype(info.dtype) or tuple(ds.shape) != tuple(info.shape):
                    raise ChunkReadError(
                        f"dataset {name!r} in {self.root}/{FILE_NAME} does not match the "
                        f"manifest: it is {ds.dtype} {tuple(ds.shape)}, the store says "
                        f"{info.dtype} {tuple(info.shape)}"
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
            if compressed(self.manifest):
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
            with no_cyclic_gc(not is_local(self.fs)):
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


def compressed(manifest: Manifest) -> bool:
    """Whether any array of the store has a compression filter (hdf5plugin's Blosc2)."""
    return any(array_compression(manifest.options, n) != "none" for n in manifest.arrays)
