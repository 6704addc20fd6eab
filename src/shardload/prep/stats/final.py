"""From a merged partial to the stored statistics: population mean, std, min, max and NaN
count per feature, exactly from integer sums where a partial carries them."""

from __future__ import annotations

import numpy as np

from shardload.manifest.features import FeatureStats, exact_q
from shardload.prep.stats.block import Partial, broadcast_value

#: features divided at a time by :func:`exact_moments`: no full-size temporaries
_SLAB = 65536


def finalize(p: Partial, *, consume: bool = False) -> FeatureStats:
    """Population statistics (ddof=0) per feature; NaN where a feature had no finite value.

    ``consume``: the statistics may take over ``p``'s float64 arrays (its mean; its M2 becomes
    the std), which must then be used no more: for millions of features, fresh arrays (page
    faults, copies) cost more than the arithmetic."""
    c = broadcast_value(p.count)
    if p.s1 is not None and p.s2 is not None and c is None and p.count.size:
        c = p.count[0] if (p.count == p.count[0]).all() else None
    if p.s1 is not None and p.s2 is not None and c is not None and c > 0:
        mean, var = exact_moments(p.s1, p.s2, int(c))
    elif c is not None and c > 0:  # one count for every feature: the same values, fewer passes
        own = consume and p.m2.dtype == np.float64 and p.m2.flags.writeable
        var = np.true_divide(p.m2, np.int64(c), out=p.m2 if own else None)
        mean = p.mean if consume else np.array(p.mean, dtype=np.float64)
    else:
        with np.errstate(invalid="ignore", divide="ignore"):
            var = np.where(p.count > 0, p.m2 / np.maximum(p.count, 1), np.nan)
            mean = np.where(p.count > 0, p.mean, np.nan)
    count = int(p.count.max()) if c is None and p.count.size else int(c or 0)
    return feature_stats(count, mean, var, p.min, p.max, p.nan_count)


def feature_stats(
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
    nan = broadcast_value(nan_count)
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


def exact_moments(s1: np.ndarray, s2: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
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
