"""The lock of an output in an object store: a conditional put of ``OUT.partial.lock``.

S3 has no ``flock``: the lock is an object created with ``If-None-Match: *``, which the server
refuses (412) when the object exists, so of two writers exactly one creates it. The holder
(pid, process start time, host, start date) is written inside; a second writer is refused with
:class:`~shardload.errors.StoreLockedError` naming the lock's URL and its holder.

Unlike a ``flock``, nothing drops the object when its holder dies, so the lock is a *lease*:
the object records its length (``lease_s``, :data:`LEASE_ENV`, default 10 minutes) and its
holder renews it from a heartbeat thread every third of it (a put conditional on its own ETag;
the body changes at each renewal, so does the ETag). Another run may take the lock over
(a put conditional on the ETag it judged, ``If-Match``: of two runs taking it over one wins)

- from any host, once the lease expired: the server's clock says the object was last written
  more than ``lease_s`` (+1 s, S3's dates are whole seconds) ago (``Date`` - ``Last-Modified``
  of one HEAD: no clock of a host is compared with another's);
- on the holder's host, at once when its process is gone (pid gone, or reused by a process
  that started at another time).

A holder whose renewal is refused (the lock was taken over) or that could not renew it for
2/3 of the lease (so well before another host may take it over) has *lost* it:
:meth:`ObjectLock.check`, called before every upload and before the manifest's put, raises
:class:`~shardload.errors.StoreLockedError` and the run stops without publishing. The holder
removes the object on release with a delete conditional on its own ETag, so it never removes
a lock taken over by another run. Lock objects without a lease (written before 2026-11-28)
never expire.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from email.utils import parsedate_to_datetime
from typing import Any

from shardload.errors import ConfigError, StoreError, StoreLockedError
from shardload.util.procs import alive, my_start_time

log = logging.getLogger(__name__)

#: the S3 error codes of a refused conditional request (AWS answers 409 to a concurrent one)
_REFUSED = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict", "409"})
#: the lease of a lock object, in seconds (environment; default :data:`DEFAULT_LEASE_S`)
LEASE_ENV = "SHARDLOAD_LOCK_LEASE_S"
DEFAULT_LEASE_S = 600.0
#: the holder renews its lease every this fraction of it, and trusts it for ``TRUST`` of it
#: after its last renewal (another host waits the whole lease)
RENEW_EVERY = 1 / 3
TRUST = 2 / 3


def lease_s_from_env() -> float:
    """The lease length :data:`LEASE_ENV` asks for (a ``ConfigError`` naming it when bad)."""
    text = os.environ.get(LEASE_ENV, "").strip()
    if not text:
        return DEFAULT_LEASE_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value or value == float("inf"):
        raise ConfigError(f"{LEASE_ENV}={text!r}: expected a positive number of seconds")
    return value


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

    def __init__(
        self, fs: Any, path: str, *, out_url: str, lock_url: str, lease_s: float | None = None
    ) -> None:
        self.fs = fs
        self.path = path
        self.out_url = out_url
        self.lock_url = lock_url
        self.lease_s = float(lease_s) if lease_s is not None else lease_s_from_env()
        self.bucket, self.key, _ = fs.split_path(path)
        self._etag: str | None = None
        self._me: dict[str, Any] = {}
        self._state = threading.Lock()  # the ETag and the trust deadline: heartbeat vs release
        self._trusted_until = 0.0  # time.monotonic() until which this run may write
        self._lost: str | None = None  # why the lock was lost
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def _put(self, body: bytes, **condition: str) -> str:
        out = self.fs.call_s3(
            "put_object", Bucket=self.bucket, Key=self.key, Body=body, **condition
        )
        return str(out["ETag"])

    def _body(self, renewals: int) -> bytes:
        return json.dumps({**self._me, "renewals": renewals}).encode()

    def acquire(self) -> None:
        """Take the lock (or a dead or expired holder's), then renew it in the background."""
        self._me = {
            "pid": os.getpid(),
            "start_time": my_start_time(),
            "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "lease_s": self.lease_s,
        }
        self._take()
        self._lost = None
        self._stop.clear()
        self._heartbeat = threading.Thread(
            target=self._renew_loop, name="shardload-lock-lease", daemon=True
        )
        self._heartbeat.start()

    def _take(self) -> None:
        body = self._body(0)
        for _ in range(10):
            sent = time.monotonic()
            try:
                self._held(self._put(body, IfNoneMatch="*"), sent)
                return
            except OSError as exc:
                if not refused(exc):
                    raise StoreError(
                        f"cannot create the lock object {self.lock_url}: {exc}"
                    ) from exc
            holder, etag, age_s = self._holder()
            if etag is None:  # released meanwhile: try again
                continue
            expired = _expired(holder, age_s)
            if not expired and not _dead_here(holder):
                raise StoreLockedError(
                    f"another prepare is writing {self.out_url} ({_describe(holder)}; lock object "
                    f"{self.lock_url}; {_lease_text(holder, age_s)}); wait for it to finish, or, "
                    f"if that run is dead on another host, {_wait_text(holder, age_s)}"
                )
            sent = time.monotonic()
            try:
                self._held(self._put(body, IfMatch=etag), sent)
            except OSError as exc:
                if not refused(exc):
                    raise StoreError(
                        f"cannot take over the lock object {self.lock_url}: {exc}"
                    ) from exc
                continue  # another run took it over first: read the new holder
            why = "its lease expired" if expired else "its process is gone"
            log.warning(
                "took over the lock %s of a dead run (%s; %s)",
                self.lock_url,
                _describe(holder),
                why,
            )
            return
        raise StoreError(f"cannot lock {self.lock_url}: it keeps changing")  # pragma: no cover

    def _held(self, etag: str, sent: float) -> None:
        with self._state:
            self._etag = etag
            self._trusted_until = sent + TRUST * self.lease_s

    def _holder(self) -> tuple[dict[str, Any], str | None, float]:
        """The lock object's holder, ETag and age (seconds since it was last written, by the
        server's clock); ``({}, None, 0)`` when it is gone. The ETag and age come from one
        HEAD, read first: the holder read after it is that version's or a newer one's, so a
        take-over conditional on that ETag never replaces a holder it did not judge."""
        try:
            head = self.fs.call_s3("head_object", Bucket=self.bucket, Key=self.key)
            text = self.fs.cat_file(self.path)
        except FileNotFoundError:
            return {}, None, 0.0
        except OSError as exc:
            raise StoreError(f"cannot read the lock object {self.lock_url}: {exc}") from exc
        try:
            info = json.loads(text)
        except ValueError:
            info = {}
        return (info if isinstance(info, dict) else {}), str(head["ETag"]), _age_s(head)

    def _renew_loop(self) -> None:
        renewals, every = 0, RENEW_EVERY * self.lease_s
        delay = every
        while not self._stop.wait(delay):
            renewals += 1
            with self._state:
                etag = self._etag
            if etag is None:
                return
            sent = time.monotonic()
            try:
                self._held(self._put(self._body(renewals), IfMatch=etag), sent)
                delay = every
            except OSError as exc:
                if refused(exc):
                    self._lose("its renewal was refused: another run took the lock over")
                    return
                log.warning("could not renew the lock %s: %s; trying again", self.lock_url, exc)
                delay = every / 4  # soon: the lease is trusted for 2/3 of it only
            except Exception as exc:  # any other failure: lost, never a silent dead thread
                self._lose(f"its renewal failed: {exc!r}")
                return

    def _lose(self, why: str) -> None:
        with self._state:
            self._lost = why
            self._etag = None
        log.error("lost the lock %s on %s: %s", self.lock_url, self.out_url, why)

    def check(self) -> None:
        """Raise :class:`StoreLockedError` unless this run still holds the lock (it renewed
        it within 2/3 of the lease, and no renewal was refused)."""
        with self._state:
            lost = self._lost
            if lost is None and time.monotonic() > self._trusted_until:
                lost = (
                    f"its lease ({self.lease_s:g} s) was not renewed for {TRUST:.0%} of it, "
                    "so another host may take it over"
                )
        if lost is not None:
            raise StoreLockedError(
                f"this run lost the lock on {self.out_url} ({lost}; lock object "
                f"{self.lock_url}): it stops without publishing. The run holding the lock "
                "now publishes the store; if none does, re-run to resume"
            )

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join()
            self._heartbeat = None
        with self._state:
            etag, self._etag = self._etag, None
        if etag is None:
            return
        try:
            self.fs.call_s3("delete_object", Bucket=self.bucket, Key=self.key, IfMatch=etag)
        except OSError as exc:  # taken over, or the server is gone: leave it
            log.warning("could not remove the lock object %s: %s", self.lock_url, exc)


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


def _age_s(head: dict[str, Any]) -> float:
    """Seconds between the object's last write and the server's answer (both its clock)."""
    try:
        now = parsedate_to_datetime(head["ResponseMetadata"]["HTTPHeaders"]["date"])
        return float((now - head["LastModified"]).total_seconds())
    except (KeyError, TypeError, ValueError):
        return 0.0  # no date: never judged expired


def _expired(holder: dict[str, Any], age_s: float) -> bool:
    """The holder's lease ran out (+1 s: S3's dates are whole seconds); never without one."""
    lease = holder.get("lease_s")
    return isinstance(lease, int | float) and age_s > float(lease) + 1


def _lease_text(holder: dict[str, Any], age_s: float) -> str:
    lease = holder.get("lease_s")
    if not isinstance(lease, int | float):
        return "no lease: it never expires"
    return f"lease {lease:g} s, last renewed {age_s:.0f} s ago"


def _wait_text(holder: dict[str, Any], age_s: float) -> str:
    lease = holder.get("lease_s")
    if not isinstance(lease, int | float):
        return "delete the lock object and re-run"
    left = max(0.0, float(lease) + 1 - age_s)
    return f"re-run once its lease expires (in {left:.0f} s at most)"


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder not recorded"
    return f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')}"
