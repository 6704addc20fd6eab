"""The batches of an ``at_load`` window store (:class:`shardload.store.windows.WindowReader`):
each batch's windows read by reader threads, in plan order."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.load.recycle import Allocate
from shardload.plan.epoch import EpochPlan, iter_worker_batches
from shardload.store.windows import WindowReader


def window_batches(
    store: Any, names: Sequence[str], plan: EpochPlan, rank: int, worker: int, *,
    prefetch: int, threads: int, new_batch: Callable[[int], dict[str, np.ndarray]],
    index_key: str, allocate: Allocate | None = None,
) -> Iterator[dict[str, np.ndarray]]:  # fmt: skip
    """The worker's batches of an ``at_load`` store, in plan order: each batch's windows read
    by ``threads`` reader threads, up to ``prefetch + 1`` batches ahead of the one yielded.
    Closing the iterator waits for the reads in flight (no thread writes into a batch's
    memory after the caller reclaims it)."""
    reader = store.reader
    if not isinstance(reader, WindowReader):
        raise StoreError(f"{store.url} is not a window store with at_load: true")
    batches = iter_worker_batches(plan, rank, worker)
    pool = ThreadPoolExecutor(max_workers=max(1, threads), thread_name_prefix="shardload-window")
    inflight: deque[tuple[dict[str, np.ndarray], list[Future[None]]]] = deque()
    ahead = max(1, prefetch) + 1
    try:
        for rows in batches:
            out = (allocate(len(rows)) if allocate else None) or new_batch(len(rows))
            out[index_key][...] = rows
            futs: list[Future[None]] = []
            for a in names:
                futs += reader.read_samples(a, rows, out[a], submit=pool.submit)
            inflight.append((out, futs))
            while len(inflight) > ahead:
                yield _finish(inflight)
        while inflight:
            yield _finish(inflight)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _finish(inflight: deque[tuple[dict[str, np.ndarray], list[Future[None]]]]) -> dict:
    out, futs = inflight.popleft()
    for f in futs:
        f.result()  # re-raises a read error here, in the consuming thread
    return out
