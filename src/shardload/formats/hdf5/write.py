"""Writing HDF5 stores: one file, ``data.h5``, one dataset per array, chunked ``(chunk_rows, *row_shape)``.

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

import contextlib
import errno
import itertools
import os
import sys
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import StoreError, require
from shardload.formats.base import DEFAULT_LEVELS, FormatOptions
from shardload.formats.checksums import digest
from shardload.formats.hdf5.read import FILE_NAME, RAGGED_FILE
from shardload.formats.ragged.write import value_chunk
from shardload.manifest.names import PIECE_NAMES

#: Feature names live in datasets ``/_features/NAME`` (one UTF-8 string per feature): an HDF5
#: attribute is limited to 64 KiB (object header), i.e. a few thousand names.
FEATURES_GROUP = "_features"
_LOCK = threading.Lock()
#: how HDF5 names a full disk or quota in its error text (h5py's errors carry no errno)
_DISK_FULL_TEXT = ("errno = 28", "errno = 122", "No space left on device", "Disk quota exceeded")


def _write_error(exc: Exception, path: Path) -> Exception:
    """A full disk as ``OSError(ENOSPC)`` naming ``path`` (which the run reports as a
    DiskFullError); other errors as they are."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return exc
    if any(t in str(exc) for t in _DISK_FULL_TEXT):
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return OSError(errno.ENOSPC, f"No space left on device writing {path} ({first})")
    return exc


def _write_features(f: Any, name: str, features: Sequence[str]) -> None:
    """``/_features/NAME``, written :data:`PIECE_NAMES` names at a time: a wide array's names
    (lazy :class:`~shardload.manifest.names.GridNames`, 32.5 M at N320) are never all held as
    Python strings at once."""
    import h5py

    group = f.require_group(FEATURES_GROUP)
    if name in group:
        del group[name]
    n = len(features)
    ds = group.create_dataset(name, shape=(n,), dtype=h5py.string_dtype("utf-8"))
    names = iter(features)
    for at in range(0, n, PIECE_NAMES):
        piece = list(itertools.islice(names, PIECE_NAMES))
        ds[at : at + len(piece)] = np.array(piece, dtype=object)


def _filter(options: FormatOptions) -> dict[str, Any]:
    """The dataset's filter; ``options`` resolved for one array (:meth:`FormatOptions.for_array`)."""
    if options.compression == "none":
        return {}
    plugin = require("hdf5plugin", "hdf5")
    # Blosc2, not Blosc: Blosc's HDF5 "set_local" callback fails when netCDF4's own copy of
    # libhdf5 was loaded first (as it is when sources are netCDF files).
    level = options.level if options.level is not None else DEFAULT_LEVELS[options.compression]
    return dict(
        plugin.Blosc2(cname=options.compression, clevel=level, filters=plugin.Blosc2.SHUFFLE)
    )


class Hdf5Writer:
    """Writes ``data.h5`` (``WRITER``); see the module's docstring for the staging."""

    name = "hdf5"
    parallel_write = False
    ragged_staged = True  # values staged as chunk files, then written into ragged.h5

    def __init__(self) -> None:
        self._files: dict[str, Any] = {}
        # open datasets by file: a Dataset dropped after each write would close (and flush)
        # in its __dealloc__, where HDF5's errors (a full disk) are printed and ignored
        self._datasets: dict[str, dict[str, Any]] = {}
        self._failed: set[str] = set()

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
                        **_filter(options.for_array(name)),
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
            key = f"{os.getpid()}:{root}"
            datasets = self._datasets.setdefault(key, {})
            try:
                if name not in datasets:
                    datasets[name] = self._file(root)[name]
                ds = datasets[name]
                ds[start : start + len(data)] = data
                ds.flush()  # errors here, where they can be raised, not in a later close
            except (OSError, RuntimeError) as exc:
                self._failed.add(key)
                raise _write_error(exc, Path(root) / FILE_NAME) from exc
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
            datasets = self._datasets.pop(key, {})
            f = self._files.pop(key, None)
            path = Path(root) / FILE_NAME
            if key in self._failed:
                self._failed.discard(key)
                _abandon(f, datasets, path)
            elif f is not None:
                try:
                    datasets.clear()
                    f.flush()
                    f.close()
                except (OSError, RuntimeError) as exc:
                    _abandon(f, datasets, path)
                    raise _write_error(exc, path) from exc

    def array_path(self, name: str, *, ragged: bool = False) -> str:
        return f"{RAGGED_FILE if ragged else FILE_NAME}/{name}"

    def finish_ragged(
        self,
        root: Path,
        infos: Mapping[str, tuple[np.dtype, np.ndarray]],
        offsets: Mapping[str, np.ndarray],
        bounds: Sequence[int],
        options: FormatOptions,
        staged: Callable[[str], Iterator[np.ndarray]],
    ) -> None:
        """``ragged.h5``: per ragged array the group ``NAME`` with the datasets ``values``
        and ``offsets``, a file of its own, written whole (temporary file, fsync, rename)."""
        import h5py

        path = Path(root) / RAGGED_FILE
        tmp = path.with_name(path.name + ".tmp")
        rows = int(bounds[1] - bounds[0]) if len(bounds) > 1 else 1
        with h5py.File(tmp, "w") as f:
            for name, (dtype, lengths) in infos.items():
                g = f.create_group(name)
                total = int(lengths.sum())
                step = min(value_chunk(lengths, bounds), max(1, total))
                values = g.create_dataset(
                    "values",
                    shape=(total,),
                    dtype=np.dtype(dtype),
                    chunks=(step,) if total else None,
                    **_filter(options.for_array(name)),
                )
                at = 0
                for part in staged(name):
                    values[at : at + len(part)] = part
                    at += len(part)
                off = offsets[name]
                g.create_dataset(
                    "offsets",
                    data=off,
                    chunks=(min(rows + 1, len(off)),),
                    **_filter(options.for_array(name)),
                )
            f.flush()
        with open(tmp, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp, path)


def _abandon(f: Any, datasets: dict[str, Any], path: Path) -> None:
    """Close a file whose writes failed; it is garbage, rebuilt from the staged blocks on resume.

    HDF5 keeps the writes that failed in its caches and retries them at every close: on a
    full disk each close fails again, the file stays open in the library, and the process
    crashes at exit (a segmentation fault in HDF5's own clean-up). Emptying the file first
    frees its blocks, so the retried writes (a few chunks, landing in a sparse file) fit and
    the close succeeds. Errors of this close are not news: one was raised already."""
    with contextlib.suppress(OSError):
        os.truncate(path, 0)
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        datasets.clear()  # their close retries the failed writes too
        with contextlib.suppress(Exception):
            if f is not None:
                f.close()
        import gc

        gc.collect()  # the closed file's objects, while the hook is quiet
    finally:
        sys.unraisablehook = hook


WRITER = Hdf5Writer()
