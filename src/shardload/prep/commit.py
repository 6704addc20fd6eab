"""The commit protocol: how a writer turns N blocks into a published store, crash-safe.

Every writer (``prepare`` today, a block-wise compute engine tomorrow) goes through
:class:`BlockCommit`::

    with BlockCommit(out, fingerprint=fp, num_blocks=n, overwrite=False) as commit:
        commit.start(create=lambda root: fmt.create(root, ...))   # fresh or resumed
        for i in commit.todo():                                     # recorded blocks skipped
            write_block_durably(fmt, commit.root, ...)              # data on disk first,
            commit.record(i, {"x/mean": ..., ...})                  # then the block's record
        fields = [commit.read_record(i) for i in range(n)]
        commit.finish_format(fmt, ...)                              # merge staged blocks
        commit.publish({"shardload.json": manifest_bytes})          # atomically, once

The rules (docs/design.md, "Writing a store"):

- Everything is written under ``OUT.partial/``; ``OUT`` appears only by one rename, after the
  manifest (``complete: true``) and every file under it are fsynced.
- ``OUT.partial.lock`` is ``flock``-ed for the whole run: a second writer of the same ``OUT`` is
  refused with an error naming the holder (pid, host, start time). The kernel drops the lock when
  the holder dies, whatever kills it.
- A block's data is durable (written, fsynced) before its progress record
  (``_progress/block-NNNNNN.npz``) is written atomically; a resumed run skips recorded blocks and
  redoes the others. A record is a set of named arrays (statistics partials, checksums, ...).
- Formats that cannot make one block durable on its own (``parallel_write = False``: one HDF5
  file, whose library state is lost or corrupt after ``kill -9``) write each block to a staging
  file (``_staged/``, npy, fsynced); the format's file is built from them in one pass before
  publishing, from scratch whenever that pass was interrupted.
- An existing ``OUT`` is replaced only with ``overwrite``.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from shardload.errors import StoreError, StoreExistsError
from shardload.layout import (
    JOB_FILE,
    MERGED_FILE,
    PROGRESS_DIR,
    RECORD_NAME,
    STAGED_DIR,
)
from shardload.prep.disk import os_error, partial_path
from shardload.prep.lock import OutputLock
from shardload.util.durable import (
    collect_written,
    fsync_all,
    fsync_dir,
    fsync_tree,
    remove_temporaries,
    write_atomic,
    write_temporary,
)

log = logging.getLogger(__name__)

#: Testing aid: seconds to sleep per block in write tasks and in the staging merge.
THROTTLE_ENV = "SHARDLOAD_THROTTLE_S"


# -- writing one block --------------------------------------------------------------------------
def staged_path(root: Path, block: int, name: str) -> Path:
    return Path(root) / STAGED_DIR / f"{name}.{block:06d}.npy"


def write_block_durably(
    fmt: Any,
    root: str | Path,
    block: int,
    name: str,
    chunk: int,
    start: int,
    data: np.ndarray,
    *,
    bounds: Sequence[int],
) -> dict[int, int] | None:
    """Write one block of one array so that it survives a crash once this returns; the
    format's checksums of what it wrote (None for a staged block).

    ``parallel_write`` formats write (and fsync) their own files; the others get a staging file
    that :meth:`BlockCommit.finish_format` merges. Runs in any worker (no lock, no state).
    """
    if fmt.parallel_write:
        return fmt.write_block(Path(root), name, chunk, start, data, bounds=bounds)  # type: ignore[no-any-return]
    array = np.ascontiguousarray(data)
    write_atomic(
        staged_path(Path(root), block, name), lambda f: _write_npy(f, array), deferrable=True
    )
    return None


def _write_npy(f: Any, array: np.ndarray) -> None:
    """``np.save`` of a C-contiguous array through the file's own ``write``: numpy's
    ``tofile`` turns a full disk into ``OSError: N requested and M written`` (no errno), where
    ``write`` raises ``ENOSPC``, which the run reports as a full disk (DiskFullError)."""
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(array.reshape(-1).view(np.uint8).data)


# -- the protocol -------------------------------------------------------------------------------
class BlockCommit:
    """One run writing ``num_blocks`` blocks into ``OUT.partial`` and publishing ``OUT``.

    Use as a context manager: entering takes the lock (:class:`StoreLockedError` when another
    run holds it) and refuses an existing ``OUT`` without ``overwrite``
    (:class:`StoreExistsError`); leaving releases the lock, also on errors.
    """

    def __init__(
        self,
        out: str | os.PathLike[str],
        *,
        fingerprint: str,
        num_blocks: int,
        overwrite: bool = False,
        describe: Mapping[str, Any] | None = None,
    ) -> None:
        self.out = Path(out)
        self.root = partial_path(self.out)
        self.fingerprint = fingerprint
        self.num_blocks = int(num_blocks)
        self.overwrite = bool(overwrite)
        self.describe = dict(describe or {})
        self.progress = self.root / PROGRESS_DIR
        self.done: frozenset[int] = frozenset()
        #: files known to be fsynced (by their task or a DurableRecorder): publish skips them
        self.synced: set[str] = set()
        #: what a fresh :meth:`start` wrote, fsynced before the first record (job.json, folders)
        self._unsynced_start: list[Path] = []
        self._lock = OutputLock(self.out)

    def __enter__(self) -> BlockCommit:
        self.check_out()
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._lock.acquire()
        try:
            self.check_out()  # again, under the lock: a run that just finished published it
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def check_out(self) -> None:
        if self.out.exists() and not self.overwrite:
            raise StoreExistsError(
                f"output {self.out} exists; pass --overwrite (overwrite: true) to replace it"
            )

    # -- start / resume -------------------------------------------------------------------------
    def start(self, create: Callable[[Path], Any]) -> frozenset[int]:
        """Resume ``OUT.partial`` when it belongs to this fingerprint (the blocks it recorded
        are done), else start it afresh and call ``create(root)``. Returns the done blocks."""
        job_file = self.progress / JOB_FILE
        if self.root.exists():
            try:
                old = json.loads(job_file.read_text())["fingerprint"]
            except (OSError, ValueError, KeyError, TypeError):
                old = None
            if old == self.fingerprint:
                self.done = self.recorded()
                removed = remove_temporaries(self.root)
                if removed:
                    log.info(
                        "removed %d temporary file(s) a killed run left in %s", removed, self.root
                    )
                return self.done
            log.warning("%s is from another config or source; restarting it", self.root)
            shutil.rmtree(self.root)
        try:
            (self.root / STAGED_DIR).mkdir(parents=True)
            self.progress.mkdir()
            create(self.root)
            with collect_written(defer=True):  # fsynced before the first record, not here
                write_atomic(
                    job_file,
                    json.dumps(
                        {"fingerprint": self.fingerprint, **self.describe}, default=str
                    ).encode(),
                    deferrable=True,
                )
        except OSError as exc:
            raise os_error(exc, f"cannot create {self.root}") from exc
        # a fresh start is worth resuming only once a block is recorded: until then a crash
        # that loses job.json costs nothing (the next run starts afresh), so its fsync and the
        # folders' wait for the first record (in the recorder's thread, while tasks run)
        self._unsynced_start = [job_file, self.progress, self.root]
        self.done = frozenset()
        return self.done

    def recorded(self) -> frozenset[int]:
        """The blocks with a progress record on disk."""
        done = set()
        for p in self.progress.glob("block-*.npz"):
            try:
                i = int(p.stem.split("-")[1])
            except (IndexError, ValueError):
                continue
            if 0 <= i < self.num_blocks:
                done.add(i)
        return frozenset(done)

    def todo(self) -> list[int]:
        return [i for i in range(self.num_blocks) if i not in self.done]

    # -- records --------------------------------------------------------------------------------
    def record_path(self, block: int) -> Path:
        return self.progress / RECORD_NAME.format(block)

    def record(self, block: int, fields: Mapping[str, np.ndarray]) -> None:
        """Mark ``block`` done with its named arrays; call only once its data is durable."""
        if self._unsynced_start:  # the first record: what start wrote is durable before it
            job_file, *folders = self._unsynced_start
            fsync_all([job_file], folders=folders)
            self._unsynced_start = []
        buf = io.BytesIO()
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in fields.items()}
        np.savez(buf, **arrays)
        write_atomic(self.record_path(block), buf.getvalue())

    def recorded_files(self, block: int, files: Sequence[str]) -> None:
        """``block`` was recorded; ``files`` are those its task wrote. Nothing to do on disk (a
        commit uploading the store puts the final ones, :mod:`~shardload.prep.remote_commit`)."""

    def write_state(self, name: str, fields: Mapping[str, np.ndarray]) -> None:
        """Save the writer's own state (named arrays, e.g. statistics merged so far) as
        ``_progress/NAME.npz``, atomically; it lives and dies with the progress records."""
        buf = io.BytesIO()
        arrays: dict[str, Any] = {k: np.asarray(v) for k, v in fields.items()}
        np.savez(buf, **arrays)
        write_atomic(self.progress / f"{name}.npz", buf.getvalue())

    def read_state(self, name: str) -> dict[str, np.ndarray] | None:
        """What :meth:`write_state` saved under ``name``; None when there is none (or it cannot
        be read: it is written atomically, so only a foreign file can be unreadable)."""
        try:
            with np.load(self.progress / f"{name}.npz") as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, KeyError) as exc:
            if not isinstance(exc, FileNotFoundError):
                log.warning("ignoring the unreadable %s state in %s: %s", name, self.progress, exc)
            return None

    def read_record(self, block: int) -> dict[str, np.ndarray]:
        path = self.record_path(block)
        try:
            with np.load(path) as z:
                return {k: z[k] for k in z.files}
        except (OSError, ValueError, KeyError) as exc:
            raise StoreError(f"block {block} has no valid progress record ({path}): {exc}") from exc

    # -- publish --------------------------------------------------------------------------------
    def finish_format(
        self,
        fmt: Any,
        create: Callable[[Path], Any],
        blocks: Iterable[tuple[int, int, int]],
        names: Sequence[str],
        *,
        bounds: Sequence[int],
    ) -> None:
        """Close the format's writer; for staging formats, first build its file(s) from the
        staged blocks ``(block, chunk, start)``: from scratch (``create``), then fsynced, then
        marked merged, then the staging files removed."""
        if fmt.parallel_write:
            fmt.finish(self.root)
            return
        marker = self.progress / MERGED_FILE
        if marker.exists():
            return
        create(self.root)
        try:
            throttle_s = float(os.environ.get(THROTTLE_ENV) or 0)  # testing aid (crash tests)
            for block, chunk, start in blocks:
                time.sleep(throttle_s)
                for name in names:
                    data = np.load(staged_path(self.root, block, name), mmap_mode="r")
                    fmt.write_block(self.root, name, chunk, start, data, bounds=bounds)
        finally:
            fmt.finish(self.root)
        fsync_tree(self.root, skip=self.synced)
        write_atomic(marker, b"{}")
        shutil.rmtree(self.root / STAGED_DIR, ignore_errors=True)

    def publish(self, files: Mapping[str, bytes | Callable[[BinaryIO], object]]) -> None:
        """Write ``files`` (path relative to the store root: bytes, or a function writing into
        the open file, as :func:`write_atomic` takes), fsync them with the whole tree in one
        pass, the last under its temporary name, renamed into place after the pass; then rename
        ``OUT.partial`` to ``OUT``. The last file is the one that makes the store complete (the
        manifest).

        An existing ``OUT`` is moved aside and deleted only with ``overwrite``; the progress
        records are removed after the rename (a crash between leaves a harmless ``_progress``).
        """
        shutil.rmtree(self.root / STAGED_DIR, ignore_errors=True)
        *first, last = files.items()
        with collect_written(defer=True):  # fsynced by the pass below, with the arrays' files
            for rel, data in first:
                path = self.root / rel
                path.parent.mkdir(parents=True, exist_ok=True)
                write_atomic(path, data, deferrable=True)
        # every file and folder on disk before the manifest says complete, in one pass of
        # fsyncs issued together (files fsynced before their block's record are not again, nor
        # the progress records, each durable since it was written and removed below); the
        # manifest is in the pass under its temporary name, renamed into place after it
        path = self.root / last[0]
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = write_temporary(path, last[1])
        try:
            fsync_tree(self.root, skip=self.synced, prune=(PROGRESS_DIR,))
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        fsync_dir(path.parent)
        old = None
        if self.out.exists():
            if not self.overwrite:
                raise StoreExistsError(
                    f"output {self.out} appeared while this run was writing; the finished store "
                    f"stays in {self.root} (pass overwrite: true to replace {self.out})"
                )
            old = self.out.with_name(f"{self.out.name}.old-{os.getpid()}-{int(time.time())}")
            os.replace(self.out, old)
        os.replace(self.root, self.out)
        fsync_dir(self.out.parent)
        shutil.rmtree(self.out / PROGRESS_DIR, ignore_errors=True)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
