"""Retries of remote reads: which errors are transient, exponential backoff with jitter, and
the read options' defaults (``SHARDLOAD_RETRIES``, ``SHARDLOAD_RETRY_BACKOFF_S``,
``SHARDLOAD_TIMEOUT_S``)."""

from __future__ import annotations

import logging
import os
import random
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from shardload.errors import RemoteError, RemoteNotFoundError

log = logging.getLogger("shardload.remote")

T = TypeVar("T")
_DEFAULTS = {"retries": 5, "backoff_s": 0.25, "timeout_s": 30.0}
_ENV = {
    "retries": "SHARDLOAD_RETRIES",
    "backoff_s": "SHARDLOAD_RETRY_BACKOFF_S",
    "timeout_s": "SHARDLOAD_TIMEOUT_S",
}


_STOP = threading.local()


@contextmanager
def stop_on(event: threading.Event | None) -> Iterator[None]:
    """Retries in this thread meanwhile end once ``event`` is set: the loader's pool sets it
    when its iterator closes (``load/pool.py``), so a read nobody waits for any more gives up
    instead of retrying a gone server for seconds. Threads a read starts pass it on
    (:func:`current_stop`)."""
    prev = getattr(_STOP, "event", None)
    _STOP.event = event
    try:
        yield
    finally:
        _STOP.event = prev


def current_stop() -> threading.Event | None:
    """The event that ends this thread's retries (:func:`stop_on`), if any."""
    return getattr(_STOP, "event", None)


def default_option(name: str) -> float:
    """A read option's default: its environment variable, else the built-in value."""
    raw = os.environ.get(_ENV[name])
    if raw is None or raw.strip() == "":
        return _DEFAULTS[name]
    try:
        value = float(raw)
    except ValueError:
        from shardload.errors import ConfigError

        raise ConfigError(f"{_ENV[name]}={raw!r} is not a number") from None
    return int(value) if name == "retries" else value


def is_transient(exc: BaseException) -> bool:
    """Errors worth retrying: connection problems, timeouts, 5xx/408/429, other OSErrors."""
    try:
        import aiohttp
    except ImportError:  # pragma: no cover - aiohttp is only needed for HTTP
        aiohttp = None  # type: ignore[assignment]
    if aiohttp is not None and isinstance(exc, aiohttp.ClientResponseError):
        return exc.status >= 500 or exc.status in (408, 429)
    if aiohttp is not None and isinstance(exc, aiohttp.ClientSSLError):
        return False  # an untrusted certificate stays untrusted: say so at once
    if isinstance(exc, (FileNotFoundError, PermissionError, IsADirectoryError)):
        return False
    if _is_ssl(exc):
        return False
    status = _status(exc)  # (``move.http_get.HTTPStatusError``, an OSError, as aiohttp's)
    if isinstance(status, int):
        return status >= 500 or status in (408, 429)
    if aiohttp is not None and isinstance(exc, aiohttp.ClientError):
        return True
    return isinstance(exc, (OSError, TimeoutError, ConnectionError))


def _unmask(exc: Exception) -> Exception:
    """The transient error behind a FileNotFoundError (fsspec's HTTP ``info`` turns a refused
    connection into FileNotFoundError: that is not a missing file)."""
    cause = exc.__cause__ or exc.__context__
    if (
        isinstance(exc, FileNotFoundError)
        and isinstance(cause, Exception)
        and (is_transient(cause) or _status(cause) in (401, 403) or _is_ssl(cause))
    ):
        return cause  # a refused token or certificate is not a missing file either
    return exc


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def _is_ssl(exc: BaseException) -> bool:
    """A certificate refused (aiohttp's error, or ``ssl``'s from ``move/http_get.py``)."""
    import ssl

    if isinstance(exc, ssl.SSLCertVerificationError):
        return True
    try:
        from aiohttp import ClientSSLError
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, ClientSSLError)


def _hint(exc: BaseException) -> str:
    """What to do about a refused token or an untrusted certificate."""
    if _status(exc) == 401:
        return (
            " (the server wants a bearer token: set SHARDLOAD_TOKEN, or storage_options="
            "{'headers': {'Authorization': 'Bearer TOKEN'}})"
        )
    if _is_ssl(exc):
        return (
            " (to trust the server's own certificate: SHARDLOAD_CA_FILE=cert.pem, or "
            "storage_options={'ca_file': 'cert.pem'})"
        )
    return ""


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


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
    stop = current_stop()
    for attempt in range(retries + 1):
        try:
            return func()
        except Exception as exc:
            if on_error is not None:
                on_error()
            if isinstance(exc, RemoteError):
                raise  # already described (a nested read)
            exc = _unmask(exc)
            status = getattr(exc, "status", None)
            if isinstance(exc, FileNotFoundError) or status == 404:
                raise RemoteNotFoundError(f"{_describe(url, what)}: not found") from exc
            if not is_transient(exc):
                raise RemoteError(
                    f"cannot read {_describe(url, what)}: {_short(exc)}{_hint(exc)}"
                ) from exc
            if stop is not None and stop.is_set():
                raise RemoteError(
                    f"cannot read {_describe(url, what)}: {_short(exc)} (not retried: the "
                    "reader was closed)"
                ) from exc
            if attempt == retries:
                raise RemoteError(
                    f"cannot read {_describe(url, what)} after {retries + 1} attempts: {_short(exc)}"
                ) from exc
            delay = backoff_s * 2**attempt * (0.5 + random.random())
            log.warning(
                "reading %s failed (%s); retry %d/%d in %.2fs",
                _describe(url, what),
                _short(exc),
                attempt + 1,
                retries,
                delay,
            )
            if stop is None:
                time.sleep(delay)
            elif stop.wait(delay):  # closed meanwhile: nobody wants these bytes any more
                raise RemoteError(
                    f"cannot read {_describe(url, what)}: {_short(exc)} (not retried: the "
                    "reader was closed)"
                ) from exc
    raise AssertionError("unreachable")  # pragma: no cover
