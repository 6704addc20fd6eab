"""The lock of an output in an object store: a conditional put of ``OUT.partial.lock``.

S3 has no ``flock``: the lock is an object created with ``If-None-Match: *``, which the server
refuses (412) when the object exists, so of two writers exactly one creates it. The holder
(pid, process start time, host, start date) is written inside; a second writer is refused with
:class:`~shardload.errors.StoreLockedError` naming the lock's URL and its holder.

Unlike a ``flock``, nothing drops the object when its holder dies. A run on the *same host* as a
dead holder (its pid gone, or reused by a process that started at another time) takes the lock
over with a put conditional on the dead holder's ETag (``If-Match``), so of two runs taking it
over only one wins. A holder on another host cannot be checked from here: the error says to
delete the lock object once that run is known to be dead. The holder removes the object on
release with a delete conditional on its own ETag, so it never removes a lock taken over by
another run.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from typing import Any

from shardload.errors import StoreError, StoreLockedError
from shardload.util.procs import alive, my_start_time

log = logging.getLogger(__name__)

#: the S3 error codes of a refused conditional request (AWS answers 409 to a concurrent one)
_REFUSED = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})


def refused(exc: BaseException) -> bool:
    """True when ``exc`` (as s3fs raises it) is the server refusing a conditional request."""
    seen: BaseException | None = exc
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict):
            code = str(response.get("Error", {}).get("Code", ""))
            status = str(response.get("ResponseMetadata", {}).get("HTTPStatusCode", ""))
            return code in _REFUSED or status in _REFUSED
        seen = seen.__cause__
    return isinstance(exc, FileExistsError)


class ObjectLock:
    """An exclusive lock on writing ``out_url``: the object ``lock_url`` (s3fs path ``path``)."""

    def __init__(self, fs: Any, path: str, *, out_url: str, lock_url: str) -> None:
        self.fs = fs
        self.path = path
        self.out_url = out_url
        self.lock_url = lock_url
        self.bucket, self.key, _ = fs.split_path(path)
        self._etag: str | None = None

    def _put(self, body: bytes, **condition: str) -> str:
        out = self.fs.call_s3(
            "put_object", Bucket=self.bucket, Key=self.key, Body=body, **condition
        )
        return str(out["ETag"])

    def acquire(self) -> None:
        me = {
            "pid": os.getpid(),
            "start_time": my_start_time(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        body = json.dumps(me).encode()
        for _ in range(10):
            try:
                self._etag = self._put(body, IfNoneMatch="*")
                return
            except OSError as exc:
                if not refused(exc):
                    raise StoreError(
                        f"cannot create the lock object {self.lock_url}: {exc}"
                    ) from exc
            holder, etag = self._holder()
            if etag is None:  # released meanwhile: try again
                continue
            if not _dead_here(holder):
                raise StoreLockedError(
                    f"another prepare is writing {self.out_url} ({_describe(holder)}; lock object "
                    f"{self.lock_url}); wait for it to finish, or, if that run is dead on another "
                    f"host, delete {self.lock_url} and re-run"
                )
            try:
                self._etag = self._put(body, IfMatch=etag)
            except OSError as exc:
                if not refused(exc):
                    raise StoreError(
                        f"cannot take over the lock object {self.lock_url}: {exc}"
                    ) from exc
                continue  # another run took it over first: read the new holder
            log.warning(
                "took over the lock %s of a dead run (%s)", self.lock_url, _describe(holder)
            )
            return
        raise StoreError(f"cannot lock {self.lock_url}: it keeps changing")  # pragma: no cover

    def _holder(self) -> tuple[dict[str, Any], str | None]:
        """The lock object's holder and ETag; ``({}, None)`` when it is gone. The ETag is read
        first: the holder read after it is that version's or a newer one's, so a take-over
        conditional on that ETag never replaces a holder it did not judge."""
        self.fs.invalidate_cache(self.path)
        try:
            etag = str(self.fs.info(self.path)["ETag"])
            text = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return {}, None
        except OSError as exc:
            raise StoreError(f"cannot read the lock object {self.lock_url}: {exc}") from exc
        try:
            info = json.loads(text)
        except ValueError:
            info = {}
        return (info if isinstance(info, dict) else {}), etag

    def release(self) -> None:
        if self._etag is None:
            return
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=self._etag)
        except OSError as exc:  # taken over, or the server is gone: leave it
            log.warning("could not remove the lock object %s: %s", self.lock_url, exc)
        self._etag = None


def _dead_here(holder: dict[str, Any]) -> bool:
    """The holder ran on this host and its process is gone (never True for another host)."""
    if holder.get("host") != socket.gethostname():
        return False
    try:
        pid = int(holder["pid"])
        start = holder.get("start_time")
        start = None if start is None else int(start)
    except (KeyError, TypeError, ValueError):
        return False
    return pid != os.getpid() and not alive(pid, start)


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder not recorded"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"
