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

from shardload.formats.base import ArrayReader
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
        st = self.store
        info = st.manifest.arrays[name]
        src = st.sources[name]
        shape = info.row_shape if src.picked is None else src.row_shape
        out = np.empty((max(0, stop - start), *shape), info.dtype)
        if src.part is not None:  # joined: row for row from its own store
            base = st.parts[src.part]
            out[...] = base.reader.read(_name(src, src.part), start, stop)
        i = max(0, bisect_right(self.starts, start) - 1)
        while src.part is None and i < len(st.pieces) and st.pieces[i].start < stop:
            p = st.pieces[i]
            a, b = max(start, p.start), min(stop, p.start + p.rows)
            if a < b:
                _read_piece(st, src, p, a, b, out[a - start : b - start])
            i += 1
        if src.picked is not None:  # the variables picked (whole rows read: a chunk decodes whole)
            return np.take(out, src.picked, axis=1)
        return out

    def close(self) -> None:
        """Nothing of its own: the stores' readers are theirs to close."""


def _name(src: Source, part: int) -> str:
    name = src.names[part]
    assert name is not None  # checked when the store was made
    return name


def _read_piece(st: CombinedStore, src: Source, p: Piece, a: int, b: int, out: np.ndarray) -> None:
    """Rows ``[a, b)`` of the result, in piece ``p``, into ``out``: a gap's rows filled
    (NaN, or 0 for integers: they are missing dates, which loaders leave out), a store's read
    a chunk of that store at a time (every ``step``-th row of its bounding span)."""
    if p.part == GAP:
        out[...] = np.nan if np.issubdtype(out.dtype, np.inexact) else 0
        return
    base, name = st.parts[p.part], _name(src, p.part)
    rows = p.base + (np.arange(a, b) - p.start) * p.step
    if p.step == 1:
        out[...] = base.reader.read(name, int(rows[0]), int(rows[-1]) + 1)
        return
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
