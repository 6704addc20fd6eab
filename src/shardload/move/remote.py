"""Stores given as URLs: one filesystem for every format, with retries and an optional cache.

:func:`open_fs` returns a :class:`RemoteFileSystem` wrapping fsspec's filesystem of the URL
(``http``, ``s3``, ``gs``...). Every read of every format goes through it: npy chunks and headers,
HDF5 (a file object on top of ranged reads), and Zarr (``formats.zarr.open_group_readonly``
hands its :attr:`~RemoteFileSystem.fsspec_view` to zarr through fsspec's
``AsyncFileSystemWrapper``). So all of them get the same
retries (transient errors: connection reset, 5xx, timeouts; exponential backoff with jitter),
the same errors (:class:`~shardload.errors.RemoteError` naming the URL and what was read), and
the same optional local cache of whole files (:mod:`shardload.move.cache`, bounded in bytes).

The filesystem is described by a picklable :class:`RemoteSpec` and reopens its fsspec instance
in each process (fsspec's async filesystems are not fork-safe), so a Store holding it can go to
DataLoader workers under fork, spawn or forkserver. Shards by http(s): :mod:`.http_get`. It
imports fsspec at the first call that needs the URL's filesystem: a process reading only a
node cache's copies of an http(s) store imports no fsspec, aiohttp, ``ssl`` nor ``asyncio``.

Read options default to ``SHARDLOAD_RETRIES`` (5), ``SHARDLOAD_RETRY_BACKOFF_S`` (0.25),
``SHARDLOAD_TIMEOUT_S`` (30); http(s) also ``SHARDLOAD_TOKEN``, ``SHARDLOAD_CA_FILE``.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from shardload.errors import RemoteError
from shardload.move import cache as remote_cache
from shardload.move.cache_files import evict_lru
from shardload.move.cache_prefetch import CachePlan
from shardload.move.http_client import close_client, is_http
from shardload.move.remote_spec import RemoteSpec
from shardload.move.retries import call_with_retries, default_option

__all__ = [
    "RemoteFileSystem",
    "RemoteSpec",
    "call_with_retries",
    "evict_lru",
    "is_url",
    "open_fs",
    "read_bytes",
    "read_many",
]

log = logging.getLogger("shardload.remote")

T = TypeVar("T")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://")
#: held while a filesystem opens its fsspec target (a new lock in a forked child)
_OPENING = threading.Lock()
os.register_at_fork(after_in_child=lambda: globals().update(_OPENING=threading.Lock()))
#: Requests in flight at most per reader of a store read by URL (the loader's read threads;
#: zarr-python's thread pool is widened to as many when a Zarr store opens by URL).
URL_IN_FLIGHT = 32


def is_url(s: str | os.PathLike) -> bool:
    """True for ``scheme://...`` strings (``file://`` included), False for plain paths."""
    return isinstance(s, str) and bool(_URL.match(s))


def open_fs(
    url: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_bytes: int | None = None,
    retries: int | None = None,
    timeout_s: float | None = None,
    backoff_s: float | None = None,
) -> tuple[RemoteFileSystem, str]:
    """Open the filesystem of ``url`` (see :class:`RemoteSpec` for the options).

    Options left as None take their default from the environment (module docstring). Returns
    ``(fs, root_path)``: the filesystem and the store's path on it (what ``fs.find`` /
    ``read_bytes`` take).
    """
    spec = RemoteSpec(
        url=url,
        storage_options=dict(storage_options or {}),
        cache_dir=None if cache_dir is None else os.fspath(cache_dir),
        cache_bytes=None if cache_bytes is None else int(cache_bytes),
        retries=int(default_option("retries") if retries is None else retries),
        backoff_s=float(default_option("backoff_s") if backoff_s is None else backoff_s),
        timeout_s=float(default_option("timeout_s") if timeout_s is None else timeout_s),
    )
    fs = RemoteFileSystem(spec)
    return fs, fs.root


def read_bytes(
    fs: Any, path: str, start: int | None = None, end: int | None = None, *, what: str = ""
) -> bytes:
    """Read ``path[start:end]`` (Python slice rules; None reads the whole file) with retries.

    Parameters
    ----------
    fs, path
        A filesystem and path, as returned by :func:`open_fs` (plus a file name); any other
        fsspec filesystem is read with the default retries and no cache.
    what : str
        What is being read, for error messages (e.g. ``"chunk 12 of array 'x'"``).

    Raises
    ------
    RemoteError
        After the retries (``RemoteNotFoundError``, at once, for missing files).
    """
    if isinstance(fs, RemoteFileSystem):
        return fs.cat_file(path, start, end, what=what)
    return call_with_retries(
        lambda: fs.cat_file(path, start=start, end=end),
        url=_full_url(fs, path),
        what=what,
        retries=int(default_option("retries")),
        backoff_s=float(default_option("backoff_s")),
    )


METADATA_IN_FLIGHT = 16  # requests in flight at once for read_many (a store's metadata files)


def read_many(
    fs: Any,
    paths: Sequence[str],
    *,
    what: Mapping[str, str] | None = None,
    ranges: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, bytes | BaseException]:
    """Read small files at once (``METADATA_IN_FLIGHT`` in flight): a store's metadata by URL
    in one round trip (issue 28). Each is read as :func:`read_bytes` reads it, whole or its
    bytes ``ranges[path]`` (start, end); ``what`` names them. Returns each path's bytes, or the
    exception its read raised (the caller decides which are errors)."""
    from concurrent.futures import ThreadPoolExecutor

    from shardload.move.retries import current_stop, stop_on

    names, cuts = dict(what or {}), dict(ranges or {})
    stop = current_stop()

    def one(path: str) -> bytes | BaseException:
        start, end = cuts.get(path, (None, None))
        with stop_on(stop):
            try:
                return read_bytes(fs, path, start, end, what=names.get(path, ""))
            except Exception as exc:  # handed to the caller, who raises it where it matters
                return exc

    unique = list(dict.fromkeys(paths))
    if len(unique) <= 1:
        return {p: one(p) for p in unique}
    with ThreadPoolExecutor(min(METADATA_IN_FLIGHT, len(unique))) as pool:
        return dict(zip(unique, pool.map(one, unique), strict=True))


def _full_url(fs: Any, path: str) -> str:
    try:
        return fs.unstrip_protocol(path)
    except Exception:  # pragma: no cover - exotic filesystems
        return path


class RemoteFileSystem:
    """A read-only filesystem over fsspec's filesystem of a URL: retries, cache, fork safety.
    Paths are those of the wrapped filesystem (full URLs for HTTP, ``bucket/key`` for S3);
    ``open`` gives a read-only file (a local file when cached).

    It imports no fsspec until a read needs the URL's filesystem: a process reading a warm
    node cache by http(s) never does. fsspec's API beyond the methods here (what zarr-python's
    store takes, ``glob``, ``walk``...) is :attr:`fsspec_view`'s, reading through this object."""

    protocol = ("shardload-remote",)
    cachable = False
    async_impl = False

    def __init__(self, spec: RemoteSpec) -> None:
        self.spec = spec
        self._pid = -1
        self._target: Any = None
        self._cache: remote_cache.NodeCache | None = None
        self._cache_pid = -1
        self._pins: Any = None  # the version of each file first read: ``move/pinned.py``
        # HTTP: no client (aiohttp's import: 0.1-0.2 CPU s) until a read needs the server
        self.root = spec.url.rstrip("/") if is_http(spec.url) else self.target_and_root()[1]

    def target_and_root(self) -> tuple[Any, str]:
        if self._target is None or self._pid != os.getpid():
            with _OPENING:  # reader threads' first reads at once: one target, not one each
                if self._target is None or self._pid != os.getpid():
                    self._target, self._root = self.spec.open_target()
                    self._pid = os.getpid()
        return self._target, self._root

    @property
    def target(self) -> Any:
        """fsspec's filesystem for the URL, opened in this process."""
        return self.target_and_root()[0]

    def __reduce__(self) -> tuple[Any, ...]:
        return (RemoteFileSystem, (self.spec,), {"_pins": self._pins})

    @property
    def pins(self) -> Any:
        """The version pinned for each file read from the server (``move/pinned.py``, imported
        at the first read that is not a node cache's copy)."""
        if self._pins is None:
            from shardload.move.pinned import Pins

            self._pins = Pins()
        return self._pins

    @property
    def fsspec_view(self) -> Any:
        """This filesystem as an fsspec ``AbstractFileSystem`` (``move/remote_fsspec.py``;
        fsspec imported now): what zarr-python's ``FsspecStore`` wraps. A new one each time,
        not kept: kept, it would make a reference cycle, and a store dropped without closing
        would hold its connections until a full garbage collection."""
        from shardload.move.remote_fsspec import FsspecView

        return FsspecView(self)

    def __getattr__(self, name: str) -> Any:
        """The rest of fsspec's API (public names only: a missing private attribute is not
        a reason to import fsspec), as :attr:`fsspec_view` has it."""
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.fsspec_view, name)

    def pinned(self, path: str) -> bool:
        """Whether reads of ``path`` are tied to one version (``Verifier.check``)."""
        return self.spec.cache_dir is not None or (
            self._pins is not None and self._pins.pinned(path)
        )

    def __repr__(self) -> str:
        return f"<RemoteFileSystem {self.spec.url}>"

    # -- paths ----------------------------------------------------------------------------------
    def unstrip_protocol(self, name: str) -> str:  # fsspec's HTTP paths are full URLs
        return name if is_http(name) else _full_url(self.target, name)

    @property
    def _deadline(self) -> dict[str, Any]:
        """A hard deadline for one call of an async filesystem (fsspec's ``sync(timeout=)``),
        above the client's own timeouts: a silent event loop is a (retried) timeout, no hang."""
        if getattr(self.target, "async_impl", False):
            return {"timeout": 2 * self.spec.timeout_s + 1}
        return {}

    # -- reads ----------------------------------------------------------------------------------
    def _retry(self, func: Callable[[], T], path: str, what: str) -> T:
        url, s = self.unstrip_protocol(path), self.spec
        what = what or self._name(path)
        return call_with_retries(func, url=url, what=what, retries=s.retries, backoff_s=s.backoff_s)

    def _name(self, path: str, what: str = "file") -> str:
        """``file x/000004.npy`` (the path inside the store) for error messages."""
        rel = path[len(r) + 1 :] if path.startswith((r := self.root.rstrip("/")) + "/") else path
        return f"{what} {rel}" if rel else what

    @property
    def node_cache(self) -> remote_cache.NodeCache | None:
        """This process's view of the cache folder (None without ``cache_dir``)."""
        s = self.spec
        if s.cache_dir is None:
            return None
        if self._cache is None or self._cache_pid != os.getpid():
            self._cache = remote_cache.NodeCache(s.cache_dir, s.cache_bytes)
            self._cache_pid = os.getpid()
        return self._cache

    def release(self) -> None:
        """``Store.close``: end the node cache's read-ahead and held copies
        (:meth:`NodeCache.close`) and this process's connections (a later read opens new ones)."""
        if (cache := self.node_cache) is not None:
            cache.close()
        target, self._target = self._target, None
        if target is not None and self._pid == os.getpid():  # a forked child's are its parent's
            close_client(target)

    def plan_cache(
        self,
        times: Mapping[str, Any],
        mine: Sequence[tuple[int, str]],
        digests: Mapping[str, int],
        *,
        lag_steps: int = 0,
    ) -> bool:
        """The loader's plan for the cache (``move/cache_prefetch.py``): the steps at which the
        node reads each path, this process's reads ``(step, path)`` in order, the store's
        digests by path; ``lag_steps``: how far the loop reads ahead. A no-op without
        ``cache_dir``; no read-ahead when every file is cached already (:meth:`NodeCache.replan`).
        Whether every file of this process's reads is cached already (a warm epoch)."""
        if (cache := self.node_cache) is None:
            return False
        key = {p: remote_cache.key_of(self.unstrip_protocol(p)) for p in times}
        plan = CachePlan(
            {key[p]: t for p, t in times.items()},
            [(t, key[p], p) for t, p in mine],
            lambda p: os.close(self._cached_fd(p, "", ahead=True)),
            lag_steps=lag_steps,
        )
        return cache.replan(plan, {key[p]: int(d) for p, d in digests.items() if p in key})

    def _cached_fd(
        self, path: str, what: str, *, ahead: bool = False, fetched: list[bytes] | None = None
    ) -> int:
        """A descriptor on the cache's checked copy of ``path`` (``fetched``: the bytes fetched)."""
        cache = self.node_cache
        assert cache is not None

        def download() -> bytes:
            if ahead:  # one attempt: the loop's own read retries, and reports, a failure
                return bytes(self.target.cat_file(path, **self._deadline))
            data = self._retry(lambda: self.target.cat_file(path, **self._deadline), path, what)
            if fetched is not None:
                fetched.append(data)
            return data

        return cache.open(self.unstrip_protocol(path), download, what=what, ahead=ahead)

    def cached_copy(self, path: str, *, what: str, digest: int | None) -> tuple[int, int | None]:
        """A descriptor (the caller closes it) on the node cache's checked copy of ``path``,
        fetched when missing or not matching ``digest`` (the store's), and the digest its
        record vouches for (``NodeCache.vouched_digest``)."""
        cache, url = self.node_cache, self.unstrip_protocol(path)
        if digest is not None and cache is not None:
            cache.digests[remote_cache.key_of(url)] = int(digest)
        fd = self._cached_fd(path, what)
        return fd, cache.vouched_digest(fd, url) if cache is not None else None

    def cat_file(  # type: ignore[override]
        self, path: str, start: int | None = None, end: int | None = None, what: str = "", **kw
    ) -> Any:
        view = bool(kw.pop("view", False))  # a read-only memoryview: move/pinned.py
        if view and self.spec.cache_dir is not None:  # a checked local copy's bytes
            return memoryview(self.cat_file(path, start, end, what))
        if self.spec.cache_dir is not None:
            fetched: list[bytes] = []
            fd = self._cached_fd(path, what, fetched=fetched)
            try:
                if fetched:  # filled now: the bytes the cache checked and wrote, not read back
                    a, b, _ = slice(start, end).indices(len(fetched[0]))
                    whole = (a, b) == (0, len(fetched[0]))
                    return fetched[0] if whole else fetched[0][a:b]
                return remote_cache.read_range(fd, start, end)
            finally:
                os.close(fd)
        from shardload.move.http_get import reader_of  # http.client: 2.5 ms, only now
        from shardload.move.pinned import pinned_cat

        url, fs, kw = self.unstrip_protocol(path), self.target, self._deadline
        kw["reader"] = reader_of(fs, self.spec.timeout_s) if view else None  # move/http_get.py
        return self._retry(
            lambda: pinned_cat(fs, path, start, end, self.pins, url, view=view, **kw), path, what
        )

    def open(self, path: str, mode: str = "rb", block_size: Any = None, **kwargs: Any) -> Any:
        """A read-only file of ``path``: the node cache's checked copy when there is a cache,
        else fsspec's buffered file of ranged reads (each retried)."""
        if mode == "rb" and not kwargs and self.spec.cache_dir is not None:
            return self.open_cached(path.rstrip("/"))  # as fsspec's open, without fsspec
        return self.fsspec_view.open(path, mode, block_size=block_size, **kwargs)

    def open_cached(self, path: str) -> Any:
        """The node cache's checked copy of ``path``, open for reading."""
        return os.fdopen(self._cached_fd(path, ""), "rb")

    def size(self, path: str) -> int:
        return int(self.info(path)["size"])

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:  # metadata, listings: retried
        what = self._name(path, "size of")
        return self._retry(lambda: self.target.info(path, **kwargs, **self._deadline), path, what)

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> Any:
        what = self._name(path, "listing of")
        return self._retry(lambda: self.target.ls(path, detail=detail, **kwargs), path, what)

    def find(self, path: str, *args: Any, **kwargs: Any) -> Any:
        what = self._name(path, "listing of")
        return self._retry(lambda: self.target.find(path, *args, **kwargs), path, what)

    def sizes(self, paths: list[str]) -> list[int]:
        if not paths:
            return []
        return self._retry(lambda: self.target.sizes(paths), paths[0], "file sizes")

    def exists(self, path: str, **kwargs: Any) -> bool:
        try:
            self.info(path)
        except (FileNotFoundError, RemoteError):
            return False
        return True
