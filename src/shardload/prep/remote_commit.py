"""The commit protocol for a store written to an object store (``out: s3://bucket/store``).

S3 has no rename, no ``flock`` and no partial folder a reader would skip, so the blocks are
written as on disk into a local folder (``$SHARDLOAD_HOME/uploads/<hash of the URL>/``, the
whole :class:`~shardload.prep.commit.BlockCommit` protocol: progress records, resume, fsync),
and uploaded from there (docs/design.md, "Writing a store to S3"):

1. the lock: ``OUT.partial.lock`` beside the store, created by a conditional put and renewed
   as a lease (:class:`~shardload.prep.remote_lock.ObjectLock`), held for the whole run;
2. ``OUT/_progress/upload.json`` marks the prefix as being written (``open_store`` calls such a
   prefix interrupted) before the first object (and, with ``overwrite``, before the old
   manifest is deleted), and lets a re-run remove what an earlier run left there; a prefix
   holding other objects and no such mark is refused without ``overwrite``;
3. as each block is recorded, its final files are put (checked: size, and the ETag against
   the file's MD5, or where the ETag is not an MD5 -- SSE-KMS, SSE-C -- the bytes read back)
   and their local copies removed
   (:class:`~shardload.prep.remote_stream.BlockStreamer`): local disk holds the blocks in
   flight, not the store;
4. at publish, every other file of the local store but the manifest is uploaded (a re-run
   skips the objects already there with the local file's size and MD5), and objects under
   the prefix that are not files of the store are removed;
5. a listing checks that every object is there with its size (and the streamed ones with
   their ETag); then the manifest (``shardload.json``) is put, checked, and the mark removed.
   Only then is it a store.

A killed run leaves the local folder (its records and its notes of the objects streamed) and
objects under the prefix but no manifest; the same command resumes: blocks already recorded
are not written again, objects already uploaded are not sent again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, BinaryIO

from shardload.errors import (
    ConfigError,
    ShardloadError,
    StoreError,
    StoreExistsError,
    require,
)
from shardload.layout import LOCK_SUFFIX, MANIFEST_NAME, PROGRESS_DIR, STAGED_DIR
from shardload.prep.commit import THROTTLE_ENV, BlockCommit
from shardload.prep.remote_lock import ObjectLock
from shardload.prep.remote_stream import BlockStreamer
from shardload.util.durable import fsync_dir, fsync_tree, write_atomic
from shardload.util.home import home_dir

log = logging.getLogger(__name__)

#: the object marking a prefix as being written by prepare (inside the prefix)
UPLOAD_MARK = f"{PROGRESS_DIR}/upload.json"
#: the object stores prepare writes to (a conditional put is S3's)
WRITABLE_SCHEMES = ("s3", "s3a")
#: uploads in flight
UPLOAD_THREADS = 8
#: s3fs's multipart part size (puts of files from twice this size on are multipart)
PART_BYTES = 50 * 2**20


def check_out_url(url: str) -> None:
    """A ``ConfigError`` naming ``out`` when prepare cannot write to ``url``."""
    scheme = url.split("://", 1)[0].lower()
    if scheme not in WRITABLE_SCHEMES:
        raise ConfigError(
            f"out: {url}: prepare writes to a local folder or to s3:// (S3 and S3-compatible "
            f"storage), not to {scheme}://"
        )
    if not url.split("://", 1)[1].strip("/").count("/"):
        raise ConfigError(f"out: {url}: name a prefix inside the bucket (s3://bucket/store)")


def local_out(url: str) -> Path:
    """Where the store for ``url`` is written before its upload (one folder per URL)."""
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    return home_dir() / "uploads" / digest / url.rstrip("/").rsplit("/", 1)[-1]


class RemoteCommit(BlockCommit):
    """:class:`BlockCommit` into a local folder, published by an upload to ``url``."""

    def __init__(
        self,
        url: str,
        *,
        storage_options: Mapping[str, Any] | None = None,
        fingerprint: str,
        num_blocks: int,
        overwrite: bool = False,
        describe: Mapping[str, Any] | None = None,
    ) -> None:
        from fsspec.core import url_to_fs

        check_out_url(url)
        require("s3fs", "remote")  # an error naming the extra, not fsspec's ImportError
        self.url = url.rstrip("/")
        super().__init__(
            local_out(self.url),
            fingerprint=fingerprint,
            num_blocks=num_blocks,
            overwrite=overwrite,
            describe=describe,
        )
        self.fs, prefix = url_to_fs(
            self.url, skip_instance_cache=True, **dict(storage_options or {})
        )
        self.prefix = prefix.rstrip("/")
        self._remote_lock = ObjectLock(
            self.fs,
            self.prefix + LOCK_SUFFIX,
            out_url=self.url,
            lock_url=self.url + LOCK_SUFFIX,
        )
        self._streamer: BlockStreamer | None = None
        self._warned_read_back = False

    def __enter__(self) -> RemoteCommit:
        try:
            self.check_out()
            self._remote_lock.acquire()
        except OSError as exc:  # credentials, endpoint, bucket: before anything is written
            if isinstance(exc, ShardloadError):
                raise
            raise StoreError(f"cannot write to {self.url}: {exc!r}") from exc
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            self._lock.acquire()  # the local folder's lock too (same URL, same folder)
            self.check_out()
        except BaseException:
            self._lock.release()
            self._remote_lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self._streamer is not None:
                self._streamer.close()
        finally:
            self._lock.release()
            self._remote_lock.release()

    def start(self, create: Callable[[Path], Any]) -> frozenset[int]:
        """The local folder started or resumed; the prefix marked as being written (the old
        manifest deleted with ``overwrite``) before any object is streamed."""
        done = super().start(create)
        self._begin()
        self._streamer = BlockStreamer(self.root, self._put_checked)
        return done

    def recorded_files(self, block: int, files: Sequence[str]) -> None:
        """Upload the final files of ``block`` (just recorded) in the background; waits while
        :data:`~shardload.prep.remote_stream.STREAM_BLOCKS` blocks are being uploaded."""
        self._remote_lock.check()
        if self._streamer is not None:
            self._streamer.submit(block, files)

    def check_out(self) -> None:
        if self.overwrite:
            return
        if self._exists(MANIFEST_NAME):
            raise StoreExistsError(
                f"output {self.url} exists (it has a {MANIFEST_NAME}); pass --overwrite "
                "(overwrite: true) to replace it"
            )
        if not self._exists(UPLOAD_MARK) and self._listing():
            raise StoreExistsError(
                f"output {self.url} holds objects but no shardload store; pick another prefix, "
                "delete them, or pass --overwrite (overwrite: true) to replace them"
            )

    def _exists(self, rel: str) -> bool:
        path = f"{self.prefix}/{rel}"
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def _listing(self) -> dict[str, dict[str, Any]]:
        """The objects under the prefix: path relative to it -> s3fs info."""
        self.fs.invalidate_cache(self.prefix)
        try:
            found = self.fs.find(self.prefix, detail=True)
        except FileNotFoundError:
            return {}
        n = len(self.prefix) + 1
        return {p[n:]: info for p, info in found.items() if p.startswith(self.prefix + "/")}

    def publish(self, files: Mapping[str, bytes | Callable[[BinaryIO], object]]) -> None:
        """The store finished locally (``files`` written last, as on disk), then uploaded:
        every object checked, the manifest put last; then the local folder removed."""
        shutil.rmtree(self.root / STAGED_DIR, ignore_errors=True)
        fsync_tree(self.root, skip=self.synced)
        for rel, data in files.items():
            path = self.root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(path, data)
            fsync_dir(path.parent)
        self._upload()
        shutil.rmtree(self.out.parent, ignore_errors=True)

    def _begin(self) -> None:
        if not self.overwrite and self._exists(MANIFEST_NAME):
            raise StoreExistsError(
                f"output {self.url} appeared while this run was writing; the store written so "
                f"far stays in {self.root} (pass overwrite: true to replace {self.url})"
            )
        # the mark first: from here to the manifest's put, a reader of the prefix is told it is
        # being written (without either, the store's root zarr.json reads as plain Zarr data)
        mark = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.ctime()}
        self.fs.pipe_file(f"{self.prefix}/{UPLOAD_MARK}", json.dumps(mark).encode())
        if self.overwrite and self._exists(MANIFEST_NAME):
            self.fs.rm_file(f"{self.prefix}/{MANIFEST_NAME}")  # not a store from here on

    def _upload(self) -> None:
        streamer = self._streamer
        if streamer is None:  # pragma: no cover -- publish always follows start
            raise StoreError(f"{self.url}: publish before start")
        streamer.drain()  # every block's files up, or the first error
        self._remote_lock.check()
        local = _local_files(self.root)
        manifest = local.pop(MANIFEST_NAME)
        streamed = {rel: e for rel, e in streamer.uploaded.items() if rel not in local}
        self._begin()
        remote = self._listing()
        stale = [
            rel for rel in remote if rel not in local and rel not in streamed and rel != UPLOAD_MARK
        ]
        if stale:
            log.info(
                "removing %d object(s) under %s that are not in the store", len(stale), self.url
            )
            self.fs.rm([f"{self.prefix}/{rel}" for rel in stale])
        todo = [rel for rel in sorted(local) if not _same(remote.get(rel), local[rel])]
        log.info(
            "uploading %s: %d of %d object(s) to send (%d sent while writing)",
            self.url,
            len(todo),
            len(local) + len(streamed) + 1,
            len(streamed),
        )
        with ThreadPoolExecutor(UPLOAD_THREADS) as pool:
            list(pool.map(lambda rel: self._put_checked(rel, local[rel]), todo))
        remote = self._listing()
        for rel, path in local.items():
            size = remote.get(rel, {}).get("size")
            if size != path.stat().st_size:
                raise StoreError(
                    f"object {self.url}/{rel} is missing or has the wrong size ({size} bytes, "
                    f"expected {path.stat().st_size}) after its upload; re-run to resume"
                )
        self._check_streamed(streamer, streamed, remote)
        self._put_checked(MANIFEST_NAME, manifest)
        self.fs.rm_file(f"{self.prefix}/{UPLOAD_MARK}")

    def _check_streamed(
        self,
        streamer: BlockStreamer,
        streamed: Mapping[str, Mapping[str, Any]],
        remote: Mapping[str, Mapping[str, Any]],
    ) -> None:
        """Every object streamed while writing is still there, as uploaded (its local copy is
        gone: a missing one means its block is written again by the next run)."""
        bad = [
            rel
            for rel, e in streamed.items()
            if remote.get(rel, {}).get("size") != e["size"]
            or str(remote[rel].get("ETag", e["etag"])).strip('"') != e["etag"]
        ]
        if bad:
            blocks = streamer.forget(bad, self.progress)
            raise StoreError(
                f"object {self.url}/{bad[0]} (and {len(bad) - 1} more) is missing or changed "
                f"since it was uploaded and checked while writing; its local copy was removed "
                f"then, so re-run: block(s) {blocks[:10]} are written and uploaded again"
            )

    def _put_checked(self, rel: str, path: Path) -> str:
        """Put one file and check the object: its size, and its ETag against the file's MD5;
        where they differ, its bytes read back against the file's (buckets encrypted with
        SSE-KMS or SSE-C give ETags that are not MD5s). The object's ETag."""
        key = f"{self.prefix}/{rel}"
        time.sleep(float(os.environ.get(THROTTLE_ENV) or 0))  # testing aid (kill tests)
        self._remote_lock.check()  # a run that lost its lock writes nothing more
        size, want = path.stat().st_size, _etag(path)
        self.fs.put_file(str(path), key, chunksize=PART_BYTES)
        self.fs.invalidate_cache(key)
        info = self.fs.info(key)
        got = str(info.get("ETag", "")).strip('"')
        if info.get("size") == size and (got == want or self._read_back_equal(key, path)):
            return got
        raise StoreError(
            f"object {self.url}/{rel} differs from {path} after its upload (size "
            f"{info.get('size')} for {size} bytes, ETag {info.get('ETag')} for {want}, and its "
            "bytes read back differ); re-run to resume"
        )

    def _read_back_equal(self, key: str, path: Path) -> bool:
        """The object ``key`` holds the bytes of ``path``, read back part by part (used where
        its ETag is not the file's MD5: an encrypted bucket's, or a damaged object)."""
        with self.fs.open(key, "rb", block_size=PART_BYTES) as remote, open(path, "rb") as f:
            while True:
                a, b = f.read(PART_BYTES), remote.read(PART_BYTES)
                if a != b:
                    return False
                if not a:
                    break
        if not self._warned_read_back:
            self._warned_read_back = True
            log.warning(
                "the ETags of %s are not the MD5s of the objects' bytes (a bucket encrypted "
                "with SSE-KMS or SSE-C, or a server that does not use MD5s): each object is "
                "checked by reading it back after its upload, one more download per object",
                self.url,
            )
        return True


def _local_files(root: Path) -> dict[str, Path]:
    """The files of the local store by their path in it (progress records left out)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and rel.split("/", 1)[0] not in (PROGRESS_DIR, STAGED_DIR):
            out[rel] = p
    return out


def _same(info: Mapping[str, Any] | None, path: Path) -> bool:
    """The object ``info`` holds the bytes of ``path``: same size and ETag (S3's MD5)."""
    if not info or info.get("size") != path.stat().st_size:
        return False
    return str(info.get("ETag", "")).strip('"') == _etag(path)


def _etag(path: Path) -> str:
    """S3's ETag of ``path`` as s3fs uploads it: the MD5, or for a multipart put the MD5 of
    the parts' MD5s and the number of parts."""
    size = path.stat().st_size
    parts = []
    with open(path, "rb") as f:
        while block := f.read(PART_BYTES):
            parts.append(hashlib.md5(block, usedforsecurity=False).digest())
    if size < 2 * PART_BYTES:
        return parts[0].hex() if parts else hashlib.md5(b"", usedforsecurity=False).hexdigest()
    return f"{hashlib.md5(b''.join(parts), usedforsecurity=False).hexdigest()}-{len(parts)}"
