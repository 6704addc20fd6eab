"""By URL, the first shards a worker reads asked for as soon as its epoch is planned (issues 25
and 28).

A first epoch by URL fetches each shard whole for its checksum, in the call that reads the
first group's chunks of it (:func:`.shard_fetch._checked_whole`). That call starts only after
the loader has built the group (its buffer, its spans, a slice per inner chunk) and handed it
to a read thread, which sorts the spans by shard before its first request: 20-70 ms of one
epoch of the default store by URL on loopback (docs/benchmarks.md), while the connection sat
idle and the GIL was the planner's. The loader tells the reader its spans earlier, once per
worker and epoch (:func:`shardload.load.url_plan.plan_url_reads`), and from them
:func:`fetch_ahead` starts the whole GETs of the first ``AHEAD_SHARDS`` shards to check, in
the order this worker first reads them, each in a thread of its own that fetches and hashes.

Nothing is trusted earlier: the call that checks the shard takes those bytes and their digest
(:meth:`Ahead.take`, waiting for the GET when it is still running) under the shard's
``Verifier.unit_lock`` and compares the digest with the store's checksum, as with bytes it
fetched itself; it may decode the shard's chunks into its own rows while the bytes arrive
(:class:`Stream`, :mod:`.streamed`), but those stand only once that check passed. A GET ahead
that failed is dropped and the call fetches the
shard as before, so every error is raised and named where it was. What was fetched ahead and
not taken is dropped at the next plan (the next epoch) and when the reader closes; those
threads' retries end then (``move.retries.stop_on``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import numpy as np

from shardload.formats.checksums import Verifier, digest
from shardload.formats.zarr.shards import RangeFile, RangeOpener
from shardload.move.retries import stop_on
from shardload.util.owners import PerOwner

#: Shards fetched ahead per reader and epoch (a call checks as many at once: ``CHECK_THREADS``).
AHEAD_SHARDS = 2

#: a shard's bytes and their digest
Fetched = tuple[memoryview, int]


class Stream:
    """One GET ahead as it arrives (:mod:`.streamed` decodes from it): its buffer, how many
    bytes are in, which attempt (a retry reads into a new buffer). Told by the GET's thread
    (``move.http_get.WATCH``); a GET that ``http.client`` does not read tells nothing, and
    the waiters learn at its end that there is nothing to decode from."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.buf: Any = None
        self.at = self.total = 0
        self.attempts = 0
        self.over = False
        self._tail: Any = None  # the shard's index bytes, asked for once (:meth:`tail`)
        self._tail_lock = threading.Lock()

    def update(self, buf: Any, at: int, n: int) -> None:
        """``at`` of the answer's ``n`` bytes are in ``buf``."""
        with self.cond:
            if buf is not self.buf:
                self.buf, self.attempts, self.total = buf, self.attempts + 1, n
            self.at = at
            self.cond.notify_all()

    def end(self) -> None:
        """The GET is over (its bytes all in, or failed)."""
        with self.cond:
            self.over = True
            self.cond.notify_all()

    def wait(self, end: int) -> tuple[Any, int] | None:
        """The buffer and its attempt once its bytes up to ``end`` are in; None when the GET
        ended without them."""
        with self.cond:
            while not self.over and (self.buf is None or self.at < end):
                self.cond.wait()
            if self.buf is None or self.at < end:
                return None
            return self.buf, self.attempts

    def tail(self, fetch: Callable[[], Any]) -> Any:
        """The shard's index bytes: ``fetch()`` by the first caller, the others wait for it
        and get the same (one range request a shard, however many calls decode from it)."""
        with self._tail_lock:
            if self._tail is None:
                self._tail = fetch()  # (an error: raised to this caller; the next asks again)
            return self._tail

    def size(self) -> int | None:
        """The answer's length once it is known; None when the GET ended without telling."""
        with self.cond:
            while not self.over and self.buf is None:
                self.cond.wait()
            return self.total if self.buf is not None else None


class Ahead:
    """One reader's GETs started ahead: a future per ``(array, shard)``, taken once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[tuple[str, int], Future[Fetched]] = {}
        self._streams: dict[tuple[str, int], Stream] = {}
        self._stop = threading.Event()

    def start(self, name: str, k: int, fs: Any, path: str) -> None:
        """GET shard ``k`` of ``name`` (``path`` on ``fs``) whole and hash it, in a thread."""
        fut: Future[Fetched] = Future()
        with self._lock:
            if (name, k) in self._futures:
                return
            self._futures[(name, k)] = fut
            stream = self._streams[(name, k)] = Stream()
        stop = self._stop
        threading.Thread(
            target=_fetch, args=(fut, fs, path, stop, stream), daemon=True, name="shardload-ahead"
        ).start()

    def stream(self, name: str, k: int) -> Stream | None:
        """The GET ahead of shard ``k`` as it arrives, until it is taken (every call that
        wants the shard meanwhile decodes from it), or None."""
        with self._lock:
            if (name, k) not in self._futures:
                return None
            return self._streams.get((name, k))

    def take(self, name: str, k: int) -> Fetched | None:
        """The bytes and digest of shard ``k`` fetched ahead (waiting for the GET), once; None
        when none was started or it failed (the caller fetches it)."""
        with self._lock:
            fut = self._futures.pop((name, k), None)
            self._streams.pop((name, k), None)  # (its buffer: not held past the take)
        if fut is None:
            return None
        try:
            return fut.result()
        except Exception:  # the caller's own fetch raises it, named as ever
            return None

    def clear(self) -> None:
        """Drop what was not taken; the retries of GETs still running end."""
        with self._lock:
            self._futures.clear()
            self._streams.clear()
            self._stop.set()
            self._stop = threading.Event()

    def __len__(self) -> int:
        return len(self._futures)


def _fetch(fut: Future[Fetched], fs: Any, path: str, stop: threading.Event, stream: Stream) -> None:
    from shardload.move.http_get import WATCH

    if not fut.set_running_or_notify_cancel():  # pragma: no cover - never cancelled
        return
    WATCH.cb = stream.update  # (this thread's answers only)
    try:
        with stop_on(stop):
            data = RangeFile(fs, path).whole()
            WATCH.cb = None
            stream.end()  # before the digest: a decode waiting for the last run goes on
            fut.set_result((data, digest(data)))
    except BaseException as exc:  # taken as None: the call fetches and reports it
        fut.set_exception(exc)
    finally:
        WATCH.cb = None
        stream.end()


def fetch_ahead(
    ahead: Ahead,
    layouts: dict[str, Any],
    verifier: Verifier | None,
    first: np.ndarray,
    *,
    shards: int = AHEAD_SHARDS,
) -> None:
    """Start the GETs of the first ``shards`` shards still to check of the sharded arrays
    by URL of ``layouts`` (a ``ChunkLayout`` or None each), in the order a worker whose spans
    start at rows ``first`` (in the order it reads them) first reads them; what an earlier plan
    started and left is dropped first."""
    ahead.clear()
    if verifier is None or not verifier.enabled or verifier.mode == "always" or shards <= 0:
        return  # (``always``: each read checks its own fetch, nothing is shared)
    rows = np.asarray(first, np.int64)
    wanted: list[tuple[int, str, int]] = []  # (first span reading it, array, shard)
    for name, lay in layouts.items():
        if lay is None or lay.shard is None:
            continue
        if not isinstance(lay.opener, RangeOpener) or not len(rows):
            continue
        ks, at = np.unique(rows // (lay.chunk_rows * lay.shard.chunks), return_index=True)
        picked = 0
        for step, k in sorted(zip(at.tolist(), ks.tolist(), strict=True)):
            if picked == shards:
                break
            if verifier.needed(name, k):
                wanted.append((step, name, k))
                picked += 1
    for _, name, k in sorted(wanted)[:shards]:
        lay = layouts[name]
        ahead.start(name, k, lay.opener.fs, lay.chunk_path(k))


#: per reader; a forked child's are its own (never a parent's bytes, futures or locks)
_AHEAD: PerOwner[Ahead] = PerOwner(Ahead)


def ahead_for(owner: Any) -> Ahead:
    """The GETs ahead of the reader that owns ``owner`` (its shard index cache)."""
    return _AHEAD.get(owner)
