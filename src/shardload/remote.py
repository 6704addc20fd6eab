"""fsspec helpers for stores given as URLs: open a filesystem, read bytes with retries, cache.

Cache choice: ``filecache`` (fsspec's ``WholeFileCacheFileSystem``). Store files are immutable
once a store is complete, and the unit of reading is a whole file (an npy chunk, a Zarr chunk or
shard of ~16 MiB), so caching whole files matches the access pattern; a range read of a cached
file is a local ``seek``. ``filecache`` saves its metadata only after a download finished, so a
process killed mid-download leaves no entry that later readers trust (``simplecache`` trusts
any file present). ``blockcache`` would suit sparse range reads of one huge file (e.g. a large
``data.h5``), but keeps sparse files whose size on disk is hard to bound and is not safe to share
between processes (DataLoader workers). The size bound is ours: after a download, the least
recently used cache files are deleted until the folder is under ``cache_bytes``; only files
inside ``cache_dir`` are ever deleted.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from .errors import RemoteError, RemoteNotFoundError

log = logging.getLogger("shardload.remote")

T = TypeVar("T")
_URL = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.\-]*://")
_OPTIONS_ATTR = "_shardload_read_options"
_CACHE_METADATA = "cache"  # filecache's own metadata file inside cache_dir


@dataclass(frozen=True)
class ReadOptions:
    """How :func:`read_bytes` treats one filesystem (set by :func:`open_fs`)."""

    retries: int = 5
    backoff_s: float = 0.25
    cache_dir: str | None = None
    cache_bytes: int | None = None


def is_url(s: str | os.PathLike) -> bool:
    """True for ``scheme://...`` strings (``file://`` included), False for plain paths."""
    return isinstance(s, str) and bool(_URL.match(s))


def open_fs(
    url: str,
    *,
    storage_options: dict[str, Any] | None = None,
    cache_dir: str | os.PathLike | None = None,
    cache_bytes: int | None = None,
    retries: int = 5,
    timeout_s: float = 30,
    backoff_s: float = 0.25,
) -> tuple[Any, str]:
    """Open the fsspec filesystem of ``url``.

    Parameters
    ----------
    url : str
        Any fsspec URL (``http://``, ``s3://``, ``gs://``, ``file://`` ...).
    storage_options : dict, optional
        Passed to the filesystem (credentials, endpoint, ...).
    cache_dir : path, optional
        Cache whole files here (``filecache``; see the module docstring).
    cache_bytes : int, optional
        Bound on the cache folder's size; least recently used files are evicted.
    retries : int
        Attempts after the first one in :func:`read_bytes` for transient errors.
    timeout_s : float
        HTTP connect and read-stall timeout (a silent server fails after this long).
    backoff_s : float
        First retry delay; doubled at each retry, with +-50% jitter.

    Returns
    -------
    (fs, root_path)
        The filesystem and the store's path on it (what ``fs.find`` / ``read_bytes`` take).
    """
    import fsspec
    from fsspec.core import url_to_fs

    opts = dict(storage_options or {})
    if url.split("://", 1)[0].lower() in ("http", "https"):
        import aiohttp

        client = dict(opts.pop("client_kwargs", {}) or {})
        client.setdefault(
            "timeout", aiohttp.ClientTimeout(sock_connect=timeout_s, sock_read=timeout_s)
        )
        opts["client_kwargs"] = client
    # a private instance: read options are attached to it, and a dead server's session is not
    # shared with later calls
    fs, root = url_to_fs(url, skip_instance_cache=True, **opts)
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        fs = fsspec.filesystem(
            "filecache", fs=fs, cache_storage=str(cache_dir), skip_instance_cache=True
        )
    setattr(
        fs,
        _OPTIONS_ATTR,
        ReadOptions(
            retries=retries,
            backoff_s=backoff_s,
            cache_dir=None if cache_dir is None else str(cache_dir),
            cache_bytes=cache_bytes,
        ),
    )
    return fs, root.rstrip("/")


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: connection problems, timeouts, 5xx/408/429, other OSErrors."""
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp is only needed for HTTP
        aiohttp = None
    if aiohttp is not None and isinstance(exc, aiohttp.ClientResponseError):
        return exc.status >= 500 or exc.status in (408, 429)
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return True
    return isinstance(exc, (OSError, TimeoutError, ConnectionError))


def _describe(url: str, what: str) -> str:
    return f"{what} ({url})" if what else url


def call_with_retries(
    func: Callable[[], T],
    *,
    url: str,
    what: str = "",
    retries: int = 5,
    backoff_s: float = 0.25,
    on_error: Callable[[], None] | None = None,
) -> T:
    """Call ``func()``, retrying transient errors with exponential backoff and jitter.

    Raises
    ------
    RemoteNotFoundError
        At once, when the file does not exist.
    RemoteError
        When a non-transient error occurs, or the last retry failed; names ``url`` and ``what``.
    """
    for attempt in range(retries + 1):
        try:
            return func()
        except Exception as exc:
            if on_error is not None:
                on_error()
            status = getattr(exc, "status", None)
            if isinstance(exc, FileNotFoundError) or status == 404:
                raise RemoteNotFoundError(f"{_describe(url, what)}: not found") from exc
            if not is_transient(exc):
                raise RemoteError(f"cannot read {_describe(url, what)}: {exc!r}") from exc
            if attempt == retries:
                raise RemoteError(
                    f"cannot read {_describe(url, what)} after {retries + 1} attempts: {exc!r}"
                ) from exc
            delay = backoff_s * 2**attempt * (0.5 + random.random())
            log.warning(
                "reading %s failed (%r); retry %d/%d in %.2fs",
                _describe(url, what),
                exc,
                attempt + 1,
                retries,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def read_bytes(
    fs: Any, path: str, start: int | None = None, end: int | None = None, *, what: str = ""
) -> bytes:
    """Read ``path[start:end]`` (``start``, ``end`` >= 0 or None) with retries.

    Parameters
    ----------
    fs, path
        A filesystem and path, as returned by :func:`open_fs` (plus a file name).
    start, end : int, optional
        Byte range; None reads the whole file.
    what : str
        What is being read, for error messages (e.g. ``"chunk 12 of array 'x'"``).

    Raises
    ------
    RemoteError
        After the retries of :func:`open_fs` (``RemoteNotFoundError`` for missing files).
    """
    opts = getattr(fs, _OPTIONS_ATTR, None) or ReadOptions()
    local = _cache_file(fs, path, opts)

    def purge() -> None:
        # a failed download may leave a partial file that the cache would trust
        if local is not None:
            with contextlib.suppress(Exception):
                fs.pop_from_cache(path)
            with contextlib.suppress(FileNotFoundError):
                os.remove(local)

    def read() -> bytes:
        if local is None:
            return fs.cat_file(path, start=start, end=end)
        with _locked(local):  # one download per file, also across processes
            hit = os.path.exists(local)
            data = fs.cat_file(path, start=start, end=end)
            with contextlib.suppress(FileNotFoundError):
                now_ns = time.time_ns()  # explicit: the kernel's own clock here is coarse
                os.utime(local, ns=(now_ns, now_ns))  # mtime marks recent use for the LRU
        if not hit and opts.cache_bytes is not None:
            evict_lru(opts.cache_dir, opts.cache_bytes)
        return data

    return call_with_retries(
        read,
        url=_full_url(fs, path),
        what=what,
        retries=opts.retries,
        backoff_s=opts.backoff_s,
        on_error=purge,
    )


def _full_url(fs: Any, path: str) -> str:
    try:
        return fs.unstrip_protocol(path)
    except Exception:  # pragma: no cover - exotic filesystems
        return path


def _cache_file(fs: Any, path: str, opts: ReadOptions) -> str | None:
    if opts.cache_dir is None:
        return None
    return os.path.join(opts.cache_dir, fs.hash_name(fs._strip_protocol(path)))


@contextlib.contextmanager
def _locked(local: str):
    fd = os.open(local + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def evict_lru(cache_dir: str | os.PathLike, cache_bytes: int) -> int:
    """Delete the least recently used files of ``cache_dir`` until it holds <= ``cache_bytes``.

    Only regular files directly inside ``cache_dir`` are considered (never a symlink, never the
    cache's metadata or lock files). Returns the number of bytes freed.
    """
    entries = []
    with os.scandir(cache_dir) as it:
        for e in it:
            if e.name == _CACHE_METADATA or e.name.endswith(".lock"):
                continue
            if e.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    st = e.stat(follow_symlinks=False)
                    entries.append((st.st_mtime_ns, st.st_size, e.path))
    total = sum(size for _, size, _ in entries)
    freed = 0
    for _, size, file in sorted(entries):
        if total - freed <= cache_bytes:
            break
        with contextlib.suppress(FileNotFoundError):
            os.remove(file)  # its .lock stays: removing it could let two downloads overlap
            freed += size
    if freed:
        log.debug("cache %s: evicted %d bytes", cache_dir, freed)
    return freed
