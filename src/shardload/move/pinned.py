"""Reads by URL tied to the version of each file first read (issue 28).

A file read by URL is checked against its checksum once per reader: fetched whole and hashed.
Later reads of parts of it are range requests that are not hashed. Were the file rewritten on
the server meanwhile (a store prepared again in place, an object overwritten in a bucket), those
ranges would hold other values, served silently. So each reader (per process) pins the version
of every file the first answer for it names (its ``ETag``, else its ``Last-Modified``), and every
later request for that file carries a precondition on that version, on the same request (no
round trip more):

- ``If-Match: <ETag>`` where the server gave an ETag (``shardload serve``: aiohttp's
  ``FileResponse``, whose ETag is the file's mtime in nanoseconds and its size; S3);
- ``If-Unmodified-Since: <Last-Modified>`` where it gave only that, or a weak ETag (``W/``,
  which If-Match never matches; weaker: a rewrite within the same second goes unseen, but
  the answer's weak ETag is still compared);
- neither: the file is not pinned (:meth:`Pins.pinned` False), and the reader checks it again,
  fetched whole, at every read (``formats.checksums.Verifier.check``).

The answer is checked too: a 412, an ETag / Last-Modified that is not the pinned one, or a 200
to a range request that does not name the pinned version raise
:class:`~shardload.errors.RemoteChangedError` naming the URL (a 200 naming it, from a server
that ignores ranges, is cut to the range asked). The pins go with the filesystem to DataLoader
workers. Protocols other than http(s) and s3 are read as fsspec reads them, unpinned.

Asked for a view (``view=True``, the shard reads of ``formats/zarr``), an answer of at least
``INTO_BYTES`` with a ``Content-Length`` is read into one buffer of that size as its blocks
arrive, each block dropped once copied: aiohttp's ``read()`` holds every block until it joins
them into a new ``bytes``, so the process touches twice the answer's memory, all of it fresh
(a 64 MiB shard on loopback: about 0.10 CPU s against 0.06, docs/benchmarks.md). Such a read
keeps the client's read-stall timeout (aiohttp's ``sock_read``, ``timeout_s``) with one timer
checked once a period (:class:`_Stall`) instead of aiohttp's, cancelled and made again for
every block received.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

from shardload.errors import RemoteChangedError

__all__ = ["INTO_BYTES", "Pins", "Version", "pinned_cat"]

#: An answer read for a view with at least this many bytes goes into one buffer as it arrives.
INTO_BYTES = 1 << 20


@dataclass(frozen=True)
class Version:
    """A file's version as a server named it: its ``ETag`` and ``Last-Modified`` (verbatim)."""

    etag: str | None = None
    modified: str | None = None

    def __bool__(self) -> bool:
        return bool(self.etag or self.modified)

    def same(self, other: Version) -> bool:
        """Whether ``other`` names this version by the validator pinned (ETag, else date)."""
        if self.etag:
            return self.etag == other.etag
        return bool(self.modified) and self.modified == other.modified

    def differs(self, other: Version) -> bool:
        """Whether an answer naming ``other`` is of another version than this one."""
        if self.etag and other.etag:
            return self.etag != other.etag
        return bool(self.modified and other.modified and self.modified != other.modified)


class Pins:
    """The version pinned for each path (per process; picklable as its dict)."""

    def __init__(self, by_path: dict[str, Version] | None = None) -> None:
        self.by_path: dict[str, Version] = dict(by_path or {})
        self._lock, self._pid = threading.Lock(), os.getpid()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Pins, (dict(self.by_path),))

    def get(self, path: str) -> Version | None:
        return self.by_path.get(path)

    def pinned(self, path: str) -> bool:
        """Whether reads of ``path`` are tied to one version (it has an ETag or a date)."""
        return bool(self.by_path.get(path))

    def settle(self, path: str, got: Version, url: str) -> None:
        """Pin ``got`` for ``path`` if none is, else check ``got`` is the pinned version (an
        answer naming no version pins and checks nothing)."""
        if not got:
            return
        if self._pid != os.getpid():  # never a lock a parent's thread held at the fork
            self._lock, self._pid = threading.Lock(), os.getpid()
        with self._lock:
            want = self.by_path.setdefault(path, got)
        if want.differs(got):
            raise changed(url, want, got)


def changed(url: str, want: Version, got: Version | None = None) -> RemoteChangedError:
    now = f" (now {got.etag or got.modified})" if got else ""
    return RemoteChangedError(
        f"{url} changed on the server since this reader first read it (version "
        f"{want.etag or want.modified}{now}): the store was rewritten under the reader, whose "
        "checks hold for the version first read; open the store again"
    )


def pinned_cat(
    target: Any,
    path: str,
    start: int | None,
    end: int | None,
    pins: Pins,
    url: str,
    *,
    view: bool = False,
    reader: Any = None,
    **kw: Any,
) -> Any:
    """``path[start:end]`` read by ``target`` (fsspec's filesystem) with a precondition on the
    version of ``path`` in ``pins`` (pinning the answer's when none is); where the protocol is
    neither http(s) nor s3, read as fsspec reads it (unpinned). ``bytes``, or with ``view`` a
    read-only memoryview (a large HTTP answer read into one buffer: the module docstring);
    ``reader``: the :class:`.http_get.HttpReader` that makes an http(s) GET for a view
    without fsspec's event loop, where it can (else None)."""
    protocol = target.protocol if isinstance(target.protocol, str) else target.protocol[0]
    if protocol in ("http", "https"):
        get = _http_get
    elif protocol in ("s3", "s3a"):
        get = _s3_get
    else:
        data = bytes(target.cat_file(path, start=start, end=end, **kw))
        return memoryview(data) if view else data
    from fsspec.asyn import sync

    want = pins.get(path)
    answer: tuple[Any, Version, bool] | None = None
    if view and reader is not None:  # move/http_get.py
        answer = _own_get(reader, target, path, start, end, want, url)
    if answer is None:
        answer = sync(target.loop, get, target, path, start, end, want, url, view, **kw)
    data, got, asked = answer
    if not asked:  # a 200 to a range request: the whole file, of the version pinned only if
        if want and not want.same(got):  # it says so (a server ignoring ranges: cut)
            raise changed(url, want, got)
        data = data[slice(start, end)]
    pins.settle(path, got, url)
    return memoryview(data).toreadonly() if view else data


def _preconditions(want: Version | None) -> dict[str, str]:
    """The headers that make a GET answer only from the version ``want`` (412 otherwise)."""
    if want and want.etag and not want.etag.startswith("W/"):
        return {"If-Match": want.etag}
    if want and want.modified:  # (a weak ETag never matches If-Match: compared on arrival)
        return {"If-Unmodified-Since": want.modified}
    return {}


async def _http_get(
    fs: Any,
    path: str,
    start: int | None,
    end: int | None,
    want: Version | None,
    url: str,
    view: bool = False,
) -> tuple[bytes | memoryview, Version, bool]:
    """A GET of ``path`` (a range of it) on fsspec's session, with the precondition on
    ``want``: its bytes, the version it names, whether it is the answer asked for."""
    import asyncio  # here, not at the top: a process reading a warm node cache needs no loop

    kw = fs.kwargs.copy()
    headers = dict(kw.pop("headers", None) or {})
    ranged = start is not None or end is not None
    if ranged:
        if start == end:
            return b"", want or Version(), True
        headers["Range"] = await fs._process_limits(path, start, end)
    headers.update(_preconditions(want))
    session = await fs.set_session()
    stall = _Stall.of(session, kw) if view else None
    try:
        async with session.get(fs.encode_url(path), headers=headers, **kw) as r:
            if r.status == 412:
                raise changed(url, want or Version())
            fs._raise_not_found_for_status(r, path)
            got = Version(r.headers.get("ETag"), r.headers.get("Last-Modified"))
            out = await _read_into(r, stall) if view else await r.read()
    except asyncio.CancelledError:
        if stall is None or not stall.fired:
            raise
        raise stall.error(url) from None
    finally:
        if stall is not None:
            stall.close()
    return out, got, r.status == 206 or not ranged


def _own_get(
    reader: Any,
    fs: Any,
    path: str,
    start: int | None,
    end: int | None,
    want: Version | None,
    url: str,
) -> tuple[memoryview, Version, bool] | None:
    """:func:`_http_get` by ``reader`` (:mod:`.http_get`): the same preconditions and
    answers; None for what it leaves to aiohttp (odd limits, a redirect, an encoded body)."""
    from shardload.move.http_get import Unsupported

    ranged = start is not None or end is not None
    if (start is not None and start < 0) or (end is not None and (end < 0 or end < (start or 0))):
        return None
    if ranged and start == end:
        return memoryview(b""), want or Version(), True
    try:
        status, answer, body = reader.get(
            str(fs.encode_url(path)), start, end, _preconditions(want)
        )
    except Unsupported:
        return None
    if status == 412:
        raise changed(url, want or Version())
    got = Version(answer.get("ETag"), answer.get("Last-Modified"))
    return body, got, status == 206 or not ranged


async def _read_into(r: Any, stall: _Stall | None = None) -> bytes | memoryview:
    """The answer's body in one buffer of its ``Content-Length``, each block copied in as it
    arrives (joined as ``read()`` joins them when it is small, of unknown length or encoded);
    each block tells ``stall``. A body cut short raises aiohttp's payload error; one longer
    than announced is an error."""
    n = r.content_length
    if r.headers.get("Content-Encoding", "identity") != "identity":
        n = None  # the length on the wire, not of the decoded body
    if n is None or n < INTO_BYTES:
        blocks = []
        async for block in r.content.iter_any():
            if stall is not None:
                stall.moved()
            blocks.append(block)
        return b"".join(blocks)
    import numpy as np

    buf = np.empty(n, np.uint8).data  # no zero-fill: every byte is written below
    at = 0
    async for block in r.content.iter_any():
        if stall is not None:
            stall.moved()
        end = at + len(block)
        if end > n:
            raise OSError(f"{r.url}: the answer is longer than its Content-Length ({n} bytes)")
        buf[at:end] = block
        at = end
    return buf[:at]


class _Stall:
    """The read-stall timeout of one request (the session's ``sock_read``, which the request
    then goes without): the task reading it is cancelled when nothing came for ``timeout_s``,
    checked by one timer made again once per period, not once per block."""

    @classmethod
    def of(cls, session: Any, kw: dict[str, Any]) -> _Stall | None:
        """Take over ``session``'s read-stall timeout for a request with options ``kw`` (None
        when it has none, or the request its own timeout)."""
        timeout = getattr(session, "timeout", None)
        if "timeout" in kw or timeout is None or not timeout.sock_read:
            return None
        import aiohttp

        keep = ("total", "connect", "sock_connect", "ceil_threshold")
        kw["timeout"] = aiohttp.ClientTimeout(**{k: getattr(timeout, k) for k in keep})
        return cls(float(timeout.sock_read))

    def __init__(self, timeout_s: float) -> None:
        import asyncio

        self.loop, self.task = asyncio.get_running_loop(), asyncio.current_task()
        self.timeout_s, self.fired = timeout_s, False
        self.last = self.loop.time()
        self.handle = self.loop.call_at(self.last + timeout_s, self._check)

    def moved(self) -> None:
        """Bytes came."""
        self.last = self.loop.time()

    def _check(self) -> None:
        due = self.last + self.timeout_s
        if self.loop.time() < due:
            self.handle = self.loop.call_at(due, self._check)
        elif self.task is not None:
            self.fired = True
            self.task.cancel()

    def error(self, url: str) -> Exception:
        """The error of a fired timeout, as aiohttp's own (retried, as transient)."""
        import aiohttp

        if self.task is not None and hasattr(self.task, "uncancel"):
            self.task.uncancel()  # this cancellation is handled here (Python 3.11+)
        return aiohttp.ServerTimeoutError(f"{url}: no data for {self.timeout_s:g} s")

    def close(self) -> None:
        self.handle.cancel()


async def _s3_get(
    fs: Any,
    path: str,
    start: int | None,
    end: int | None,
    want: Version | None,
    url: str,
    view: bool = False,
) -> tuple[bytes, Version, bool]:
    """``get_object`` of ``path`` (a range of it) with ``IfMatch`` / ``IfUnmodifiedSince``."""
    bucket, key, version_id = fs.split_path(path)
    kw: dict[str, Any] = dict(fs.req_kw)
    if version_id:
        kw["VersionId"] = version_id
    if start is not None or end is not None:
        if start == end:
            return b"", want or Version(), True
        kw["Range"] = await fs._process_limits(path, start, end)
    if want and want.etag:
        kw["IfMatch"] = want.etag
    elif want and want.modified:
        from email.utils import parsedate_to_datetime

        kw["IfUnmodifiedSince"] = parsedate_to_datetime(want.modified)
    try:
        resp = await fs._call_s3("get_object", Bucket=bucket, Key=key, **kw)
    except OSError as exc:
        if want and _precondition_failed(exc):
            raise changed(url, want) from exc
        raise
    try:
        out = await resp["Body"].read()
    finally:
        resp["Body"].close()
    modified = resp.get("LastModified")
    if modified is not None and not isinstance(modified, str):
        from datetime import timezone
        from email.utils import format_datetime

        modified = format_datetime(modified.astimezone(timezone.utc), usegmt=True)
    return out, Version(resp.get("ETag"), modified), True


def _precondition_failed(exc: BaseException) -> bool:
    """Whether ``exc`` (s3fs's translation of botocore's error) is S3's 412."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            err = response.get("Error", {})
            meta = response.get("ResponseMetadata", {})
            if (
                err.get("Code") in ("PreconditionFailed", "412")
                or meta.get("HTTPStatusCode") == 412
            ):
                return True
        seen = seen.__cause__ or seen.__context__
    return "PreconditionFailed" in str(exc) or "412" in str(exc)
