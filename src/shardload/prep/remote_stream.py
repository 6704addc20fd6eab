"""Uploading a store's finished files while ``prepare`` writes the next blocks (``out: s3://``).

A block's files are *final* once its record is written (data fsynced first): every format
that writes its files in the write tasks (``parallel_write``: Zarr chunks and shards, npy and
Parquet chunk files, npy's variable-length value files) writes each file from exactly one
block (a block is one chunk, or one whole shard), and nothing writes it again. Files under the
staging folders (``_staged/``: HDF5's blocks before its one file is built; ``_ragged/``: Zarr's
and HDF5's variable-length values; ``_progress/``) are not final: they stay local, as do the
files written at publish (metadata, statistics, checksums, the manifest).

:class:`BlockStreamer` puts the final files of each recorded block to their keys (checked by
size and ETag), notes each in ``_progress/uploaded.jsonl`` (fsynced) and only then removes the
local copy. At most :data:`STREAM_BLOCKS` blocks are being uploaded; recording the next one
waits for a free slot, and with it the writers: local disk holds the blocks in flight, not the
store. A killed run's re-run reads the notes: a noted object is not sent again, and the
publish checks it is still there (its size and ETag) before the manifest is put.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shardload.errors import StoreError
from shardload.layout import PROGRESS_DIR, RECORD_NAME, STAGED_DIR
from shardload.util.durable import fsync_dir, write_atomic

log = logging.getLogger("shardload.prep.remote_commit")

#: blocks whose files are being uploaded at once (recording another one waits for a slot)
STREAM_BLOCKS = 4
#: ``_progress/`` file noting each object uploaded and checked, one JSON line each
LEDGER_NAME = "uploaded.jsonl"
#: folders of the local store whose files are not final when their block is recorded
_NOT_FINAL = frozenset({PROGRESS_DIR, STAGED_DIR, "_ragged"})


def final_files(root: Path, paths: Iterable[str]) -> dict[str, Path]:
    """Of the files a block's task wrote (``paths``), those final once it is recorded, by
    their path in the store."""
    out = {}
    for p in paths:
        path = Path(p)
        try:
            rel = path.relative_to(root).as_posix()
        except ValueError:
            continue
        if rel.split("/", 1)[0] not in _NOT_FINAL:
            out[rel] = path
    return out


class BlockStreamer:
    """Uploads the final files of recorded blocks in the background (``put(rel, path)`` puts
    one and returns its checked ETag), then removes their local copies."""

    def __init__(
        self, root: Path, put: Callable[[str, Path], str], *, blocks: int = STREAM_BLOCKS
    ) -> None:
        self.root = Path(root)
        self.ledger = self.root / PROGRESS_DIR / LEDGER_NAME
        self._put = put
        self._slots = threading.BoundedSemaphore(blocks)
        self._pool = ThreadPoolExecutor(blocks, thread_name_prefix="shardload-upload")
        self._lock = threading.Lock()
        self._futures: list[Future[None]] = []
        #: objects uploaded, checked and noted: path in the store -> size, etag, block
        self.uploaded: dict[str, dict[str, Any]] = _read_ledger(self.ledger)
        self._claimed: dict[str, int] = {rel: int(e["block"]) for rel, e in self.uploaded.items()}
        if not self.ledger.exists():  # its name durable before a note in it removes a file
            self.ledger.touch()
            fsync_dir(self.ledger.parent)

    def submit(self, block: int, paths: Iterable[str]) -> None:
        """Upload the final files of ``block`` (just recorded); waits while every slot is busy.
        Raises the error of an earlier upload, if any."""
        self._raise()
        files = final_files(self.root, paths)
        if not files:
            return
        with self._lock:
            for rel in files:
                other = self._claimed.setdefault(rel, block)
                if other != block:  # a format writing one file from two blocks: never stream it
                    raise StoreError(
                        f"{rel} was written by block {other} and again by block {block}; "
                        "it cannot be uploaded once final (a shardload bug: please report it)"
                    )
        self._slots.acquire()
        try:
            fut = self._pool.submit(self._send, block, files)
        except BaseException:
            self._slots.release()
            raise
        fut.add_done_callback(lambda _: self._slots.release())
        with self._lock:
            self._futures.append(fut)

    def _send(self, block: int, files: Mapping[str, Path]) -> None:
        for rel, path in files.items():
            size = path.stat().st_size
            etag = self._put(rel, path)
            entry = {"rel": rel, "size": size, "etag": etag, "block": block}
            with self._lock:
                with open(self.ledger, "a") as f:
                    f.write(json.dumps(entry) + "\n")
                    f.flush()
                    os.fsync(f.fileno())  # noted durably before the only local copy goes
                self.uploaded[rel] = entry
            path.unlink()

    def _raise(self) -> None:
        with self._lock:
            done = [f for f in self._futures if f.done()]
            self._futures = [f for f in self._futures if not f.done()]
        for f in done:
            f.result()

    def drain(self) -> None:
        """Wait for every upload submitted; raise the first error."""
        with self._lock:
            futures, self._futures = self._futures, []
        for f in futures:
            f.result()

    def close(self) -> None:
        """Stop: uploads not started are dropped, those running finish (a re-run resumes)."""
        self._pool.shutdown(wait=True, cancel_futures=True)

    def forget(self, rels: Iterable[str], progress: Path) -> list[int]:
        """Drop the notes of ``rels`` and the records of the blocks that wrote them (their
        objects are gone and so are their local copies: a re-run writes those blocks again);
        the blocks."""
        rels = set(rels)
        blocks = sorted({int(self.uploaded[r]["block"]) for r in rels if r in self.uploaded})
        for b in blocks:
            (progress / RECORD_NAME.format(b)).unlink(missing_ok=True)
        keep = [e for r, e in self.uploaded.items() if int(e["block"]) not in blocks]
        write_atomic(self.ledger, "".join(json.dumps(e) + "\n" for e in keep).encode())
        return blocks


def _read_ledger(path: Path) -> dict[str, dict[str, Any]]:
    """The notes of an earlier run (a torn last line, from a kill, is skipped: its file was
    not removed yet)."""
    out: dict[str, dict[str, Any]] = {}
    try:
        text = path.read_text()
    except FileNotFoundError:
        return out
    for line in text.splitlines():
        try:
            e = json.loads(line)
            out[str(e["rel"])] = {
                "rel": str(e["rel"]),
                "size": int(e["size"]),
                "etag": str(e["etag"]),
                "block": int(e["block"]),
            }
        except (ValueError, KeyError, TypeError):
            log.warning("skipping a torn line of %s", path)
    return out
