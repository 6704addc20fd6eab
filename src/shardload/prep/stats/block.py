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

from shardload.prep.stats import kernel

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
    #: :class:`~shardload.prep.stats.ordered._Running` (mean and M2 are then ``s1 / n`` and ``(n * s2 - s1**2) / n / n``)
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


#: :func:`_partial_slabs` checks its running sums after each slab of at least this many rows
_CHECK_ROWS = 64


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
    # few features: a sum that is no longer finite stops the pass (a NaN block, a packed
    # field's _FillValue, goes to the NaN path at its first slab holding one, not after a
    # whole pass of sums, min and max); checking is cheap where a slab holds many rows
    check = step >= _CHECK_ROWS
    if work is np.float32 and kernel.KERNEL is not None and v.flags.c_contiguous:
        got = kernel.sums_f32(v, step, check=check)  # the same bits, one call, no GIL
        return None if got is None else _slab_partial(n, *got)
    s1 = np.zeros(nf)
    mn: np.ndarray | None = None
    mx: np.ndarray | None = None
    for r in range(0, n, step):
        blk = v[r : r + step]
        _add_rows(s1, blk)
        if check and not np.isfinite(s1).all():
            return None
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
    return _slab_partial(n, s1, sd, sq, mn, mx)


def _slab_partial(
    n: int, s1: np.ndarray, sd: np.ndarray, sq: np.ndarray, mn: np.ndarray, mx: np.ndarray
) -> Partial:
    """The partial of ``n`` rows from :func:`_partial_slabs`' sums."""
    nf = len(s1)
    m2 = sq - sd * sd / n  # fixes the rounded mean
    # counts as broadcast constants (one number for every feature), min and max in the
    # block's type: exact, and 8x smaller than float64 for bytes
    return Partial(
        np.broadcast_to(np.int64(n), (nf,)),
        s1 / n,
        np.maximum(m2, 0.0),
        mn,
        mx,
        np.broadcast_to(np.int64(0), (nf,)),
    )


def _partial_slabs_nan(v: np.ndarray) -> Partial | None:
    """Float blocks with NaN (a packed field's ``_FillValue`` over land): as
    :func:`_partial_slabs`, a cache-sized slab at a time in two passes, the NaN of each slab
    counted and left out of the sums (no float64 copy of the block, no block-sized masks).
    None when a sum is not finite without them (an infinity: the general path)."""
    n, nf = v.shape
    work = np.float32 if v.dtype == np.float32 else np.float64
    step = max(1, _CACHE_BYTES // max(1, nf * np.dtype(work).itemsize))
    s1, nans = np.zeros(nf), np.zeros(nf, np.int64)
    mn, mx = np.full(nf, np.nan, v.dtype), np.full(nf, np.nan, v.dtype)
    buf = np.empty((min(step, n), nf), work)
    for r in range(0, n, step):
        blk = v[r : r + step]
        nan = np.isnan(blk)
        nans += np.add.reduce(nan, axis=0, dtype=np.int64)
        d = buf[: len(blk)]
        np.copyto(d, blk)
        np.copyto(d, 0, where=nan)  # as ``d[nan] = 0``, without gathering the NaN's indices
        _add_rows(s1, d)
        np.fmin(mn, np.fmin.reduce(blk, axis=0), out=mn)  # fmin / fmax skip NaN
        np.fmax(mx, np.fmax.reduce(blk, axis=0), out=mx)
    if not np.isfinite(s1).all():
        return None
    count = n - nans
    mean = np.where(count > 0, s1 / np.maximum(count, 1), 0.0)
    center = mean.astype(work)
    sd, sq = np.zeros(nf), np.zeros(nf)
    for r in range(0, n, step):
        blk = v[r : r + step]
        d = buf[: len(blk)]
        np.subtract(blk, center, out=d)
        np.copyto(d, 0, where=np.isnan(d))  # NaN rows: nothing; finite ones stay finite
        _add_rows(sd, d)
        np.multiply(d, d, out=d)
        _add_rows(sq, d)
    m2 = np.where(count > 0, sq - sd * sd / np.maximum(count, 1), 0.0)  # fixes the rounded mean
    f8 = lambda x: np.asarray(x, np.float64)  # noqa: E731
    return Partial(count, mean, np.maximum(m2, 0.0), f8(mn), f8(mx), nans)


#: A block of fewer features is reduced as rows of about this many values (:func:`_narrow`)
_WIDE_VALUES = 256


def _narrow(v: np.ndarray) -> Partial | None:
    """A block of few features (a window series' levels, a grid point's one value) reduced as
    rows of about :data:`_WIDE_VALUES` values: its first ``m`` rows viewed as ``m / k`` rows
    of ``k`` copies of the features, whose ``k`` partials are then folded per feature (Chan
    et al.), the last ``n - m`` rows merged apart. numpy's reductions along a long axis of
    4 columns run at a few tens of MB/s (1.6 s of a 3.8 s window prepare on 70 MB); of 256
    columns, at memory speed (one column is contiguous, fast as it is). None when the block is
    not narrow, short or contiguous."""
    n, nf = v.shape
    k = _WIDE_VALUES // max(1, nf)
    if nf < 2 or k < 4 or n < 4 * k or not v.flags.c_contiguous or v.dtype.kind not in "biuf":
        return None
    m = n // k * k
    wide = partial(v[:m].reshape(m // k, k * nf))
    if not np.isfinite(wide.mean).all():  # an infinity: the general path's figures
        return None
    p = _fold(wide, k, nf)
    return merge(p, partial(v[m:])) if m < n else p


def _fold(p: Partial, k: int, nf: int) -> Partial:
    """The partial of ``nf`` features from one of ``k * nf`` (``k`` groups of the same
    features): counts and NaN counts summed, mean and M2 combined (Chan et al.), min and max
    in the partial's own type."""

    def groups(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.broadcast_to(x, (k * nf,))).reshape(k, nf)

    counts = groups(p.count)
    count = counts.sum(axis=0)
    means = groups(p.mean).astype(np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = np.where(count > 0, (counts * means).sum(axis=0) / np.maximum(count, 1), 0.0)
        dev = np.where(counts > 0, counts * (means - mean) ** 2, 0.0)
    return Partial(
        count,
        mean,
        groups(p.m2).sum(axis=0) + dev.sum(axis=0),
        np.fmin.reduce(groups(p.min), axis=0),
        np.fmax.reduce(groups(p.max), axis=0),
        groups(p.nan_count).sum(axis=0),
    )


def empty_partial(nf: int) -> Partial:
    """The partial of no rows: broadcast constants (count 0, min and max NaN), no memory per
    feature (a dated block outside the statistics period: 1.6 GB of zeros at N320 before)."""

    def const(x: Any) -> np.ndarray:
        return np.broadcast_to(x, (nf,))

    zero, nan = np.float64(0.0), np.float64(np.nan)
    return Partial(
        const(np.int64(0)), const(zero), const(zero), const(nan), const(nan), const(np.int64(0))
    )


def partial(block: np.ndarray) -> Partial:
    """Statistics of one block of rows."""
    v = as_features(block)
    nf = v.shape[1]
    n = v.shape[0]
    if n == 0:
        return empty_partial(nf)
    narrow = _narrow(v)
    if narrow is not None:
        return narrow
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
    if n and v.dtype.kind == "f":  # a NaN or an infinity in the block
        with np.errstate(invalid="ignore"):
            fast = _partial_slabs_nan(v)
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
        return empty_partial(nf)
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


def broadcast_value(x: np.ndarray) -> Any:
    """The value of a broadcast constant (``np.broadcast_to`` of one value: stride 0), else
    None. Partials of one-row blocks hold their counts, NaN counts and M2 so; checking the
    stride costs nothing, where scanning 9.3 M values would cost a pass over memory."""
    if x.ndim == 1 and x.size and x.strides == (0,):
        return x[0]
    return None
