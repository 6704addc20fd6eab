"""Partials merged in block order, in place: :class:`OrderedMerge` (what ``prepare`` runs as
blocks are recorded) over running arrays allocated once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from shardload.manifest.features import FeatureStats, exact_q
from shardload.prep.stats.block import Partial, broadcast_value
from shardload.prep.stats.final import exact_moments, feature_stats, finalize

#: features updated at a time by :meth:`_Running.add`: its float64 temporaries and the slices
#: of the running arrays stay in cache across the update's dozen operations
_SLAB = 65536


class OrderedMerge:
    """Partials of numbered blocks merged in block order, whatever order they arrive in
    (:func:`merge` is exact only up to round-off: one order gives one result, so a run resumed
    from a saved prefix gives the statistics of a clean run, bit for bit).

    ``next`` is the first block not merged yet; ``merged`` holds the merge of blocks
    ``start .. next - 1`` (with ``merged`` given: of blocks ``0 .. next - 1``), one
    :class:`Partial` per array name; blocks that arrive early wait in ``pending``.

    >>> from shardload.prep.stats.block import partial
    >>> m = OrderedMerge()
    >>> one = lambda v: {"x": partial(np.array([[v]], np.float32))}
    >>> m.add(1, one(3.0)); m.next, sorted(m.pending)
    (0, [1])
    >>> m.add(0, one(1.0)); m.next, float(m.merged["x"].mean[0])
    (2, 2.0)
    """

    def __init__(
        self,
        *,
        start: int = 0,
        merged: dict[str, Partial] | None = None,
        notes: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        self.next = start
        self._acc = {k: _Running(p) for k, p in (merged or {}).items()}
        self._any = bool(merged)
        self.pending: dict[int, tuple[Mapping[str, Partial], Mapping[str, np.ndarray]]] = {}
        self._notes: dict[str, list[np.ndarray]] = {k: [v] for k, v in (notes or {}).items()}

    def notes(self) -> dict[str, np.ndarray]:
        """The notes of the blocks merged (small arrays a block adds beside its partials, e.g.
        a dated store's missing rows), each concatenated in block order."""
        return {k: np.concatenate(v) for k, v in self._notes.items()}

    @property
    def started(self) -> bool:
        """Whether a block was merged (or a saved prefix given)."""
        return self._any

    @property
    def merged(self) -> dict[str, Partial] | None:
        """The merge so far, one :class:`Partial` per array (None before the first block):
        built on access (exact sums become mean and M2 then)."""
        return {k: r.partial for k, r in self._acc.items()} if self._any else None

    def finalize(self) -> dict[str, FeatureStats]:
        """The statistics of what was merged, one per array (:func:`finalize`, taking over the
        running arrays: add nothing after this)."""
        return {k: r.finalize() for k, r in self._acc.items()}

    def add(
        self,
        block: int,
        parts: Mapping[str, Partial],
        notes: Mapping[str, np.ndarray] | None = None,
    ) -> None:
        if block < self.next or block in self.pending:
            raise ValueError(f"statistics of block {block} were merged already")
        self.pending[block] = (parts, notes or {})
        while self.next in self.pending:
            got, got_notes = self.pending.pop(self.next)
            for k, v in got_notes.items():
                self._notes.setdefault(k, []).append(np.asarray(v))
            if not self._any:
                self._acc = {k: _Running(p) for k, p in got.items()}
                self._any = True
            else:
                for k, p in got.items():
                    self._acc[k].add(p)
            self.next += 1


def _exact_row(p: Partial) -> bool:
    """A one-row block of integers of at most 16 bits (its partial is the row itself)."""
    return (
        p.s1 is None
        and p.mean.dtype.kind in "iu"
        and p.mean.dtype.itemsize <= 2
        and broadcast_value(p.count) == 1
        and broadcast_value(p.m2) == 0
        and broadcast_value(p.nan_count) == 0
    )


def _row_bound(row: np.ndarray) -> int:
    """The largest magnitude in an integer row (0 for none)."""
    return max(abs(int(row.min())), abs(int(row.max()))) if row.size else 0


#: exact sums while ``(n * bound) ** 2`` stays below this: ``s1 ** 2``, ``n * s2`` and their
#: difference are then exact in int64
_EXACT_LIMIT = 1 << 62


class _Running:
    """A :class:`Partial` updated in place, into arrays allocated once. Wide arrays (millions of
    features, a block per sample) spent more on allocating each merge's arrays than on
    computing them, and then on streaming a dozen 9.3 M-value arrays through memory per merge.

    One-row blocks of integers of at most 16 bits (a wide grid, one sample per block) are
    summed exactly: ``s1`` and ``s2``, the sums of the values and of their squares, in int64,
    while ``(n * max |value|) ** 2 < 2**62`` (uint8: 8.4 M rows at least; the largest magnitude
    of the values seen, which a saved prefix's min and max give back). Mean and M2 come from them
    (:attr:`partial`, :func:`finalize`): the mean is ``s1 / n`` correctly rounded, M2 from the
    exact ``n * s2 - s1 ** 2``. Any other block (or more rows) turns the sums into mean and M2
    once, then goes on as below; the order of blocks decides which, so a resumed run (its
    saved prefix carries the sums) gives a clean run's figures bit for bit.

    Otherwise :func:`merge`'s arithmetic, operation for operation (the same results, bit for
    bit), a cache-sized slab of features at a time; a count that is the same for every
    feature is one number (its arithmetic is the array's, value for value); NaN counts stay
    absent while all zero, an all-zero M2 is not added; min and max stay in the blocks' type
    while every block has the same (uint8 data: 1 byte per feature; min and max commute with
    the exact widening to float64)."""

    def __init__(self, first: Partial) -> None:
        self._nf = nf = first.count.shape[0]
        self._s1: np.ndarray | None = None
        self._s2: np.ndarray | None = None
        self._bound = 0
        c = broadcast_value(first.count)
        if first.s1 is not None and first.s2 is not None and c is None and first.count.size:
            c = int(first.count[0]) if (first.count == first.count[0]).all() else None
        self._count = 0 if c is None else int(c)  # the count of every feature, or _counts
        self._counts = None if c is not None else np.array(first.count, dtype=np.int64)
        self._min, self._max = np.array(first.min), np.array(first.max)
        if self._min.dtype != self._max.dtype or self._min.dtype.kind not in "biuf":
            self._min, self._max = self._min.astype(np.float64), self._max.astype(np.float64)
        zero = broadcast_value(first.nan_count)
        if zero is None and first.s1 is not None and not first.nan_count.any():
            zero = 0
        self._nan = None if zero == 0 else np.array(first.nan_count, dtype=np.int64)
        self._delta = np.empty(min(nf, _SLAB))
        self._term = np.empty(min(nf, _SLAB))
        self._square = np.empty(min(nf, _SLAB), np.int64)
        if _exact_row(first):
            self._bound = _row_bound(first.mean)
            self._s1 = np.array(first.mean, dtype=np.int64)
            self._s2 = np.square(self._s1)
        elif first.s1 is not None and first.s2 is not None and c is not None and zero == 0:
            # a saved prefix: its sums, and a bound from its min and max
            self._bound = int(max(np.abs(self._min).max(), np.abs(self._max).max(), 0))
            self._s1 = np.array(first.s1, dtype=np.int64)
            self._s2 = np.array(first.s2, dtype=np.int64)
        if self._s1 is None:
            self._mean = np.array(first.mean, dtype=np.float64)
            self._m2 = np.array(np.broadcast_to(first.m2, (nf,)), dtype=np.float64)

    def _moments(self) -> tuple[np.ndarray, np.ndarray]:
        """Mean and M2 from the exact sums."""
        assert self._s1 is not None and self._s2 is not None
        n = self._count
        q = exact_q(self._s1, self._s2, n)
        return np.true_divide(self._s1, n), np.true_divide(q, n, out=q.astype(np.float64))

    @property
    def partial(self) -> Partial:
        """The merge so far (views of the running arrays: read it before the next ``add``)."""
        nf = (self._nf,)
        if self._counts is None:
            count = np.broadcast_to(np.int64(self._count), nf)
        else:
            count = self._counts
        nan = np.broadcast_to(np.int64(0), nf) if self._nan is None else self._nan
        if self._s1 is not None:
            mean, m2 = self._moments()
            return Partial(count, mean, m2, self._min, self._max, nan, self._s1, self._s2)
        return Partial(count, self._mean, self._m2, self._min, self._max, nan)

    def finalize(self) -> FeatureStats:
        """:func:`finalize` of :attr:`partial` (exact sums: without mean and M2 first)."""
        if self._s1 is not None and self._s2 is not None and self._count > 0:
            mean, var = exact_moments(self._s1, self._s2, self._count)
            nan = np.broadcast_to(np.int64(0), (self._nf,))
            # with the sums these figures are exactly computed from (manifest._integer_moments)
            sums = (self._count, self._s1, self._s2)
            return feature_stats(self._count, mean, var, self._min, self._max, nan, sums)
        return finalize(self.partial, consume=True)

    def add(self, b: Partial) -> None:
        if b.min.dtype != self._min.dtype or b.max.dtype != self._max.dtype:
            self._min, self._max = self._min.astype(np.float64), self._max.astype(np.float64)
        if self._s1 is not None:
            if _exact_row(b):
                bound = max(self._bound, _row_bound(b.mean))
                if ((self._count + 1) * bound) ** 2 < _EXACT_LIMIT:
                    self._bound = bound
                    self._add_exact(b)
                    return
            self._mean, self._m2 = self._moments()  # from now on, mean and M2
            self._s1 = self._s2 = None
        self._add_moments(b)

    def _add_exact(self, b: Partial) -> None:
        assert self._s1 is not None and self._s2 is not None
        for a in range(0, self._nf, _SLAB):
            z = slice(a, a + _SLAB)
            row, s1, s2 = b.mean[z], self._s1[z], self._s2[z]
            sq = self._square[: len(row)]
            np.add(s1, row, out=s1)
            np.multiply(row, row, out=sq, dtype=np.int64)
            np.add(s2, sq, out=s2)
            np.fmin(self._min[z], b.min[z], out=self._min[z])
            np.fmax(self._max[z], b.max[z], out=self._max[z])
        self._count += 1

    def _add_moments(self, b: Partial) -> None:
        bc = broadcast_value(b.count)
        if bc is None and self._counts is None:  # counts differ by feature from now on
            self._counts = np.full(self._nf, self._count, np.int64)
        bnan = broadcast_value(b.nan_count)
        if bnan != 0 and self._nan is None:
            self._nan = np.zeros(self._nf, np.int64)
        add_m2 = broadcast_value(b.m2) != 0.0  # adding 0.0 leaves M2 as it is
        if self._counts is None:
            n = max(self._count + int(bc), 1)
            # merge()'s where(n > 0, ...) is this: n == 0 implies b.count == 0
            frac_s: Any = np.true_divide(np.int64(bc), np.int64(n))
            count_s: Any = np.float64(self._count)
            self._count += int(bc)
        else:
            total = np.add(self._counts, b.count)
            frac_all = np.true_divide(b.count, np.maximum(total, 1))
        for a in range(0, self._nf, _SLAB):
            z = slice(a, a + _SLAB)
            mean, m2 = self._mean[z], self._m2[z]
            delta, term = self._delta[: len(mean)], self._term[: len(mean)]
            if self._counts is None:
                frac, count = frac_s, count_s
            else:
                frac, count = frac_all[z], self._counts[z]
            np.subtract(b.mean[z], mean, out=delta)
            np.multiply(delta, frac, out=term)
            np.add(mean, term, out=mean)
            np.square(delta, out=term)
            np.multiply(term, count, out=term)
            np.multiply(term, frac, out=term)
            if add_m2:
                np.add(m2, b.m2[z], out=m2)
            np.add(m2, term, out=m2)
            np.fmin(self._min[z], b.min[z], out=self._min[z])
            np.fmax(self._max[z], b.max[z], out=self._max[z])
        if self._counts is not None:
            self._counts[:] = total
        if bnan != 0:
            assert self._nan is not None
            np.add(self._nan, b.nan_count, out=self._nan)
