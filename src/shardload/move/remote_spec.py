"""What (re)opens a store's filesystem by URL in any process: :class:`RemoteSpec` (picklable).

Apart from :mod:`.remote`, whose filesystem holds one, so that the spec's fields are all a
process reading only node cache copies needs: fsspec is imported by :meth:`RemoteSpec.open_target`,
at the first call that needs the URL's filesystem.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardload.move.http_client import http_options, is_http


@dataclass(frozen=True)
class RemoteSpec:
    """Everything needed to (re)open a store's filesystem, in any process (picklable).

    Attributes
    ----------
    url : str
        The store's URL.
    storage_options : mapping
        Passed to fsspec (credentials, endpoint...).
    cache_dir, cache_bytes
        Cache whole files in ``cache_dir``, at most ``cache_bytes`` (None: no cache / no bound).
    retries, backoff_s, timeout_s
        Attempts after the first for transient errors; first retry delay (doubled each time,
        +-50% jitter); HTTP connect and read-stall timeout.
    """

    url: str
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    cache_dir: str | None = None
    cache_bytes: int | None = None
    retries: int = 5
    backoff_s: float = 0.25
    timeout_s: float = 30.0

    def open_target(self) -> tuple[Any, str]:
        """fsspec's own filesystem for the URL (a private instance) and the root path on it."""
        from fsspec.core import url_to_fs

        opts = dict(self.storage_options)
        if is_http(self.url):  # timeouts, the token, a CA file: move/http_client.py
            opts = http_options(opts, self.timeout_s)
        # a private instance: a dead server's session is not shared with later calls
        fs, root = url_to_fs(self.url, skip_instance_cache=True, **opts)
        return fs, root.rstrip("/")
