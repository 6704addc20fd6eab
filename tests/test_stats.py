import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.stats import finalize, merge_all, partial


@settings(max_examples=50, deadline=None)
@given(
    st.integers(1, 200),
    st.integers(1, 5),
    st.lists(st.integers(1, 60), min_size=1, max_size=6),
    st.booleans(),
)
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_merged_block_stats_equal_numpy(n, f, cuts, with_nan):
    rng = np.random.default_rng(n * 7 + f)
    x = (rng.normal(size=(n, f)) * 10 + 3).astype("float32")
    if with_nan:
        x[rng.integers(0, n, size=max(1, n // 10)), rng.integers(0, f)] = np.nan
    bounds = sorted({0, n, *[c % (n + 1) for c in cuts]})
    st_ = finalize(merge_all(partial(x[a:b]) for a, b in itertools.pairwise(bounds)))
    x64 = x.astype("float64")
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(st_.mean, np.nanmean(x64, axis=0), rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(st_.std, np.nanstd(x64, axis=0), rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(st_.min, np.nanmin(x64, axis=0))
        np.testing.assert_allclose(st_.max, np.nanmax(x64, axis=0))
    assert list(st_.nan_count) == np.isnan(x).sum(axis=0).tolist()


def test_features_are_last_axis():
    x = np.arange(2 * 3 * 4, dtype="float32").reshape(2, 3, 4)
    s = finalize(partial(x))
    np.testing.assert_allclose(s.mean, x.reshape(-1, 4).mean(0))
    assert s.count == 6


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_infinities_take_the_general_path():
    x = np.ones((6, 2), dtype="float32")
    x[2, 1] = np.inf
    s = finalize(partial(x))
    assert (
        s.max.tolist() == [1.0, float("inf")]
        and s.mean[0] == 1.0
        and s.nan_count.tolist() == [0, 0]
    )
    assert np.isinf(s.mean[1]) or np.isnan(s.mean[1])
