"""Per-feature statistics computed block by block and merged exactly.

Features are the last axis of arrays with ndim >= 2 (reduced over rows and every other axis) and
the single value of 1-D arrays. Partials hold count, mean, M2 (sum of squared deviations), min,
max and NaN count per feature, in float64; :func:`merge` is Chan et al.'s parallel update, so the
result equals a single pass over all data up to round-off, whatever the block order.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from .manifest import FeatureStats


@dataclass(frozen=True)
class Partial:
    count: np.ndarray  # int64 per feature (non-NaN values)
    mean: np.ndarray
    m2: np.ndarray
    min: np.ndarray
    max: np.ndarray
    nan_count: np.ndarray

    def to_dict(self) -> dict[str, Any]:
        return {
            k: getattr(self, k).tolist() for k in ("count", "mean", "m2", "min", "max", "nan_count")
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Partial:
        f = lambda k, t: np.asarray(d[k], dtype=t)  # noqa: E731
        return cls(
            f("count", np.int64), f("mean", np.float64), f("m2", np.float64),
            f("min", np.float64), f("max", np.float64), f("nan_count", np.int64),
        )  # fmt: skip


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
    return Partial(
        np.full(nf, n, np.int64), mean, np.maximum(m2, 0.0),
        mn.astype(np.float64), mx.astype(np.float64), np.zeros(nf, np.int64),
    )  # fmt: skip


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
        self.merged = {k: r.partial for k, r in self._acc.items()} if merged else None
        self.pending: dict[int, Mapping[str, Partial]] = {}

    def add(self, block: int, parts: Mapping[str, Partial]) -> None:
        if block < self.next or block in self.pending:
            raise ValueError(f"statistics of block {block} were merged already")
        self.pending[block] = parts
        while self.next in self.pending:
            got = self.pending.pop(self.next)
            if self.merged is None:
                self._acc = {k: _Running(p) for k, p in got.items()}
            else:
                for k, p in got.items():
                    self._acc[k].add(p)
            self.merged = {k: r.partial for k, r in self._acc.items()}
            self.next += 1


class _Running:
    """A :class:`Partial` updated in place: :func:`merge`'s arithmetic, operation for operation
    (the same results, bit for bit), into arrays allocated once. Wide arrays (millions of
    features, a block per sample) spent more on allocating each merge's arrays than on
    computing them."""

    def __init__(self, first: Partial) -> None:
        nf = first.count.shape
        own = lambda x, t: np.array(np.broadcast_to(x, nf), dtype=t)  # noqa: E731
        self.partial = Partial(
            own(first.count, np.int64), own(first.mean, np.float64), own(first.m2, np.float64),
            own(first.min, np.float64), own(first.max, np.float64), own(first.nan_count, np.int64),
        )  # fmt: skip
        self._n = np.empty(nf, np.int64)
        self._frac = np.empty(nf)
        self._delta = np.empty(nf)
        self._term = np.empty(nf)

    def add(self, b: Partial) -> None:
        a, n, frac, delta, term = self.partial, self._n, self._frac, self._delta, self._term
        np.add(a.count, b.count, out=n)
        np.maximum(n, 1, out=n)
        # merge()'s where(n > 0, ...) is this: n == 0 implies b.count == 0
        np.true_divide(b.count, n, out=frac)
        np.subtract(b.mean, a.mean, out=delta)
        np.multiply(delta, frac, out=term)
        np.add(a.mean, term, out=a.mean)
        np.square(delta, out=term)
        np.multiply(term, a.count, out=term)
        np.multiply(term, frac, out=term)
        np.add(a.m2, b.m2, out=a.m2)
        np.add(a.m2, term, out=a.m2)
        np.add(a.count, b.count, out=a.count)
        np.fmin(a.min, b.min, out=a.min)
        np.fmax(a.max, b.max, out=a.max)
        np.add(a.nan_count, b.nan_count, out=a.nan_count)


def finalize(p: Partial) -> FeatureStats:
    """Population statistics (ddof=0) per feature; NaN where a feature had no finite value."""
    with np.errstate(invalid="ignore", divide="ignore"):
        var = np.where(p.count > 0, p.m2 / np.maximum(p.count, 1), np.nan)
        mean = np.where(p.count > 0, p.mean, np.nan)
    return FeatureStats(
        count=int(p.count.max()) if p.count.size else 0,
        mean=mean,
        std=np.sqrt(np.maximum(var, 0)),
        min=np.asarray(p.min, np.float64),
        max=np.asarray(p.max, np.float64),
        nan_count=np.asarray(p.nan_count, np.int64),
    )
