"""Moving batches from DataLoader workers to the main process (torch side of the hand-off).

Ring: DataLoader workers gather each batch into a slot of a shared-memory ring
(:mod:`shardload.load.ring`, mapped before the workers fork) and send only the slot's address
(:class:`_RingBatch`); the main process wraps the slot as tensors (no copy), and the slot is
reused once those tensors (and any views of them) are garbage. A training loop that keeps many
batches alive just makes the workers fall back to the stock hand-off for the batches that find
no free slot. Worker code that builds a *new* dict from a ring batch (``{**b, "extra": ...}``)
sends it by the stock hand-off (a copy); the slot is freed once that copy is made, and the ring
warns once (:meth:`~shardload.load.ring.BatchRing.allocate`).

Bundles: every DataLoader item costs a round trip between the main process and a worker (two
queue hops, a feeder thread on each side, about 0.2-0.6 ms of CPU a batch on 2 cores).
:class:`~shardload.torch.StreamingDataLoader` has each worker send ``bundle`` consecutive
batches as one item and puts them back in the exact order a plain ``DataLoader`` yields them
(worker 0's batch ``i``, then worker 1's batch ``i``, ...), so what the training loop sees, and
resumes from, is unchanged.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import get_worker_info

from shardload.load.ring import BatchRing


def _to_torch(batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    # torch has no datetime type: dates (windows of dates) go as int64 seconds since 1970
    return {
        k: torch.from_numpy(v.view(np.int64) if v.dtype.kind == "M" else v)
        for k, v in batch.items()
    }


class _RingBatch(dict):  # type: ignore[type-arg]
    """A batch in a ring slot, in a DataLoader worker: a dict of tensors viewing the slot, which
    pickles as the slot's address; the main process rebuilds a plain dict of fresh tensors.

    If code in the worker replaced or added entries, it pickles as a plain dict of private
    copies instead (and frees the slot), so the main process still gets what the worker saw.
    """

    def __init__(self, data: Mapping[str, torch.Tensor], ring: BatchRing, slot: int, rows: int):
        super().__init__(data)
        self._ring, self._slot, self._rows = ring, slot, rows
        self._views = dict(data)
        self._sent = [False]  # shared with copies: one slot, sent once

    def __copy__(self) -> _RingBatch:  # default_convert copies, then updates with equal values
        new = _RingBatch(self, self._ring, self._slot, self._rows)
        new._views, new._sent = self._views, self._sent
        return new

    def discard(self) -> None:
        """Free the slot of a batch that will never be sent."""
        if not self._sent[0]:
            self._sent[0] = True
            self._ring.free(self._slot)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._sent[0]:
            raise RuntimeError("a shardload ring batch can be sent to another process only once")
        self._sent[0] = True
        views = self._views
        if self.keys() == views.keys() and all(self[k] is v for k, v in views.items()):
            mark = self._ring.sent(self._slot)  # the slot's state until the main process leases it
            return (_batch_from_ring, (self._ring.token, self._slot, self._rows, mark))
        ids = {id(v) for v in views.values()}
        plain = {k: v.clone() if id(v) in ids else v for k, v in self.items()}
        self._ring.free(self._slot)
        return (dict, (plain,))


def _batch_from_ring(
    token: str, slot: int, rows: int, mark: int | None = None
) -> dict[str, torch.Tensor]:
    """Main process: tensors over a batch's ring slot (no copy); the slot is freed when they,
    and every view of them, are garbage. ``mark``: the sending worker's, which the slot must
    still hold (:meth:`~shardload.load.ring.BatchRing.lease`)."""
    ring = BatchRing.find(token)
    if ring is None:
        raise RuntimeError(
            "a shardload batch arrived from a DataLoader worker but its shared-memory ring is "
            "not mapped in this process (was the StreamingDataset garbage-collected?)"
        )
    return _to_torch(ring.lease(slot, rows, mark))


#: Most batches a :class:`StreamingDataLoader` worker sends per DataLoader item by default...
MAX_BUNDLE = 8
#: ...and most bytes of them.
BUNDLE_BYTES = 16 << 20


def plan_bundle(batch_bytes: int) -> int:
    """Batches per bundle by default: up to ``MAX_BUNDLE``, within ``BUNDLE_BYTES`` (pure).

    >>> plan_bundle(256 * 6208), plan_bundle(64 << 20)
    (8, 1)
    """
    return max(1, min(MAX_BUNDLE, BUNDLE_BYTES // max(1, batch_bytes)))


class _Bundle(list):  # type: ignore[type-arg]
    """Consecutive batches of one DataLoader worker sent as one item (StreamingDataLoader);
    ``seq`` numbers a worker's bundles from 0."""

    worker: int
    seq: int

    def __init__(self, worker: int, seq: int) -> None:
        super().__init__()
        self.worker, self.seq = worker, seq


def _bundles(items: Iterator[Any], worker: int, size: int) -> Iterator[_Bundle]:
    """A worker's batches in bundles of ``size`` (the last one may be shorter)."""
    out = _Bundle(worker, 0)
    try:
        for item in items:
            out.append(item)
            if len(out) == size:
                full, out = out, _Bundle(worker, out.seq + 1)
                yield full  # the DataLoader's now (its queue pickles it later, in a thread)
        if out:
            last, out = out, _Bundle(worker, out.seq + 1)
            yield last
    finally:
        for item in out:  # built but never yielded (the iteration was closed): free their slots
            if isinstance(item, _RingBatch):
                item.discard()
        items.close()  # type: ignore[attr-defined]


def plan_rounds(counts: Sequence[int], bundle: int) -> list[list[int]]:
    """The workers that send a bundle in each round, given each worker's batch count (pure).

    >>> plan_rounds([5, 4, 0], 2)
    [[0, 1], [0, 1], [0]]
    """
    rounds = -(-max(counts, default=0) // bundle)
    return [[w for w, n in enumerate(counts) if r * bundle < n] for r in range(rounds)]


def _unbundle(items: Iterator[Any], counts: Sequence[int], bundle: int) -> Iterator[Any]:
    """Main process: the batches of the workers' bundles, in the order a plain DataLoader
    yields them one by one (batch ``i`` of every worker that has one, then batch ``i + 1``).

    ``counts``: each worker's batches in this iteration (from the plan), so round ``r`` is
    bundle ``r`` of every worker with more than ``r * bundle`` batches. Bundles are matched by
    (worker, seq), so ``in_order=False`` gives the same order; anything unexpected is passed on
    as it comes, never dropped. A batch goes out as soon as it and every batch before it
    arrived: the first batch waits for worker 0's first bundle only, not for every worker's.
    """
    held: dict[tuple[int, int], _Bundle] = {}
    rounds = iter(enumerate(plan_rounds(counts, bundle)))
    rnd, who = next(rounds, (-1, []))
    i = j = 0  # the next batch out: batch i of worker who[j]'s bundle of round rnd
    for item in items:
        if not isinstance(item, _Bundle):
            yield item
            continue
        held[(item.worker, item.seq)] = item
        while who:
            if j == len(who):  # row i done; row 0 needed every bundle, so all are held
                if i + 1 < max(len(held[(w, rnd)]) for w in who):
                    i, j = i + 1, 0
                    continue
                for w in who:
                    del held[(w, rnd)]
                rnd, who = next(rounds, (-1, []))
                i = j = 0
                continue
            b = held.get((who[j], rnd))
            if b is None:
                break  # wait for it
            if i < len(b):
                batch, b[i] = b[i], None  # the caller alone holds it (its slot frees)
                yield batch
            j += 1
    for key in sorted(held, key=lambda k: (k[1], k[0])):  # not in the plan: in arrival order
        yield from (x for x in held.pop(key) if x is not None)


_EXIT_GUARDED = False


def guard_worker_exit(wait_s: float = 1.0) -> None:
    """In a spawned (or forkserver) DataLoader worker, leave the way a forked one does.

    A forked worker ends with ``os._exit``; a spawned one finalizes the interpreter. If the
    DataLoader shuts its workers down mid-epoch, a worker's queue feeder thread may still be
    pickling a batch into shared memory (``THPStorage_shareFd``, C++); finalization then ends
    that daemon thread by unwinding through the C++ frame, which aborts the worker (SIGABRT,
    "terminate called without an active exception") and the main process reports "DataLoader
    worker ... is killed by signal: Aborted". At exit, this waits up to ``wait_s`` for the
    feeder threads, and if one is still busy, flushes stdio and leaves with ``os._exit(0)``.
    Called by the datasets in each worker, once per process (forked workers never run it).
    """
    global _EXIT_GUARDED
    if _EXIT_GUARDED or get_worker_info() is None:
        return  # once per worker; never in the main process, whose exit must stay its own
    _EXIT_GUARDED = True
    import atexit

    # A forked worker never runs atexit handlers (it ends with os._exit): registering is harmless
    atexit.register(_leave_if_feeding, wait_s)


def _leave_if_feeding(wait_s: float) -> None:
    import contextlib
    import os
    import sys
    import threading
    import time

    deadline = time.monotonic() + wait_s
    for t in threading.enumerate():
        if t.name == "QueueFeederThread" and t.is_alive():
            t.join(max(0.0, deadline - time.monotonic()))
    if any(t.name == "QueueFeederThread" and t.is_alive() for t in threading.enumerate()):
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):  # a closed stream must not stop the exit
                stream.flush()
        os._exit(0)
