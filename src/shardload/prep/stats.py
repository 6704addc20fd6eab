"""Per-feature statistics computed block by block and merged exactly.

Features are the last axis of arrays with ndim >= 2 (reduced over rows and every other axis) and
the single value of 1-D arrays. Partials hold count, mean, M2 (sum of squared deviations), min,
max and NaN count per feature: counts int64 (a read-only broadcast constant where it is the
same for every feature), mean and M2 float64 (a one-row block's mean is the row itself), min
and max float64 or, exactly, in the block's type; :func:`merge` is Chan et al.'s parallel
update, so the result equals a single pass over all data up to round-off, whatever the block
order. :func:`finalize` gives float64 / int64 :class:`FeatureStats` whatever the partials held.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.manifest.features import FeatureStats, exact_q

#: The fields of a statistics partial that every partial has (besides the exact sums).
STAT_FIELDS = ("count", "mean", "m2", "min", "max", "nan_count")


@dataclass(frozen=True)
class Partial:
    count: np.ndarray  # int64 per feature (non-NaN values); may be a broadcast constant
    mean: np.ndarray  # float64, or a one-row block's row in its own type
    m2: np.ndarray  # float64; may be a broadcast constant
    min: np.ndarray  # float64 or the block's type (exact)
    max: np.ndarray
    nan_count: np.ndarray  # int64; may be a broadcast constant
    #: exact integer sums of the values and of their squares (int64), or None: see
    #: :class:`_Running` (mean and M2 are then ``s1 / n`` and ``(n * s2 - s1**2) / n / n``)
    s1: np.ndarray | None = None
    s2: np.ndarray | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v.tolist() for k, v in self.fields().items()}

    def fields(self) -> dict[str, np.ndarray]:
        """The arrays (the sums only where there are)."""
        keys = ("count", "mean", "m2", "min", "max", "nan_count", "s1", "s2")
        return {k: getattr(self, k) for k in keys if getattr(self, k) is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Partial:
        f = lambda k, t: np.asarray(d[k], dtype=t)  # noqa: E731
        sums = (f("s1", np.int64), f("s2", np.int64)) if "s1" in d and "s2" in d else (None, None)
        return cls(
            f("count", np.int64),
            f("mean", np.float64),
            f("m2", np.float64),
            f("min", np.float64),
            f("max", np.float64),
            f("nan_count", np.int64),
            *sums,
        )


def as_features(block: np.ndarray) -> np.ndarray:
    """View a block as (values, features)."""
    if block.ndim <= 1:
        return block.reshape(-1, 1)
    return block.reshape(-1, block.shape[-1])


_CACHE_BYTES = 1 << 18  # rows reduced at a time: about this much, so they stay in cache


def _add_rows(acc: np.ndarray, rows: np.ndarray) -> None:
    """``acc += rows.sum(axis=0)`` in float64. A few wide rows are added one by one: numpy's
    casting reduction over a short axis is many times slower than plain vector adds there."""
    if len(rows) < 16:
        for row in rows:
            np.add(acc, row, out=acc)
    else:
        acc += np.add.reduce(rows, axis=0, dtype=np.float64)


def _partial_slabs(v: np.ndarray) -> Partial | None:
    """The common case: numbers without NaN or infinity (float32 blocks whose sums are finite,
    and every integer or boolean block), float64 accumulators, no float64 copy of the block,
    and no NaN scan unless a feature's sum says there is a NaN or an infinity (then None: the
    general path).

    Rows are reduced a cache-sized slab at a time, in two passes over memory (sums, min and
    max; then deviations from the mean, rounded to the working type -- float32 for float32
    data, else float64 -- whose sum corrects that rounding): whole-block reductions would stream
    the block from memory once per operation and allocate block-sized temporaries (page
    faults, and a float64 copy of integer blocks), which cost more than writing the block.
    """
    n, nf = v.shape
    if v.dtype.kind == "b":
        v = v.view(np.uint8)
    work = np.float32 if v.dtype == np.float32 else np.float64
    step = max(1, _CACHE_BYTES // max(1, nf * np.dtype(work).itemsize))
    s1 = np.zeros(nf)
    mn: np.ndarray | None = None
    mx: np.ndarray | None = None
    for r in range(0, n, step):
        blk = v[r : r + step]
        _add_rows(s1, blk)
        lo, hi = np.minimum.reduce(blk, axis=0), np.maximum.reduce(blk, axis=0)
        mn = lo if mn is None else np.minimum(mn, lo)
        mx = hi if mx is None else np.maximum(mx, hi)
    if not np.isfinite(s1).all() or mn is None or mx is None:
        return None
    mean = s1 / n
    center = mean.astype(work)
    sd = np.zeros(nf)
    sq = np.zeros(nf)
    buf = np.empty((min(step, n), nf), work)
    for r in range(0, n, step):
        blk = v[r : r + step]
        d = buf[: len(blk)]
        np.subtract(blk, center, out=d)
        _add_rows(sd, d)
        np.multiply(d, d, out=d)
        _add_rows(sq, d)
    m2 = sq - sd * sd / n  # fixes the rounded mean
    # counts as broadcast constants (one number for every feature), min and max in the
    # block's type: exact, and 8x smaller than float64 for bytes
    return Partial(
        np.broadcast_to(np.int64(n), (nf,)),
        mean,
        np.maximum(m2, 0.0),
        mn,
        mx,
        np.broadcast_to(np.int64(0), (nf,)),
    )


def partial(block: np.ndarray) -> Partial:
    """Statistics of one block of rows."""
    v = as_features(block)
    nf = v.shape[1]
    n = v.shape[0]
    # float64 blocks: measured no faster than the general path. Integers and booleans have no
    # NaN: the general path's float64 copy of the block and its reductions over a short row
    # axis cost seconds per block of a wide grid (9.3 M uint8 features, one row per block)
    if n == 1 and v.dtype.kind in "iuf":  # one wide row (a grid per sample): itself, exactly
        row = v[0]
        if v.dtype.kind != "f" or np.isfinite(row).all():
            # read-only views: the row itself (in its own dtype; merge and finalize compute in
            # float64) for mean, min and max, broadcast constants for the rest: fresh 74 MB
            # arrays per field cost more than the rest of a 9.3 M-feature block
            def const(x: Any) -> np.ndarray:
                return np.broadcast_to(x, (nf,))

            return Partial(const(np.int64(1)), row, const(0.0), row, row, const(np.int64(0)))
    if n and (v.dtype == np.float32 or v.dtype.kind in "biu"):
        fast = _partial_slabs(v)
        if fast is not None:
            return fast
    if v.dtype.kind == "f":
        nan = np.isnan(v)
        nan_count = nan.sum(axis=0).astype(np.int64)
        has_nan = bool(nan_count.any())
    else:
        nan_count = np.zeros(nf, np.int64)
        has_nan = False
    count = (n - nan_count).astype(np.int64)
    if n == 0:
        empty = np.full(nf, np.nan)
        return Partial(count, np.zeros(nf), np.zeros(nf), empty, empty.copy(), nan_count)
    x = v.astype(np.float64, copy=False)
    with np.errstate(invalid="ignore", divide="ignore"):
        if has_nan:
            s = np.nansum(x, axis=0)
            mean = np.where(count > 0, s / np.maximum(count, 1), 0.0)
            m2 = np.nansum((x - mean) ** 2, axis=0)
            mn = np.where(count > 0, np.nanmin(np.where(nan, np.inf, x), axis=0), np.nan)
            mx = np.where(count > 0, np.nanmax(np.where(nan, -np.inf, x), axis=0), np.nan)
        else:
            mean = x.mean(axis=0)
            m2 = ((x - mean) ** 2).sum(axis=0)
            mn = x.min(axis=0)
            mx = x.max(axis=0)
    return Partial(count, mean, m2, mn.astype(np.float64), mx.astype(np.float64), nan_count)


def merge(a: Partial, b: Partial) -> Partial:
    """Combine two partials (Chan et al. 1979)."""
    n = a.count + b.count
    with np.errstate(invalid="ignore", divide="ignore"):
        delta = np.subtract(b.mean, a.mean, dtype=np.float64)  # means may be a row's dtype
        frac = np.where(n > 0, b.count / np.maximum(n, 1), 0.0)
        mean = a.mean + delta * frac
        m2 = a.m2 + b.m2 + delta**2 * a.count * frac
    f8 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    return Partial(
        n, mean, m2, np.fmin(f8(a.min), b.min), np.fmax(f8(a.max), b.max), a.nan_count + b.nan_count
    )


def merge_all(parts: Iterable[Partial]) -> Partial | None:
    out: Partial | None = None
    for p in parts:
        out = p if out is None else merge(out, p)
    return out


class OrderedMerge:
    """Partials of numbered blocks merged in block order, whatever order they arrive in
    (:func:`merge` is exact only up to round-off: one order gives one result, so a run resumed
    from a saved prefix gives the statistics of a clean run, bit for bit).

    ``next`` is the first block not merged yet; ``merged`` holds the merge of blocks
    ``start .. next - 1`` (with ``merged`` given: of blocks ``0 .. next - 1``), one
    :class:`Partial` per array name; blocks that arrive early wait in ``pending``.

    >>> m = OrderedMerge()
    >>> one = lambda v: {"x": partial(np.array([[v]], np.float32))}
    >>> m.add(1, one(3.0)); m.next, sorted(m.pending)
    (0, [1])
    >>> m.add(0, one(1.0)); m.next, float(m.merged["x"].mean[0])
    (2, 2.0)
    """

    def __init__(self, *, start: int = 0, merged: dict[str, Partial] | None = None) -> None:
        self.next = start
        self._acc = {k: _Running(p) for k, p in (merged or {}).items()}
        self._any = bool(merged)
        self.pending: dict[int, Mapping[str, Partial]] = {}

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

    def add(self, block: int, parts: Mapping[str, Partial]) -> None:
        if block < self.next or block in self.pending:
            raise ValueError(f"statistics of block {block} were merged already")
        self.pending[block] = parts
        while self.next in self.pending:
            got = self.pending.pop(self.next)
            if not self._any:
                self._acc = {k: _Running(p) for k, p in got.items()}
                self._any = True
            else:
                for k, p in got.items():
                    self._acc[k].add(p)
            self.next += 1


def _const(x: np.ndarray) -> Any:
    """The value of a broadcast constant (``np.broadcast_to`` of one value: stride 0), else
    None. Partials of one-row blocks hold their counts, NaN counts and M2 so; checking the
    stride costs nothing, where scanning 9.3 M values would cost a pass over memory."""
    if x.ndim == 1 and x.size and x.strides == (0,):
        return x[0]
    return None


#: features updated at a time by :meth:`_Running.add`: its float64 temporaries and the slices
#: of the running arrays stay in cache across the update's dozen operations
_SLAB = 65536


def _exact_row(p: Partial) -> bool:
    """A one-row block of integers of at most 16 bits (its partial is the row itself)."""
    return (
        p.s1 is None
        and p.mean.dtype.kind in "iu"
        and p.mean.dtype.itemsize <= 2
        and _const(p.count) == 1
        and _const(p.m2) == 0
        and _const(p.nan_count) == 0
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
        c = _const(first.count)
        if first.s1 is not None and first.s2 is not None and c is None and first.count.size:
            c = int(first.count[0]) if (first.count == first.count[0]).all() else None
        self._count = 0 if c is None else int(c)  # the count of every feature, or _counts
        self._counts = None if c is not None else np.array(first.count, dtype=np.int64)
        self._min, self._max = np.array(first.min), np.array(first.max)
        if self._min.dtype != self._max.dtype or self._min.dtype.kind not in "biuf":
            self._min, self._max = self._min.astype(np.float64), self._max.astype(np.float64)
        zero = _const(first.nan_count)
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
            mean, var = _exact_moments(self._s1, self._s2, self._count)
            nan = np.broadcast_to(np.int64(0), (self._nf,))
            # with the sums these figures are exactly computed from (manifest._integer_moments)
            sums = (self._count, self._s1, self._s2)
            return _feature_stats(self._count, mean, var, self._min, self._max, nan, sums)
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
        bc = _const(b.count)
        if bc is None and self._counts is None:  # counts differ by feature from now on
            self._counts = np.full(self._nf, self._count, np.int64)
        bnan = _const(b.nan_count)
        if bnan != 0 and self._nan is None:
            self._nan = np.zeros(self._nf, np.int64)
        add_m2 = _const(b.m2) != 0.0  # adding 0.0 leaves M2 as it is
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


def finalize(p: Partial, *, consume: bool = False) -> FeatureStats:
    """Population statistics (ddof=0) per feature; NaN where a feature had no finite value.

    ``consume``: the statistics may take over ``p``'s float64 arrays (its mean; its M2 becomes
    the std), which must then be used no more: for millions of features, fresh arrays (page
    faults, copies) cost more than the arithmetic."""
    c = _const(p.count)
    if p.s1 is not None and p.s2 is not None and c is None and p.count.size:
        c = p.count[0] if (p.count == p.count[0]).all() else None
    if p.s1 is not None and p.s2 is not None and c is not None and c > 0:
        mean, var = _exact_moments(p.s1, p.s2, int(c))
    elif c is not None and c > 0:  # one count for every feature: the same values, fewer passes
        own = consume and p.m2.dtype == np.float64 and p.m2.flags.writeable
        var = np.true_divide(p.m2, np.int64(c), out=p.m2 if own else None)
        mean = p.mean if consume else np.array(p.mean, dtype=np.float64)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            var = np.where(p.count > 0, p.m2 / np.maximum(p.count, 1), np.nan)
            mean = np.where(p.count > 0, p.mean, np.nan)
    count = int(p.count.max()) if c is None and p.count.size else int(c or 0)
    return _feature_stats(count, mean, var, p.min, p.max, p.nan_count)


def _feature_stats(
    count: int,
    mean: np.ndarray,
    var: np.ndarray,
    mn: np.ndarray,
    mx: np.ndarray,
    nan_count: np.ndarray,
    exact_sums: tuple[int, np.ndarray, np.ndarray] | None = None,
) -> FeatureStats:
    """The statistics, taking over ``mean`` and ``var`` (which becomes the std)."""
    np.maximum(var, 0, out=var)
    nan = _const(nan_count)
    return FeatureStats.of_arrays(
        count=count,
        exact_sums=exact_sums,
        mean=mean,
        std=np.sqrt(var, out=var),
        min=np.array(mn, dtype=np.float64),
        max=np.array(mx, dtype=np.float64),
        nan_count=np.zeros(nan_count.shape, np.int64)
        if nan == 0
        else np.array(nan_count, dtype=np.int64),
    )


def _exact_moments(s1: np.ndarray, s2: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Mean and variance (float64) from exact integer sums: ``s1 / n`` and ``(n * s2 - s1**2)
    / n**2``, each one float64 division of exact values (``manifest.decode_features``
    computes the same from the stored integers). A slab at a time: no full-size temporaries."""
    nf = len(s1)
    mean, var = np.empty(nf), np.empty(nf)
    nd, nn = np.float64(n), np.float64(n * n)
    for a in range(0, nf, _SLAB):
        z = slice(a, a + _SLAB)
        np.true_divide(exact_q(s1[z], s2[z], n), nn, out=var[z])  # exact q: below 2**62
        np.true_divide(s1[z], nd, out=mean[z])
    return mean, var
