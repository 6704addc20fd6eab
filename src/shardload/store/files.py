"""A store's small files (the manifest's feature files), read through the store's own
filesystem: :class:`StoreFiles`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardload.formats.base import is_local


class StoreFiles:
    """Reads a store's small files (the manifest's feature files) through the store's own
    filesystem -- local, or the remote one with its retries and cache. Picklable."""

    def __init__(self, fs: Any, root: str, *, url: str) -> None:
        self.fs, self.root, self.url = fs, root, url

    def __call__(self, rel: str) -> bytes:
        path = f"{self.root}/{rel}"
        if is_local(self.fs):
            return Path(path).read_bytes()
        from shardload.move.remote import read_bytes

        return read_bytes(self.fs, path, what=f"{rel} of {self.url}")
