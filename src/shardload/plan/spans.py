"""Segments: how a plan names rows without listing them (pure numpy).

A sequence of rows is a list of segments, each the rows of one chunk: a range of row offsets
inside the chunk, or an explicit array of them (what a resume leaves of a partly read shuffle
group). :class:`Segment` is the public form; :class:`Spans` holds many as parallel arrays, so
that cutting a sequence of 10**5 chunks at any row is a ``searchsorted``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class Segment:
    """Rows of one chunk, in sequence order.

    ``start``/``stop`` are row offsets inside the chunk: the rows ``[start, stop)`` when ``rows``
    is None, else the bounding range of ``rows`` (explicit offsets, as left by a resume).
    ``chunk_start`` is the global row of the chunk's first row.

    >>> Segment(3, 2, 5, chunk_start=30).global_rows().tolist()
    [32, 33, 34]
    >>> len(Segment(3, 1, 8, rows=np.array([1, 4, 7]), chunk_start=30))
    3
    """

    chunk: int
    start: int
    stop: int
    rows: np.ndarray | None = None
    chunk_start: int = 0

    def __len__(self) -> int:
        return self.stop - self.start if self.rows is None else len(self.rows)

    def offsets(self) -> np.ndarray:
        """Row offsets inside the chunk, in order."""
        if self.rows is None:
            return np.arange(self.start, self.stop, dtype=np.int64)
        return self.rows

    def global_rows(self) -> np.ndarray:
        """Global row numbers, in order."""
        return self.chunk_start + self.offsets()


@dataclass(frozen=True, eq=False)
class Spans:
    """A sequence of segments as parallel arrays (the vectorised form of ``Segment``s).

    Segment ``i`` is the rows ``lo[i]:hi[i]`` of chunk ``chunk[i]`` when ``ex[i] < 0``, else the
    offsets ``explicit[ex[i]][lo[i]:hi[i]]``. Every segment has at least one row.
    """

    chunk: np.ndarray
    base: np.ndarray
    lo: np.ndarray
    hi: np.ndarray
    ex: np.ndarray
    explicit: tuple[np.ndarray, ...] = ()

    def __len__(self) -> int:
        return len(self.chunk)

    @cached_property
    def cum(self) -> np.ndarray:
        """Row position where each segment starts, and the total at the end."""
        return np.concatenate(([0], np.cumsum(self.hi - self.lo)))

    @property
    def num_rows(self) -> int:
        return int(self.cum[-1])

    def seg(self, a: int, b: int) -> Spans:
        """Segments ``a:b``."""
        return Spans(
            self.chunk[a:b], self.base[a:b], self.lo[a:b], self.hi[a:b], self.ex[a:b], self.explicit
        )

    def take(self, a: int, b: int) -> Spans:
        """Rows ``a:b`` of the sequence (cutting inside segments)."""
        if b <= a:
            return self.seg(0, 0)
        cum = self.cum
        i0 = int(np.searchsorted(cum, a, "right")) - 1
        i1 = int(np.searchsorted(cum, b, "left"))
        lo, hi = self.lo[i0:i1], self.hi[i0:i1]
        if a != cum[i0]:  # cut inside the first segment (else a view: no copy of the plan)
            lo = lo.copy()
            lo[0] += a - cum[i0]
        if b != cum[i1]:
            hi = hi.copy()
            hi[-1] -= cum[i1] - b
        return Spans(self.chunk[i0:i1], self.base[i0:i1], lo, hi, self.ex[i0:i1], self.explicit)

    def offsets(self, i: int) -> np.ndarray:
        lo, hi, ex = int(self.lo[i]), int(self.hi[i]), int(self.ex[i])
        if ex < 0:
            return np.arange(lo, hi, dtype=np.int64)
        return self.explicit[ex][lo:hi]

    def segments(self) -> tuple[Segment, ...]:
        """Every segment, as :meth:`segment` gives them (converted once per array: a group of
        the default load holds over a thousand whole inner chunks).

        >>> s = Spans(*(np.array(v) for v in ([0, 1], [0, 10], [2, 1], [4, 3], [-1, 0])), (np.array([5, 7, 8]),))
        >>> [(g.chunk, g.start, g.stop, g.chunk_start, g.global_rows().tolist()) for g in s.segments()]
        [(0, 2, 4, 0, [2, 3]), (1, 7, 9, 10, [17, 18])]
        """
        chunk, base, lo, hi = (a.tolist() for a in (self.chunk, self.base, self.lo, self.hi))
        return tuple(
            Segment(chunk[i], lo[i], hi[i], None, base[i]) if e < 0 else self.segment(i)
            for i, e in enumerate(self.ex.tolist())
        )

    def segment(self, i: int) -> Segment:
        chunk, base = int(self.chunk[i]), int(self.base[i])
        if self.ex[i] < 0:
            return Segment(chunk, int(self.lo[i]), int(self.hi[i]), None, base)
        rows = self.offsets(i)
        return Segment(chunk, int(rows.min()), int(rows.max()) + 1, rows, base)


def concat_spans(parts: Sequence[Spans], explicit: tuple[np.ndarray, ...]) -> Spans:
    if not parts:
        empty = np.zeros(0, np.int64)
        return Spans(empty, empty, empty, empty, empty, explicit)
    chunk, base, lo, hi, ex = (
        np.concatenate([getattr(p, c) for p in parts]) for c in ("chunk", "base", "lo", "hi", "ex")
    )
    return Spans(chunk, base, lo, hi, ex, explicit)


def spans_rows(spans: Spans) -> np.ndarray:
    """The global rows of all segments, in sequence order (one shuffle group's worth).

    Vectorised over segments (a group may hold thousands of small pieces); only explicit
    segments (left by a resume) are filled one by one.

    >>> s = Spans(*(np.array(v) for v in ([0, 1], [0, 10], [2, 1], [4, 3], [-1, 0])), (np.array([5, 7, 8]),))
    >>> spans_rows(s).tolist()
    [2, 3, 17, 18]
    """
    if len(spans) == 0:
        return np.zeros(0, np.int64)
    lens = spans.hi - spans.lo
    cum = spans.cum
    seg = np.repeat(np.arange(len(spans)), lens)
    rows = np.arange(int(cum[-1]), dtype=np.int64) - cum[seg] + (spans.base + spans.lo)[seg]
    for i in np.flatnonzero(spans.ex >= 0).tolist():
        rows[cum[i] : cum[i + 1]] = spans.base[i] + spans.offsets(i)
    return rows


def spans_chunks(spans: Spans) -> np.ndarray:
    """The chunk id of every row of ``spans``, in sequence order."""
    return np.repeat(spans.chunk, spans.hi - spans.lo)
