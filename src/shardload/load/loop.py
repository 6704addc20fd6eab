"""The one reading loop: a worker's units (shuffle groups) in flight, batches out in plan order.

Every read path runs this loop; what differs is a small *group reader* (:class:`GroupReader`)
that knows how to start reading one unit into memory and how its rows become batches:

- :class:`~shardload.load.gather.GatherReader`: segments into group buffers, then gathers;
- :class:`~shardload.load.scatter.ScatterReader`: rows straight into their batches (``preadv``,
  io_uring, ``O_DIRECT``);
- :class:`~shardload.load.ragged.RaggedBatchReader`: variable-length rows, batches padded;
- :class:`~shardload.load.windows.WindowBatchReader`: windows cut at load time, a batch a unit.

The loop owns the one :class:`~shardload.load.pool.ReadPool` of the iterator, the read-ahead
(the reader's :meth:`GroupReader.schedule`), the one place a unit's rows are cut into batches
(``plan.groups.group_batches``) and the one shutdown path: closing the iterator (or an error)
cancels the reads not started and waits for the others before the reader lets go of its memory.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardload.errors import PlanError
from shardload.load.pool import ReadPool
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import group_batches

Batch = dict[str, np.ndarray]


@dataclass(eq=False)
class Flight:
    """One unit being read: stream positions ``at .. at + n`` of the worker's rows.

    ``futures`` finish once its rows can be placed; ``data`` is the reader's (group buffers, a
    read group); ``submitted`` / ``segments`` count a unit read in parts (the gather reader's)."""

    at: int
    n: int
    futures: list[Future[Any]] = field(default_factory=list)
    data: Any = None
    submitted: int = 0
    segments: int = 0

    def wait(self) -> None:
        for f in self.futures:
            f.result()  # re-raises a read error here, in the consuming thread


class GroupReader:
    """What the loop drives: read one unit of a worker's plan (a shuffle group, or a batch).

    ``lanes``: the pool's lanes and their threads (``detach``: lanes a close need not wait
    for, :class:`~shardload.load.pool.ReadPool`); ``ahead``: units in flight beside the one
    waited on; ``cover``: also start units until the batch holding the current unit's last row
    is covered; ``lag``: completed batches held back while their own tasks (gathers) run.
    """

    lanes: dict[str, int]
    detach: tuple[str, ...] = ()
    ahead: int = 1
    cover: bool = False
    lag: int = 0

    def __init__(self, plan: EpochPlan, rank: int, worker: int) -> None:
        self.plan, self.rank, self.worker = plan, rank, worker

    def units(self) -> Iterator[Any]:
        """The worker's units in stream order."""
        raise NotImplementedError

    def rows(self, unit: Any) -> int:
        """Rows of ``unit`` in the stream."""
        return len(unit[1])

    def start(self, unit: Any, at: int, n: int, pool: ReadPool) -> Flight:
        """Start reading ``unit`` (its first ``n`` rows go to stream positions ``at ..``)."""
        raise NotImplementedError

    def schedule(
        self,
        current: Flight,
        others: deque[Flight],
        start_next: Callable[[], Flight | None],
        pool: ReadPool,
    ) -> None:
        """Keep reads ahead before the loop waits on ``current``: by default ``ahead`` units
        (more with ``cover``)."""
        b, total = self.plan.batch_size, self.plan.workers[self.rank][self.worker].num_rows
        need = min(total, -(-(current.at + current.n) // b) * b) if self.cover else 0
        while len(others) < self.ahead or _end(others[-1] if others else current) < need:
            fl = start_next()
            if fl is None:
                return
            others.append(fl)

    def wait(self, flight: Flight) -> None:
        """Block until ``flight``'s rows can be placed (re-raising its read errors)."""
        flight.wait()

    def place(self, flight: Flight, k: int, dst: int, src: int, take: int) -> None:
        """Rows ``src .. src + take`` of ``flight`` (in its order) are rows ``dst ..`` of batch
        ``k`` (after ``flight.wait()``); scatter readers placed them already."""

    def finish(self, k: int, size: int) -> tuple[Batch, list[Future[Any]]]:
        """Batch ``k`` of ``size`` rows, every row placed (its tasks may still run)."""
        raise NotImplementedError

    def release(self, flight: Flight) -> None:
        """Nothing reads ``flight``'s memory any more (it may go back to a pool)."""

    def close(self) -> None:
        """The pool is shut down: no thread reads or writes any more."""


def read_loop(reader: GroupReader) -> Iterator[Batch]:
    """Batches of ``reader``'s worker, in plan order (a generator: nothing is read before the
    first batch is asked for)."""
    plan, rank, worker = reader.plan, reader.rank, reader.worker
    b, total = plan.batch_size, plan.workers[rank][worker].num_rows
    num_batches = -(-total // b)
    pool = ReadPool(reader.lanes, detach=reader.detach)
    units = reader.units()
    inflight: deque[Flight] = deque()
    done: deque[tuple[Batch, list[Future[Any]]]] = deque()
    finished = 0
    at = 0  # stream position of the next unit's first row

    def start_next() -> Flight | None:
        nonlocal at
        unit = next(units, None)
        if unit is None:
            return None
        n = min(reader.rows(unit), total - at)
        fl = reader.start(unit, at, n, pool)
        at += n
        return fl

    try:
        while True:
            current = inflight.popleft() if inflight else start_next()
            if current is None:
                break
            reader.schedule(current, inflight, start_next, pool)
            reader.wait(current)
            for k, dst, src, take in group_batches(current.at, current.n, b).tolist():
                reader.place(current, k, dst, src, take)
                size = min(b, total - k * b)
                if dst + take == size:
                    done.append(reader.finish(k, size))
                    finished += 1
                    while len(done) > reader.lag:
                        yield _ready(done.popleft())
            reader.release(current)
        while done:
            yield _ready(done.popleft())
    finally:
        pool.shutdown()
        reader.close()
    if finished != num_batches:  # cannot happen for a consistent plan; never a half batch
        raise PlanError(f"worker {worker} of rank {rank}: the plan ended inside a batch")


def _end(flight: Flight) -> int:
    return flight.at + flight.n


def _ready(item: tuple[Batch, list[Future[Any]]]) -> Batch:
    batch, futures = item
    for f in futures:
        f.result()  # re-raises a gather error here, in the consuming thread
    return batch
