"""The exact merge of two stores' per-feature statistics (a concatenation's), without reading
a row: what :class:`~shardload.manifest.features.FeatureStats` keep is enough.

A feature's values not NaN are ``n_f = total - nan_count_f``, where ``total`` (values per
feature, NaN or not) is the same for every feature of an array: ``count`` (the largest
``n_f``) plus the smallest ``nan_count``. Means and variances merge by Chan et al.'s update
(float64, as prepare merges its blocks), or exactly from the integer sums (``exact_sums``)
where both stores carry them and no feature has a NaN. Min, max and NaN counts merge exactly.
"""

from __future__ import annotations

import numpy as np

from shardload.manifest.features import FeatureStats, exact_q


def _valid_counts(s: FeatureStats) -> np.ndarray:
    """Values not NaN of each feature (int64)."""
    nan = np.broadcast_to(s.nan_count, s.mean.shape).astype(np.int64)
    total = s.count + (int(nan.min()) if nan.size else 0)
    return total - nan


def merge_feature_stats(a: FeatureStats, b: FeatureStats) -> FeatureStats:
    """The statistics of the values of ``a`` and of ``b`` together (population std).

    >>> x, y = np.array([[1.0], [2.0]]), np.array([[4.0], [8.0], [9.0]])
    >>> s = lambda v: FeatureStats(len(v), v.mean(0), v.std(0), v.min(0), v.max(0), [0])
    >>> m = merge_feature_stats(s(x), s(y))
    >>> z = np.concatenate([x, y])
    >>> bool(np.allclose(m.mean, z.mean(0)) and np.allclose(m.std, z.std(0))), m.count
    (True, 5)
    """
    if a.mean.shape != b.mean.shape:
        raise ValueError(f"statistics of {a.mean.size} and {b.mean.size} features do not merge")
    nan = a.nan_count + b.nan_count
    mn, mx = np.fmin(a.min, b.min), np.fmax(a.max, b.max)
    ea, eb = a.exact_sums, b.exact_sums
    if ea is not None and eb is not None and not nan.any():
        n = ea[0] + eb[0]
        s1, s2 = ea[1] + eb[1], ea[2] + eb[2]
        if n > 0 and float(np.abs(s2).max(initial=0)) * n < 2.0**62:
            mean = s1 / np.float64(n)
            var = exact_q(s1, s2, n) / np.float64(n * n)
            return FeatureStats(n, mean, np.sqrt(np.maximum(var, 0)), mn, mx, nan, (n, s1, s2))
    na, nb = _valid_counts(a), _valid_counts(b)
    n = na + nb
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(n > 0, nb / np.maximum(n, 1), np.nan)
        ma, mb = np.where(na > 0, a.mean, 0.0), np.where(nb > 0, b.mean, 0.0)
        delta = mb - ma
        mean = np.where(n > 0, ma + delta * w, np.nan)
        m2 = (
            np.where(na > 0, a.std**2 * na, 0.0)
            + np.where(nb > 0, b.std**2 * nb, 0.0)
            + delta**2 * na * w
        )
        var = np.where(n > 0, m2 / np.maximum(n, 1), np.nan)
    count = int(n.max()) if n.size else a.count + b.count
    return FeatureStats(count, mean, np.sqrt(np.maximum(var, 0)), mn, mx, nan)
