"""A store's small files, read through the store's own filesystem: the manifest (by URL with
the checksum file, at once: :func:`read_manifest`) and the manifest's feature files
(:class:`StoreFiles`), and the arrays' metadata a reader carries to a DataLoader worker's
(:func:`metadata_to_carry`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from shardload.errors import StoreError
from shardload.formats.base import CarriesMetadata, is_local
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


def metadata_to_carry(reader: Any) -> dict[str, bytes] | None:
    """The arrays' metadata files ``reader`` fetched and checked by URL (``{path: bytes}``,
    at most ``CARRY_BYTES``: each array's ``zarr.json``, an npy stack's last chunk headers),
    for a reader of the same store in another process (:class:`CarriesMetadata`), or None.

    A Store hands them on only with the checksum file it fetched with the manifest: the
    manifest, the checksums and the metadata are then of one reading of the store; the worker
    checks the metadata against the manifest again, and every stored file it reads against
    those checksums before its rows are used (npy: the file whole, header included; Zarr: each
    chunk or shard file), so a store rewritten since is a checksum error, never values read
    through another version's metadata. Without them (``verify="never"``, no checksums, a
    checksum file over ``CARRY_BYTES``) each worker fetches and checks its own."""
    if not isinstance(reader, CarriesMetadata):
        return None
    got = reader.carried_metadata()
    return got if got and sum(map(len, got.values())) <= CARRY_BYTES else None


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
