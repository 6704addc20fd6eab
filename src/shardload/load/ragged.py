"""Batches of stores with variable-length (ragged) arrays: ``NAME`` zero-padded to the batch's
longest row, and ``NAME_length`` (int64).

The same epoch plan as fixed-shape stores (:mod:`shardload.plan.epoch`: shuffle groups,
``group_batches``, resume), so equal batches per rank, exact resume and the shuffle hold as
they do there; only the reading differs: a group's segments are read whole (values sliced by
the offsets, :class:`shardload.formats.ragged.read.RaggedReader`; fixed arrays as on the gather
path), and each batch is gathered, then padded. No shared-memory ring (a batch's width is
known only once it is gathered): the torch layer hands such batches over the stock way.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from shardload.errors import PlanError
from shardload.load.loop import Batch, Flight, GroupReader, read_loop
from shardload.load.pool import ReadPool
from shardload.load.reader import read_segment
from shardload.manifest.ragged import (
    LENGTH_SUFFIX,
    RaggedRows,
    concat_rows,
    gather_padded,
    offsets_of,
    take_rows,
)
from shardload.plan.buckets import Buckets
from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import iter_worker_groups
from shardload.plan.spans import Segment
from shardload.store.core import Store

log = logging.getLogger(__name__)


def resolve_buckets(
    store: Store, names: Sequence[str], bucket: bool | str, shuffle: bool | str
) -> Buckets | None:
    """The length buckets ``bucket`` asks for: True buckets by the summed lengths of the
    selected variable-length arrays, a name by that array's lengths; False: None."""
    if bucket is False or bucket is None:
        return None
    ragged = ragged_names(store, names)
    if not ragged:
        raise PlanError(
            f"bucket={bucket!r}: length-bucketed batches need a variable-length array; "
            f"{store.url} arrays {list(names)} have fixed shapes"
        )
    if isinstance(bucket, str):
        if bucket not in ragged:
            raise PlanError(
                f"bucket={bucket!r} is not a selected variable-length array; choose one of {ragged}"
            )
        ragged = [bucket]
    elif bucket is not True:
        raise PlanError(f"bucket must be True, False or an array name, got {bucket!r}")
    if shuffle is not True:
        raise PlanError(
            f"bucket={bucket!r} deals each shuffle group's rows by length and needs "
            f"shuffle=True, got shuffle={shuffle!r}"
        )
    lengths = sum(np.diff(store.ragged_reader.offsets(n)) for n in ragged)
    return Buckets(np.asarray(lengths, np.int64))


def ragged_names(store: Store, names: Sequence[str]) -> list[str]:
    """The variable-length arrays among ``names``."""
    arrays = store.manifest.arrays
    return [n for n in names if arrays[n].is_ragged]


@dataclass
class PaddingStats:
    """Padding waste of the batches of a ragged array: ``values`` real values served,
    ``cells`` cells of the padded batches (``rows x longest row``, summed). ``waste`` is the
    share of padded cells that are zeros added: ``1 - values / cells``. Thread-safe; one
    object may collect the batches of several iterators."""

    values: int = 0
    cells: int = 0
    batches: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, lengths: np.ndarray) -> None:
        width = int(lengths.max()) if len(lengths) else 0
        with self._lock:
            self.values += int(lengths.sum())
            self.cells += width * len(lengths)
            self.batches += 1

    @property
    def waste(self) -> float:
        return 1.0 - self.values / self.cells if self.cells else 0.0

    def __getstate__(self) -> dict[str, Any]:
        return {"values": self.values, "cells": self.cells, "batches": self.batches}

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__init__(**d)  # type: ignore[misc]


@dataclass(eq=False)
class _Group:
    order: np.ndarray
    rows: np.ndarray
    fixed: dict[str, np.ndarray]
    ragged: dict[str, tuple[np.ndarray, np.ndarray]]  # name -> (values, offsets)


def _read_ragged_segment(store: Store, name: str, seg: Segment) -> RaggedRows:
    a, b = seg.chunk_start + seg.start, seg.chunk_start + seg.stop
    rows = store.ragged_reader.read(name, a, b)
    if seg.rows is None:
        return rows
    return take_rows(rows.values, rows.offsets, seg.rows - seg.start)


def _read_group(
    store: Store,
    fixed: Sequence[str],
    ragged: Sequence[str],
    segments: tuple[Segment, ...],
    order: np.ndarray,
) -> _Group:
    lens = np.array([len(s) for s in segments], dtype=np.int64)
    cut = np.concatenate(([0], np.cumsum(lens)))
    n = int(cut[-1])
    infos = store.manifest.arrays
    bufs = {a: np.empty((n, *infos[a].row_shape), np.dtype(infos[a].dtype)) for a in fixed}
    for a in fixed:
        for i, seg in enumerate(segments):
            read_segment(store, a, seg, bufs[a][cut[i] : cut[i + 1]])
    rag = {}
    for a in ragged:
        parts = concat_rows([_read_ragged_segment(store, a, s) for s in segments])
        rag[a] = (parts.values, offsets_of(parts.lengths))
    rows = (
        np.concatenate([s.global_rows() for s in segments]) if segments else np.zeros(0, np.int64)
    )
    return _Group(order, rows, bufs, rag)


class RaggedBatchReader(GroupReader):
    """Fixed arrays as usual, each ragged ``NAME`` as a ``(rows, longest)`` zero-padded array
    plus ``NAME_length``; ``index`` the global rows. A group is one task of the ``read`` lane
    (``threads`` threads), ``2 + prefetch // shuffle_chunks`` groups ahead of the one placed;
    each batch is gathered and padded once all its rows are read."""

    def __init__(
        self,
        store: Store,
        names: Sequence[str],
        plan: EpochPlan,
        rank: int,
        worker: int,
        *,
        prefetch: int,
        threads: int,
        index_key: str,
        padding_stats: PaddingStats | None = None,
    ) -> None:
        super().__init__(plan, rank, worker)
        self.store, self.index_key, self.stats = store, index_key, padding_stats
        self.ragged = ragged_names(store, names)
        self.fixed = [n for n in names if n not in self.ragged]
        self.lanes = {"read": threads}
        self.ahead = 2 + max(0, prefetch) // max(1, plan.shuffle_chunks)
        self.pending: dict[int, list[tuple[_Group, np.ndarray]]] = {}

    def units(self) -> Iterator[Any]:
        return iter_worker_groups(self.plan, self.rank, self.worker)

    def start(self, unit: Any, at: int, n: int, pool: ReadPool) -> Flight:
        read = pool.submit("read", _read_group, self.store, self.fixed, self.ragged, *unit)
        return Flight(at, n, futures=[read])

    def place(self, flight: Flight, k: int, dst: int, src: int, take: int) -> None:
        g: _Group = flight.futures[0].result()
        self.pending.setdefault(k, []).append((g, g.order[src : src + take]))

    def finish(self, k: int, size: int) -> tuple[Batch, list[Future[Any]]]:
        pieces = self.pending.pop(k)
        return _assemble(pieces, self.fixed, self.ragged, self.index_key, self.stats), []


def ragged_batches(
    store: Store,
    names: Sequence[str],
    plan: EpochPlan,
    rank: int,
    worker: int,
    *,
    prefetch: int,
    threads: int,
    index_key: str,
    padding_stats: PaddingStats | None = None,
) -> Iterator[dict[str, np.ndarray]]:
    """The worker's batches, read by a :class:`RaggedBatchReader` (see there)."""
    reader = RaggedBatchReader(
        store,
        names,
        plan,
        rank,
        worker,
        prefetch=prefetch,
        threads=threads,
        index_key=index_key,
        padding_stats=padding_stats,
    )
    return read_loop(reader)


def _assemble(
    pieces: list[tuple[_Group, np.ndarray]],
    fixed: Sequence[str],
    ragged: Sequence[str],
    index_key: str,
    stats: PaddingStats | None,
) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for a in fixed:
        out[a] = np.concatenate([np.take(g.fixed[a], sel, axis=0) for g, sel in pieces])
    for a in ragged:
        parts = [(g.ragged[a], sel) for g, sel in pieces]
        lengths = np.concatenate([off[sel + 1] - off[sel] for (_, off), sel in parts])
        width = int(lengths.max()) if len(lengths) else 0
        padded = np.zeros((len(lengths), width), parts[0][0][0].dtype)
        r = 0
        for (vals, off), sel in parts:  # straight from the group buffers into the batch
            gather_padded(vals, off, sel, padded[r : r + len(sel)])
            r += len(sel)
        out[a] = padded
        out[a + LENGTH_SUFFIX] = lengths
        if stats is not None:
            stats.add(lengths)
    out[index_key] = np.concatenate([g.rows[sel] for g, sel in pieces])
    return out
