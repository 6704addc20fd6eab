"""How a Zarr reader opens its stored files: local paths, by URL, or through a remote
filesystem's whole-file cache (:class:`StoredFiles`).

By URL every request counts (issues 25 and 28): a stored file is fetched whole with one
request (:class:`.shards.RangeFile`, no size query first as an fsspec file makes), and a small
metadata file (an array's ``zarr.json``) once per reader, whichever of its threads asks first
(an epoch of 32 reader threads had fetched one ``zarr.json`` 68 times), and in a DataLoader
worker not at all when the main process's reader fetched it (:class:`CarriedMetadata`).
"""

from __future__ import annotations

import io
import threading
from collections.abc import Mapping
from typing import Any

from shardload.formats.base import is_local
from shardload.formats.copies import CopyOpener, is_cached
from shardload.formats.zarr.shards import RangeOpener


class StoredFiles:
    """The openers of one reader's files on ``fs``, and its kept small files (by URL)."""

    def __init__(self, fs: Any) -> None:
        self.fs = fs
        self.local = is_local(fs)
        self.cached = not self.local and is_cached(fs)
        self._small: dict[str, bytes | None] = {}  # None: not found
        self._lock = threading.Lock()

    def opener(self) -> Any:
        """Opens a stored file: None locally (the caller opens the path); by URL one request
        for the whole file; the local copy when the filesystem caches whole files."""
        if self.local:
            return None
        if self.cached:  # checked by the copies' records (formats/copies.py)
            return CopyOpener(self.fs)
        return RangeOpener(self.fs)

    def meta_opener(self) -> Any:
        """Opens a small metadata file: None locally; by URL from :meth:`read_small`."""
        if self.local:
            return None
        return lambda p: io.BytesIO(self.read_small(p, what=p.rsplit("/", 1)[-1]))

    def read_small(self, path: str, *, what: str) -> bytes:
        """A small file whole: one read, or by URL one request per reader (retried, cached if
        asked), kept for the reader's threads and its later uses."""
        if self.local:
            with open(path, "rb") as f:
                return f.read()
        from shardload.move.remote import read_bytes

        with self._lock:  # the reader's threads open an array at once: one fetch
            if path not in self._small:
                try:
                    self._small[path] = read_bytes(self.fs, path, what=what)
                except FileNotFoundError:
                    self._small[path] = None
            data = self._small[path]
        if data is None:
            raise FileNotFoundError(path)
        return data

    def prefetch_metadata(self, root: str, arrays: dict[str, Any], verifier: Any) -> None:
        """By URL, the ``zarr.json`` of ``arrays`` (manifest entries, by name) of the store at
        ``root`` and the checksum file, if ``verifier`` will read it, in one batch of requests
        (:meth:`prefetch`): one round trip before the first reads, not one per file."""
        paths = {meta_path(root, a): f"zarr.json of array {k!r}" for k, a in arrays.items()}
        sums = verifier.sums_path()
        got = self.prefetch({**paths, **({sums: "the checksum file"} if sums else {})})
        if sums is not None and sums in got:
            verifier.take_sums(got[sums])

    def prefetch(self, paths: dict[str, str]) -> dict[str, bytes]:
        """Fetch the small files ``{path: what}`` not yet kept, all at once (by URL: the
        reader's metadata in one round trip, not one per file; local: nothing) and keep them
        for :meth:`read_small`. Returns the bytes of those that could be read; a missing
        file is kept as missing, any other failure left for :meth:`read_small` to meet and
        report."""
        if self.local:
            return {}
        from shardload.move.remote import read_many

        with self._lock:
            todo = [p for p in paths if p not in self._small]
        got = read_many(self.fs, todo, what=paths)
        with self._lock:
            self._keep(got)
            return {p: d for p in paths if isinstance(d := self._small.get(p), bytes)}

    def kept(self, paths: set[str]) -> dict[str, bytes]:
        """The small files of ``paths`` kept so far (read without the lock, from a dict copy:
        a forked child reads its parent's, whose lock a parent's thread may have held)."""
        small = self._small.copy()
        return {p: d for p, d in small.items() if p in paths and isinstance(d, bytes)}

    def keep(self, got: Mapping[str, bytes | BaseException]) -> None:
        """Keep fetched small files as :meth:`prefetch` does (a missing one as missing; any
        other failure is not kept), leaving any already kept as it is."""
        with self._lock:
            self._keep(got)

    def _keep(self, got: Mapping[str, bytes | BaseException]) -> None:
        for p, data in got.items():
            if isinstance(data, bytes):
                self._small.setdefault(p, data)
            elif isinstance(data, FileNotFoundError):
                self._small.setdefault(p, None)


def meta_path(root: str, array: Any) -> str:
    """The ``zarr.json`` of a store's array (a manifest entry) under the store at ``root``."""
    return f"{root.rstrip('/')}/{array.path}/zarr.json"


class CarriedMetadata:
    """The ``zarr.json`` files a shardload store's reader (``self.files``, ``self.strict``,
    ``self.manifest``, ``self.root``) fetched by URL and checked, carried to the reader of a
    DataLoader worker (:class:`shardload.formats.base.CarriesMetadata`): that reader keeps them
    and its ``check_metadata`` checks them against the manifest as if it had fetched them."""

    files: StoredFiles
    strict: bool
    manifest: Any
    root: str

    def _meta_paths(self) -> set[str]:
        arrays = self.manifest.arrays.values()
        return {meta_path(self.root, a) for a in arrays if not a.is_ragged}

    def carried_metadata(self) -> dict[str, bytes]:
        """The arrays' kept ``zarr.json`` (a forked child reads this from the parent's reader:
        :meth:`StoredFiles.kept` takes no lock)."""
        if not self.strict or self.files.local:  # plain Zarr: nothing checks them
            return {}
        return self.files.kept(self._meta_paths())

    def take_metadata(self, carried: Mapping[str, bytes]) -> None:
        """Keep another process's :meth:`carried_metadata` as if fetched (checked by the
        reader's ``check_metadata`` before any use)."""
        if not self.strict or self.files.local:
            return
        want = self._meta_paths()
        self.files.keep({p: d for p, d in carried.items() if p in want and isinstance(d, bytes)})
