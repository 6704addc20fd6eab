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


@pytest.mark.parametrize("bad", [None, np.nan, np.inf])
def test_float32_blocks_larger_than_one_cache_slab(monkeypatch, bad):
    """The float32 path reduces a few rows at a time: many slabs give numpy's figures, and a
    NaN or infinity in any slab falls back to the general path."""
    import shardload.stats as stats

    monkeypatch.setattr(stats, "_CACHE_BYTES", 64)  # 4 rows of 4 features per slab
    rng = np.random.default_rng(3)
    x = (rng.normal(size=(1003, 4)) * 100 + 7).astype("float32")
    if bad is not None:
        x[777, 2] = bad
    p = partial(x)
    x64 = x.astype("float64")
    with np.errstate(all="ignore"):
        if bad is np.nan:
            assert p.nan_count.tolist() == [0, 0, 1, 0]
            np.testing.assert_allclose(p.mean, np.nanmean(x64, axis=0), rtol=1e-12)
        else:
            np.testing.assert_allclose(p.mean, x64.mean(axis=0), rtol=1e-12)
            np.testing.assert_array_equal(p.min, x64.min(axis=0))
            np.testing.assert_array_equal(p.max, x64.max(axis=0))
        if bad is None:
            m2 = ((x64 - x64.mean(axis=0)) ** 2).sum(axis=0)
            np.testing.assert_allclose(p.m2, m2, rtol=1e-7)  # float32 squares, as before


@pytest.mark.parametrize("dtype", ["uint8", "int64", "float64", "bool"])
def test_other_dtypes_give_numpys_figures(monkeypatch, dtype):
    import shardload.stats as stats

    monkeypatch.setattr(stats, "_CACHE_BYTES", 64)
    rng = np.random.default_rng(5)
    x = rng.integers(0, 255, size=(501, 3)).astype(dtype)
    if dtype == "int64":
        x = x * 10**12 - 7
    p = partial(x)
    x64 = x.astype("float64")
    np.testing.assert_allclose(p.mean, x64.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(p.m2, ((x64 - x64.mean(axis=0)) ** 2).sum(axis=0), rtol=1e-9)
    np.testing.assert_array_equal(p.min, x64.min(axis=0))
    np.testing.assert_array_equal(p.max, x64.max(axis=0))
    assert p.nan_count.tolist() == [0, 0, 0] and p.count.tolist() == [501] * 3
