"""``open_store``: a handle on a prepared store (or plain Zarr data), local or by URL.

Opening reads the manifest, checks that it agrees with itself and with each array's own
metadata (a Zarr array's ``zarr.json``, an npy array's last chunk header, the HDF5 datasets:
one small read per array); arrays open for reading lazily, in the process that reads
(handles are dropped when a Store is pickled into DataLoader workers).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import IncompleteStoreError, StoreError
from shardload.formats.base import ArrayReader, CarriesMetadata, ChecksMetadata, LocalFS, is_local
from shardload.formats.checksums import DEFAULT_VERIFY, VERIFY_ENV, check_verify
from shardload.formats.registry import open_reader as open_format_reader
from shardload.layout import MANIFEST_NAME, PARTIAL_SUFFIX
from shardload.manifest.consistency import check_manifest_consistent
from shardload.manifest.core import Manifest
from shardload.manifest.time import TimeAxis
from shardload.store.files import CARRY_BYTES, StoreFiles, metadata_to_carry, read_manifest
from shardload.store.incomplete import interrupted_error, partial_error
from shardload.util.procs import ForkSafeLock


class Store:
    """A prepared store: ``len(store)`` rows, arrays by name, any row range without dask."""

    def __init__(
        self, manifest: Manifest, fs: Any, root: str, *, url: str, verify: str = DEFAULT_VERIFY
    ) -> None:
        self.manifest = manifest
        self.fs = fs
        self.root = root
        self.url = url
        self.verify = check_verify(verify)
        self._reader: ArrayReader | None = None
        self._ragged: Any = None
        self._pid = os.getpid()
        self._opening = ForkSafeLock()
        self.hold: Any = None  # keeps what the store is read through alive (a SquashFS mount)
        #: the manifest to check each array's own metadata against at the reader's first use
        #: (by URL in each process: opening costs one request; see :func:`open_store`)
        self.check_metadata_of: str | None = None
        #: by URL, the checksum file fetched with the manifest (for each process's reader)
        self.checksum_bytes: bytes | None = None
        #: by URL, the arrays' metadata files a reader of another process fetched and checked
        #: (``{path: bytes}``), for this process's reader (:meth:`_metadata_to_carry`)
        self.carried_metadata: dict[str, bytes] | None = None

    # -- description ---------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.manifest.length

    def __repr__(self) -> str:
        arrays = ", ".join(
            f"{k}[{a.shape[0]}, *]:{a.dtype}" if a.is_ragged else f"{k}{list(a.shape)}:{a.dtype}"
            for k, a in self.manifest.arrays.items()
        )
        return f"<shardload.Store {self.url} format={self.manifest.format} length={len(self)} arrays=({arrays})>"

    @property
    def time(self) -> TimeAxis | None:
        """A dated store's time axis (:mod:`shardload.manifest.time`), else None."""
        return self.manifest.time_axis

    @property
    def arrays(self) -> tuple[str, ...]:
        return tuple(self.manifest.arrays)

    @property
    def chunk_bounds(self) -> tuple[int, ...]:
        return self.manifest.chunk_bounds

    @property
    def num_chunks(self) -> int:
        return self.manifest.num_chunks

    @property
    def is_local(self) -> bool:
        return is_local(self.fs)

    def left_out(self, names: Sequence[str]) -> str:
        """Why arrays of plain Zarr data were left out when it was opened ("" if they were
        not), for error messages."""
        skipped = self.manifest.provenance.get("skipped") or {}
        why = [f"{n!r}: {skipped[n]}" for n in names if n in skipped]
        return f" (left out when opened: {'; '.join(why)})" if why else ""

    # -- reading ---------------------------------------------------------------------------------
    @property
    def reader(self) -> ArrayReader:
        reader = self._reader
        if reader is not None and self._pid == os.getpid():
            return reader
        with self._opening:  # the reader's threads ask at once: one reader, checked first
            if self._reader is None or self._pid != os.getpid():
                self._reader = self._open_reader()
                self._pid = os.getpid()
            return self._reader

    def _open_reader(self) -> ArrayReader:
        """A new reader, its arrays' metadata checked before any thread reads through it (by
        URL in each process, the files its first reads need in one batch of requests)."""
        open_reader = partial(open_format_reader, self.manifest.format, self.fs, self.root)
        carried = self._metadata_to_carry()  # a forked child's: from its parent's reader
        reader = None
        if "window" in self.manifest.static:  # windows cut at load time (at_load: true)
            from shardload.store.windows import open_window_reader

            reader = open_window_reader(self.manifest, partial(open_reader, verify=self.verify))
        reader = reader or open_reader(self.manifest, verify=self.verify)
        sums, verifier = self.checksum_bytes, getattr(reader, "verifier", None)
        if sums is not None and verifier is not None:
            verifier.take_sums(sums)
            if len(sums) > CARRY_BYTES:  # not pickled into every worker
                self.checksum_bytes = None
        if carried and isinstance(reader, CarriesMetadata):
            reader.take_metadata(carried)  # checked against the manifest below, not fetched
        where = self.check_metadata_of
        if where is not None and isinstance(reader, ChecksMetadata):
            reader.check_metadata(where)
        if self.is_local:  # checked once; by URL in each process (a worker fetches its own)
            self.check_metadata_of = None
        return reader

    @property
    def ragged(self) -> tuple[str, ...]:
        """The variable-length arrays (one 1-D array per sample, any length)."""
        return tuple(k for k, a in self.manifest.arrays.items() if a.is_ragged)

    @property
    def ragged_reader(self) -> Any:
        """The reader of the variable-length arrays (:mod:`shardload.formats.ragged.read`)."""
        if self._ragged is None or self._ragged._pid != os.getpid():
            from shardload.formats.ragged.read import RaggedReader

            self._ragged = RaggedReader(self.fs, self.root, self.manifest, verify=self.verify)
        return self._ragged

    def read(self, name: str, start: int = 0, stop: int | None = None) -> Any:
        """Rows ``[start, stop)`` of array ``name`` as a numpy array.

        For a variable-length array: a :class:`~shardload.manifest.ragged.RaggedRows` ``(values,
        lengths)`` (values of the rows concatenated, int64 lengths); ``.padded()`` gives
        ``(rows, longest)`` zero-padded, ``.to_list()`` one array per row (see also
        :meth:`read_padded`)."""
        if name not in self.manifest.arrays:
            raise StoreError(
                f"array {name!r} is not in store {self.url}; it has {list(self.arrays)}"
                + self.left_out([name])
            )
        n = len(self)
        stop = n if stop is None else stop
        start, stop = _clip(start, n), _clip(stop, n)
        if stop < start:
            stop = start
        if self.manifest.arrays[name].is_ragged:
            return self.ragged_reader.read(name, start, stop)
        return self.reader.read(name, start, stop)

    def read_padded(
        self, name: str, start: int = 0, stop: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Rows of a variable-length array as ``(padded, lengths)``: ``(rows, longest)`` with
        zeros after each row's values, and the int64 lengths (as the loader yields them)."""
        if name in self.manifest.arrays and not self.manifest.arrays[name].is_ragged:
            raise StoreError(f"array {name!r} of {self.url} is not a variable-length array")
        rows = self.read(name, start, stop)
        return rows.padded(), rows.lengths

    def read_chunk(self, name: str, i: int) -> np.ndarray:
        if not 0 <= i < self.num_chunks:
            raise StoreError(
                f"chunk {i} out of range: store {self.url} has {self.num_chunks} chunks"
            )
        a, b = self.manifest.chunk_range(i)
        return self.read(name, a, b)

    def read_rows(self, start: int, stop: int, names: Sequence[str] | None = None) -> Any:
        """The same rows of several arrays (row-aligned): ``{name: ndarray}``."""
        return {k: self.read(k, start, stop) for k in (names or self.arrays)}

    def close(self) -> None:
        if hasattr(self.fs, "release"):  # by URL: the cache's read-ahead, the connections
            self.fs.release()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._ragged is not None:
            self._ragged.close()
            self._ragged = None

    def _metadata_to_carry(self) -> dict[str, bytes] | None:
        """By URL, what this process's reader (a forked child: its parent's) fetched and
        checked of the arrays' metadata, for another process's reader (a DataLoader worker's
        first batch then waits for no metadata): see :func:`.files.metadata_to_carry`."""
        if self.is_local or self.checksum_bytes is None or not self.manifest.checksums:
            return None
        return metadata_to_carry(self._reader) or getattr(self, "carried_metadata", None)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["carried_metadata"] = self._metadata_to_carry()
        d["_reader"] = None
        d["_ragged"] = None
        return d

    def _identity(self) -> str:
        """Names this store's content for dask keys (a rewritten store gets new keys)."""
        m = self.manifest
        return f"{self.url}|{m.provenance.get('created', '')}|{m.length}|{m.chunk_bounds[-1:]}"

    def to_xarray(self, names: Sequence[str] | None = None) -> Any:
        """The store as a lazy ``xarray.Dataset``: one dask chunk per store chunk, read with
        :meth:`read` on compute.

        Dims are ``sample`` and ``NAME_dim1, ...`` (as in the Zarr format's dimension names), or
        in a store written by ``shardload compute`` the source's dims (``attrs["dims"]``);
        an array with feature names has them as the coordinate of its last dim, ``NAME_feature``.
        xarray and dask are imported here only: the read side stays free of them.
        """
        from shardload.store.xarray import store_to_xarray

        return store_to_xarray(self, names)

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _clip(i: int, n: int) -> int:
    i = int(i)
    if i < 0:
        i += n
    return min(max(i, 0), n)


def open_store(
    path_or_url: str | os.PathLike[str] | Store | Any,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    cache_bytes: int | None = None,
    arrays: Sequence[str] | None = None,
    retries: int | None = None,
    timeout_s: float | None = None,
    backoff_s: float | None = None,
    stage_to: str | os.PathLike[str] | None = None,
    stage_keep: bool = False,
    verify: str | None = None,
) -> Store:
    """Open a shardload store (any format), or plain Zarr data chunked along axis 0.

    Parameters
    ----------
    path_or_url
        A local folder, a SquashFS image made by ``shardload pack`` (mounted read-only with
        squashfuse, once per node, unmounted when the last process using it ends; see
        :mod:`shardload.move.mount`), an fsspec URL (``http://``, ``s3://``, ...), or an fsspec mapper
        (``fsspec.get_mapper(url, **options)``, what xarray and zarr users hold), whose
        filesystem is used as is (the remote options below do not apply to it).
    storage_options
        Passed to fsspec for URLs (credentials, endpoint, ...).
    cache_dir, cache_bytes
        A node cache of the store's files (a URL's, or a local path's on a slow shared file
        system), bounded in bytes (None: unbounded); see :mod:`shardload.move.cache`.
    arrays
        For plain Zarr data: which arrays to read together (default: all arrays sharing the
        longest leading dimension).
    retries, timeout_s, backoff_s
        For URLs: attempts after the first on transient errors, the HTTP connect/read-stall
        timeout, the first retry delay (doubled each retry). Defaults: the environment
        variables ``SHARDLOAD_RETRIES``, ``SHARDLOAD_TIMEOUT_S``, ``SHARDLOAD_RETRY_BACKOFF_S``,
        else 5, 30 s and 0.25 s.
    stage_to, stage_keep
        Copy the store (a folder, URL or ``.tar``/``.tgz`` archive) into this node-local
        folder first, e.g. ``/dev/shm``, and open the copy: one copy per node even when every
        rank asks, removed when the last process using it exits unless ``stage_keep`` (see
        :func:`shardload.move.staging.stage`).
    verify
        Check chunks against the checksums recorded when the store was written:
        ``"first-epoch"`` the first time each process reads a chunk, ``"always"`` on every
        read, ``"never"``; ``"auto"`` checks every chunk before its rows are used: a local
        chunk file (npy, Zarr chunk or shard) once per node and file version (a ledger in
        ``$SHARDLOAD_VERIFY_LEDGER``, default ``~/.cache/shardload/verified``), HDF5 chunks
        and chunks read by URL the first time each process reads them. Default: the
        environment variable ``SHARDLOAD_VERIFY``, else ``"auto"``. A mismatch raises
        :class:`ChunkReadError` naming the file; missing,
        truncated or mis-typed chunks are errors in every mode. Every loader reading this ``Store`` (``iter_batches``, ``StreamingDataset``,
        ``MapDataset``, their DataLoader workers) uses its setting. Plain Zarr data has no
        checksums. See docs/loading.md ("Integrity").

    Raises
    ------
    RemoteError
        A URL's manifest cannot be read after the retries (names the URL).
    """
    if isinstance(path_or_url, Store):
        return path_or_url
    verify = check_verify(verify or os.environ.get(VERIFY_ENV) or DEFAULT_VERIFY)
    if _is_mapper(path_or_url):  # an fsspec mapper (fsspec.get_mapper): its filesystem as is
        mapper: Any = path_or_url
        fs, root = mapper.fs, str(mapper.root).rstrip("/") or "/"
        return _open_at(fs, root, fs.unstrip_protocol(root), arrays=arrays, verify=verify)
    url = os.fspath(path_or_url)
    if "://" not in url and os.path.isfile(url) and _is_image(url):  # from `shardload pack`
        from shardload.move.mount import open_image

        mounted, hold = open_image(url)
        if stage_to is None:
            store = _open_at(*_open_fs(str(mounted), {}), url, arrays=arrays, verify=verify)
            store.hold = hold
            return store
        url = str(mounted)  # stage the image's content (the mount stays while this process lives)
    if stage_to is not None:
        from shardload.move.staging import stage

        url = str(
            stage(url, stage_to, keep=stage_keep, storage_options=dict(storage_options or {}))
        )
    remote = dict(
        storage_options=dict(storage_options or {}),
        cache_dir=cache_dir,
        cache_bytes=cache_bytes,
        retries=retries,
        timeout_s=timeout_s,
        backoff_s=backoff_s,
    )
    fs, root = _open_fs(url, remote)
    return _open_at(fs, root.rstrip("/") or "/", url, arrays=arrays, verify=verify)


def _is_image(path: str) -> bool:
    from shardload.move.mount import is_image

    return is_image(path)


def _is_mapper(obj: Any) -> bool:
    from collections.abc import MutableMapping

    return isinstance(obj, MutableMapping) and hasattr(obj, "fs") and hasattr(obj, "root")


def _open_at(fs: Any, root: str, url: str, *, arrays: Sequence[str] | None, verify: str) -> Store:
    if root.rstrip("/").endswith(PARTIAL_SUFFIX):
        raise partial_error(fs, root, url)
    text, sums = read_manifest(fs, root, sums=verify != "never")
    if text is None:
        if _exists(fs, f"{root}{PARTIAL_SUFFIX}") or _exists(fs, f"{root}/_progress"):
            raise interrupted_error(fs, root, url)
        if any(_exists(fs, f"{root}/{m}") for m in ("zarr.json", ".zgroup", ".zarray")):
            from shardload.formats.zarr.plain import manifest_from_zarr

            manifest = manifest_from_zarr(fs, root, arrays=arrays)
            return Store(manifest, fs, root, url=url, verify=verify)
        if not _exists(fs, root):
            raise StoreError(f"no store at {url}: the path does not exist")
        raise StoreError(f"{url} is not a shardload store: no {MANIFEST_NAME} and no Zarr metadata")
    where = f"{url}/{MANIFEST_NAME}"
    manifest = Manifest.from_json(text, where=where, read=StoreFiles(fs, root, url=url))
    if not manifest.complete:
        raise IncompleteStoreError(f"{url} is not complete ({MANIFEST_NAME} says complete: false)")
    # a manifest that lies (edited, damaged) is refused here, before any buffer is sized from it
    check_manifest_consistent(manifest, where=where)
    store = Store(manifest, fs, root, url=url, verify=verify)
    store.checksum_bytes = sums if manifest.checksums else None
    # each array's own metadata against the manifest, one small read each: on open for a local
    # store; by URL at the reader's first use (before any read is sized), so that opening a
    # store costs one request (many ranks open it at once)
    store.check_metadata_of = where
    if store.is_local:
        _ = store.reader
    return store


def _open_fs(url: str, remote: dict[str, Any]) -> tuple[Any, str]:
    if ("://" in url and not url.startswith("file://")) or remote.get("cache_dir") is not None:
        from shardload.move.remote import open_fs  # a local path with cache_dir: as a file:// URL

        return open_fs(url if "://" in url else Path(url).expanduser().resolve().as_uri(), **remote)
    path = url[len("file://") :] if url.startswith("file://") else url
    return LocalFS(), str(Path(path).expanduser().resolve())  # fsspec imported on first use


def _exists(fs: Any, path: str) -> bool:
    try:
        return bool(fs.exists(path))
    except Exception:
        return False
