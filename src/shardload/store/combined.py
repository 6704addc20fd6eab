"""The store a selection or combination returns (:mod:`shardload.store.combine`): its
reader maps each row to a row of one of the stores it reads (:class:`~shardload.manifest.combine.Piece`),
a chunk of those stores at a time; nothing is written.
"""

from __future__ import annotations

import os
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import numpy as np

from shardload.formats.base import ArrayReader, ReadsInto, ReadsSpansInto
from shardload.manifest.combine import GAP, Piece
from shardload.manifest.core import Manifest
from shardload.store.core import Store

__all__ = ["CombinedReader", "CombinedStore", "Source"]


class Source(NamedTuple):
    """Where an array of the result comes from: its name in each store (None: not there) and,
    for a join, the one store it is read from row for row (``part``)."""

    names: tuple[str | None, ...]
    part: int | None = None
    #: the variables kept (indices of axis 0 of a row: anemoi's variables), and the row shape
    #: of the store read before they are picked; None: whole rows
    picked: tuple[int, ...] | None = None
    row_shape: tuple[int, ...] = ()


class CombinedReader:
    """Rows of a :class:`CombinedStore`, read from its stores' readers."""

    def __init__(self, store: CombinedStore) -> None:
        self.store = store
        self.starts = [p.start for p in store.pieces]

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        info = self.store.manifest.arrays[name]
        out = np.empty((max(0, stop - start), *info.row_shape), info.dtype)
        self.read_into(name, start, stop, out)
        return out

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        """Rows ``[start, stop)`` into ``out`` (the loader's batch buffer): each store's reader
        reads straight into its slice of it, no temporary."""
        self.read_spans_into(name, [(start, stop)], [out])

    def read_spans_into(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None:
        """Several spans, each into its buffer; the runs of each store in one call of its
        reader where it takes several (a sharded Zarr store then opens each shard once)."""
        st = self.store
        src = st.sources[name]
        if src.picked is None:
            self._read_whole(src, spans, outs)
            return
        info = st.manifest.arrays[
            name
        ]  # the variables picked: whole rows read (a chunk decodes whole)
        for (a, b), out in zip(spans, outs, strict=True):
            whole = np.empty((max(0, b - a), *src.row_shape), info.dtype)
            self._read_whole(src, [(a, b)], [whole])
            np.take(whole, src.picked, axis=1, out=out)

    def _read_whole(
        self, src: Source, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None:
        """Whole rows of the spans: gaps and strided pieces here, the runs of consecutive rows
        of each store gathered into one call of its reader."""
        st = self.store
        runs: dict[int, tuple[list[tuple[int, int]], list[np.ndarray]]] = {}
        for (start, stop), out in zip(spans, outs, strict=True):
            if src.part is not None:  # joined: row for row from its own store
                _add_run(runs, src.part, start, stop, out)
                continue
            i = max(0, bisect_right(self.starts, start) - 1)
            while i < len(st.pieces) and st.pieces[i].start < stop:
                p = st.pieces[i]
                a, b = max(start, p.start), min(stop, p.start + p.rows)
                if a < b and (p.part == GAP or p.step != 1):
                    _read_piece(st, src, p, a, b, out[a - start : b - start])
                elif a < b:
                    first = p.base + a - p.start
                    _add_run(runs, p.part, first, first + b - a, out[a - start : b - start])
                i += 1
        for part, (part_spans, part_outs) in runs.items():
            reader, name = st.parts[part].reader, _name(src, part)
            if len(part_spans) > 1 and isinstance(reader, ReadsSpansInto):
                reader.read_spans_into(name, part_spans, part_outs)
                continue
            for (a, b), out in zip(part_spans, part_outs, strict=True):
                if isinstance(reader, ReadsInto):
                    reader.read_into(name, a, b, out)
                else:
                    out[...] = reader.read(name, a, b)

    def close(self) -> None:
        """Nothing of its own: the stores' readers are theirs to close."""


def _name(src: Source, part: int) -> str:
    name = src.names[part]
    assert name is not None  # checked when the store was made
    return name


def _add_run(
    runs: dict[int, tuple[list[tuple[int, int]], list[np.ndarray]]],
    part: int,
    a: int,
    b: int,
    out: np.ndarray,
) -> None:
    spans, outs = runs.setdefault(part, ([], []))
    spans.append((a, b))
    outs.append(out)


def _read_piece(st: CombinedStore, src: Source, p: Piece, a: int, b: int, out: np.ndarray) -> None:
    """Rows ``[a, b)`` of the result, in a gap or a piece of every ``step``-th row, into
    ``out``: a gap's rows filled (NaN, or 0 for integers: they are missing dates, which loaders
    leave out), a strided piece read a chunk of its store at a time (its bounding span)."""
    if p.part == GAP:
        out[...] = np.nan if np.issubdtype(out.dtype, np.inexact) else 0
        return
    base, name = st.parts[p.part], _name(src, p.part)
    rows = p.base + (np.arange(a, b) - p.start) * p.step
    bounds = np.asarray(base.manifest.chunk_bounds)
    chunk = np.searchsorted(bounds, rows, "right")
    cuts = np.flatnonzero(np.diff(chunk)) + 1
    for lo, hi in zip(np.r_[0, cuts], np.r_[cuts, len(rows)], strict=True):
        r0, r1 = int(rows[lo]), int(rows[hi - 1])
        out[lo:hi] = base.reader.read(name, r0, r1 + 1)[:: p.step]


class CombinedStore(Store):
    """A store whose rows are rows of other stores (``parts``): see the module. Pickles as its
    stores do; its reader reads through theirs."""

    def __init__(
        self,
        manifest: Manifest,
        parts: Sequence[Store],
        pieces: Sequence[Piece],
        sources: Mapping[str, Source],
        *,
        url: str,
        own_stats: bool = True,
    ) -> None:
        first = parts[0]
        super().__init__(manifest, first.fs, first.root, url=url, verify=first.verify)
        self.parts, self.pieces, self.sources = tuple(parts), tuple(pieces), dict(sources)
        #: whether ``manifest.stats`` are the statistics of this store's own rows (False for a
        #: time selection: those of the store it selects from, which a concat cannot merge)
        self.own_stats = own_stats

    @property
    def reader(self) -> ArrayReader:
        if self._reader is None or self._pid != os.getpid():
            self._reader = CombinedReader(self)
            self._pid = os.getpid()
        return self._reader
