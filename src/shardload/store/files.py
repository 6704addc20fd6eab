"""A store's small files, read through the store's own filesystem: the manifest (by URL with
the checksum file, at once: :func:`read_manifest`) and the manifest's feature files
(:class:`StoreFiles`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardload.errors import StoreError
from shardload.formats.base import is_local
from shardload.layout import CHECKSUMS_NAME, MANIFEST_NAME

#: A checksum file fetched with the manifest goes with the Store into DataLoader workers (each
#: then needs no request for it) when it is at most this large.
CARRY_BYTES = 1 << 20


def read_manifest(fs: Any, root: str, *, sums: bool = False) -> tuple[bytes | None, bytes | None]:
    """The manifest's bytes (None: there is none), and by URL with ``sums`` the checksum
    file's, fetched together (its name needs no manifest: one round trip for both, not one
    more at the first chunk's check); None where it could not be read (the reader fetches it
    again when it needs it, and reports what went wrong then)."""
    path = f"{root}/{MANIFEST_NAME}"
    if is_local(fs):
        try:
            return Path(path).read_bytes(), None
        except (FileNotFoundError, NotADirectoryError):
            return None, None
        except OSError as exc:  # EIO: a damaged disk or SquashFS image
            raise StoreError(f"the manifest {path} could not be read: {exc}") from exc
    from shardload.move.remote import read_many

    extra = f"{root}/{CHECKSUMS_NAME}"
    what = {path: "the manifest", extra: "the checksum file"}
    got = read_many(fs, [path, extra] if sums else [path], what=what)
    text = got[path]
    if isinstance(text, FileNotFoundError):
        return None, None
    if isinstance(text, BaseException):
        raise text
    found = got.get(extra)
    return text, found if isinstance(found, bytes) else None


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
