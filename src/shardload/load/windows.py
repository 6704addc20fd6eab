"""The batches of an ``at_load`` window store (:class:`shardload.store.windows.WindowReader`):
a batch of window samples a unit of the one reading loop, its windows read by reader threads."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.load.loop import Flight, GroupReader, read_loop
from shardload.load.pool import ReadPool
from shardload.load.recycle import Allocate
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import iter_worker_batches
from shardload.store.windows import WindowReader


class WindowBatchReader(GroupReader):
    """A batch of window samples a unit: each batch's windows read by ``threads`` threads of the
    ``read`` lane, up to ``prefetch + 1`` batches ahead of the one yielded."""

    def __init__(
        self,
        store: Any,
        names: Sequence[str],
        plan: EpochPlan,
        rank: int,
        worker: int,
        *,
        prefetch: int,
        threads: int,
        new_batch: Callable[[int], dict[str, np.ndarray]],
        index_key: str,
        allocate: Allocate | None = None,
    ) -> None:
        super().__init__(plan, rank, worker)
        reader = store.reader
        if not isinstance(reader, WindowReader):
            raise StoreError(f"{store.url} is not a window store with at_load: true")
        self.reader, self.names, self.index_key = reader, names, index_key
        self.new_batch, self.allocate = new_batch, allocate
        self.lanes = {"read": threads}
        self.ahead = max(1, prefetch) + 1
        self.batches: dict[int, dict[str, np.ndarray]] = {}

    def units(self) -> Iterator[Any]:
        return iter_worker_batches(self.plan, self.rank, self.worker)

    def rows(self, unit: Any) -> int:
        return len(unit)

    def start(self, unit: Any, at: int, n: int, pool: ReadPool) -> Flight:
        rows = unit
        out = (self.allocate(len(rows)) if self.allocate else None) or self.new_batch(len(rows))
        out[self.index_key][...] = rows
        futs: list[Future[None]] = []
        submit = functools.partial(pool.submit, "read")
        for a in self.names:
            futs += self.reader.read_samples(a, rows, out[a], submit=submit)
        self.batches[at // self.plan.batch_size] = out
        return Flight(at, n, futures=futs)

    def finish(self, k: int, size: int) -> tuple[dict[str, np.ndarray], list[Future[Any]]]:
        return self.batches.pop(k), []


def window_batches(
    store: Any,
    names: Sequence[str],
    plan: EpochPlan,
    rank: int,
    worker: int,
    *,
    prefetch: int,
    threads: int,
    new_batch: Callable[[int], dict[str, np.ndarray]],
    index_key: str,
    allocate: Allocate | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """The worker's batches of an ``at_load`` store, in plan order, read by a
    :class:`WindowBatchReader` (see there)."""
    reader = WindowBatchReader(
        store,
        names,
        plan,
        rank,
        worker,
        prefetch=prefetch,
        threads=threads,
        new_batch=new_batch,
        index_key=index_key,
        allocate=allocate,
    )
    return read_loop(reader)
