"""What goes into a block's progress record besides its data being durable: the background
recorder that fsyncs deferred files before each record, and the checksum fields of a record."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.prep.commit import BlockCommit
from shardload.util.durable import FSYNC_THREADS, fsync_path

log = logging.getLogger("shardload.prep.commit")


class DurableRecorder:
    """Records finished blocks from one background thread, each once the files its task wrote
    are fsynced: for tasks that deferred their fsyncs (:func:`~shardload.util.durable.collect_written`
    with ``defer=True``), so a block is still durable before its record.

    :meth:`put` hands over a finished task: the files of every task waiting are fsynced
    together (from a few threads), then ``on_durable(item)`` runs in the recorder's thread for
    each, in order of arrival (it writes the block's record). At most
    ``maxsize`` tasks are handed over and not yet recorded (those being fsynced count);
    :meth:`put` blocks beyond that (the writers then wait for the disk).
    An error in the thread is raised by the next :meth:`put` or by :meth:`close`; what was queued
    after it is never recorded. Leaving the ``with`` block on an error (a task failed) still
    records the finished tasks queued (a resumed run need not redo them); on an interrupt
    (``KeyboardInterrupt``, ``SystemExit``) the queue is dropped.
    """

    def __init__(
        self, commit: BlockCommit, on_durable: Callable[[Any], None], *, maxsize: int = 8
    ) -> None:
        self.commit = commit
        self.on_durable = on_durable
        self._queue: queue.Queue[tuple[Sequence[str], Any] | None] = queue.Queue()
        # tasks handed over and not yet recorded, those being fsynced included: the blocks a
        # prepare holds on local disk (an upload to object storage) stay bounded by maxsize
        self._room = threading.Semaphore(maxsize)
        self._error: BaseException | None = None
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="shardload-fsync", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        with ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="shardload-fsync") as pool:
            while True:
                batch = [self._queue.get()]
                while batch[-1] is not None:  # every block waiting: their fsyncs go together
                    try:
                        batch.append(self._queue.get_nowait())
                    except queue.Empty:
                        break
                tasks = [got for got in batch if got is not None]
                try:
                    self._record(pool, tasks)
                finally:
                    for _ in tasks:  # recorded, or dropped after an error: room for more
                        self._room.release()
                if batch[-1] is None:
                    return

    def _record(self, pool: ThreadPoolExecutor, batch: list[tuple[Sequence[str], Any]]) -> None:
        """fsync the files of every block of ``batch`` at once (fsyncs in flight together share
        the file system's journal commits, where one at a time each waits for its own), then
        record the blocks in order, each once its own files are durable; at the first failed
        fsync, stop (the blocks before it are recorded, none after)."""
        if self._error is not None or self._stop:
            return  # drain: nothing after an error is recorded
        synced: dict[str, Future[None]] = {}
        for paths, _ in batch:
            for path in paths:
                if path not in synced:
                    synced[path] = pool.submit(fsync_path, path)
        for paths, item in batch:
            if self._stop:
                return
            try:
                for path in paths:
                    synced[path].result()
                self.commit.synced.update(paths)
                self.on_durable(item)
            except BaseException as exc:  # re-raised in the driver
                self._error = exc
                return

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def put(self, paths: Sequence[str], item: Any) -> None:
        self._raise()
        self._room.acquire()
        self._queue.put((list(paths), item))

    def close(self) -> None:
        """Wait until every task handed over is recorded; raise the thread's error, if any."""
        self._queue.put(None)
        self._thread.join()
        self._raise()

    def __enter__(self) -> DurableRecorder:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        if exc_type is None:
            self.close()
            return
        if isinstance(exc_type, type) and issubclass(exc_type, Exception):
            try:
                self.close()
            except Exception as late:  # the task's error is the one to report
                log.warning("recording the blocks finished before the error failed: %s", late)
            return
        self._stop = True
        self._queue.put(None)
        self._thread.join()


# -- checksums in progress records ---------------------------------------------------------------
#: Progress-record field of an array's checksums: ``[[unit, ...], [digest, ...]]``.
CHECKSUM_KEY = "checksum:"


def checksum_field(name: str, sums: Mapping[int, int]) -> dict[str, np.ndarray]:
    """The progress-record field holding array ``name``'s checksums by unit."""
    return {f"{CHECKSUM_KEY}{name}": np.array([list(sums), list(sums.values())], np.uint64)}


def record_checksums(record: dict[str, Any], name: str, sums: Mapping[int, int]) -> None:
    record.update(checksum_field(name, sums))


def merge_checksums(records: list[dict[str, np.ndarray]], names: list[str]) -> dict[str, Any]:
    """Every array's checksums by unit, from the blocks' records; {} when a record has none
    (written by a version without checksums: the store then has none)."""
    units: dict[str, dict[int, int]] = {n: {} for n in names}
    for r in records:
        for n in names:
            if f"{CHECKSUM_KEY}{n}" not in r:
                return {}
            k, v = r[f"{CHECKSUM_KEY}{n}"]
            units[n].update(zip(k.tolist(), v.tolist(), strict=True))
    out = {}
    for n, d in units.items():
        if sorted(d) != list(range(len(d))):
            raise StoreError(f"checksums of array {n!r} do not cover its chunks: {sorted(d)[:10]}")
        out[n] = np.array([d[k] for k in range(len(d))], dtype=np.uint64)
    return out
