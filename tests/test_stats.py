import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardload.prep.stats import finalize, merge_all, partial


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
    import shardload.prep.stats.block as stats

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
    import shardload.prep.stats.block as stats

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


def _blocks(dtype: str, nf: int, sizes: list[int], seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    out = []
    for n in sizes:
        if dtype == "uint8":
            b = rng.integers(0, 255, (n, nf), dtype=np.uint8)
        else:
            b = (rng.normal(size=(n, nf)) * 50 + 7).astype(dtype)
            if n and seed % 2:  # NaNs in some blocks (and in a one-row block)
                b[rng.integers(0, n, 3), rng.integers(0, nf, 3)] = np.nan
        out.append(b)
    return out


def _bits(p):
    return [
        np.asarray(np.broadcast_to(getattr(p, f), p.mean.shape), np.float64).tobytes()
        for f in ("count", "mean", "m2", "min", "max", "nan_count")
    ]


def _exact_figures(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and std of integer rows from exact integer sums, correctly rounded division."""
    n = len(x)
    v = x.astype(np.int64)
    s1, s2 = v.sum(axis=0), np.square(v).sum(axis=0)
    return s1 / np.float64(n), np.sqrt((n * s2 - s1 * s1) / np.float64(n * n))


def _resumed(parts, k, fields=("count", "mean", "m2", "min", "max", "nan_count", "s1", "s2")):
    """A run resumed after ``k`` blocks: the saved prefix (as the pipeline saves it) + the rest."""
    from shardload.prep.stats import OrderedMerge, Partial

    pre = OrderedMerge()
    for i in range(k):
        pre.add(i, {"x": parts[i]})
    saved = {f: np.array(v) for f, v in pre.merged["x"].fields().items() if f in fields}
    again = OrderedMerge(start=k, merged={"x": Partial.from_dict(saved)})
    for i in range(k, len(parts)):
        again.add(i, {"x": parts[i]})
    return again.merged["x"]


@pytest.mark.parametrize("dtype", ["uint8", "float32", "float64"])
@pytest.mark.parametrize(
    "sizes", [[1] * 12, [3, 1, 1, 5, 1, 2], [1, 7, 1, 1]], ids=["one-row", "mixed", "few"]
)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_ordered_merge_in_place_equals_merge_bit_for_bit(monkeypatch, dtype, sizes, seed):
    """The in-place merge of wide arrays (slabs of features, one count for all features, min
    and max in the data's type) gives :func:`merge`'s results bit for bit, whatever the arrival
    order, resumed from a saved prefix too; finalized, numpy's figures. One-row blocks of
    uint8 only: exact sums, the exactly rounded mean and std."""
    import shardload.prep.stats.ordered as stats
    from shardload.prep.stats import OrderedMerge

    monkeypatch.setattr(stats, "_SLAB", 1000)
    nf = 2_500  # slabs of the in-place update: two whole, one partial
    blocks = _blocks(dtype, nf, sizes, seed)
    parts = [partial(b) for b in blocks]
    exact = dtype == "uint8" and set(sizes) == {1}
    order = np.random.default_rng(seed).permutation(len(parts))
    m = OrderedMerge()
    for i in order:
        m.add(int(i), {"x": parts[i]})
    assert m.next == len(parts)
    want = m.merged["x"] if exact else merge_all(parts)
    assert _bits(m.merged["x"]) == _bits(want)
    assert (m.merged["x"].s1 is not None) == exact
    for k in (1, len(parts) // 2):  # a resumed run
        assert _bits(_resumed(parts, k)) == _bits(want)
        assert finalize(_resumed(parts, k)) == finalize(m.merged["x"])
    st = finalize(m.merged["x"])
    if not exact:
        assert st == finalize(want)
    x = np.concatenate(blocks).astype(np.float64)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(st.mean, np.nanmean(x, axis=0), rtol=1e-10)
        # float32 data: float32 squares
        np.testing.assert_allclose(st.std, np.nanstd(x, axis=0), rtol=1e-7, atol=1e-9)
        np.testing.assert_array_equal(st.min, np.nanmin(x, axis=0))
        np.testing.assert_array_equal(st.max, np.nanmax(x, axis=0))
    if exact:
        mean, std = _exact_figures(np.concatenate(blocks))
        assert st.mean.tobytes() == mean.tobytes() and st.std.tobytes() == std.tobytes()
    np.testing.assert_array_equal(st.nan_count, np.isnan(x).sum(axis=0))
    assert st.count == int((~np.isnan(x)).sum(axis=0).max())
    assert all(getattr(st, f).dtype == np.float64 for f in ("mean", "std", "min", "max"))
    assert finalize(m.merged["x"], consume=True) == st  # the running arrays taken over
    driver = OrderedMerge()
    for i in range(len(parts)):
        driver.add(i, {"x": parts[i]})
    assert driver.finalize()["x"] == st  # what the pipeline calls


@pytest.mark.parametrize(
    ("dtype", "top", "limit"),
    [("int16", 32767, 3 * 32767), ("int16", 32767, 1000 * 32767), ("uint8", 9, 4 * 255)],
)
def test_exact_sums_of_integer_rows_until_they_could_overflow(monkeypatch, dtype, top, limit):
    """One-row integer blocks: exact sums while ``(n * largest magnitude)**2`` stays below the
    limit, then mean and M2 (Chan) from there on; a resumed run (whose saved prefix gives the
    largest magnitude back through min and max) gives the same figures bit for bit."""
    import shardload.prep.stats.ordered as stats

    monkeypatch.setattr(stats, "_EXACT_LIMIT", limit**2)
    rng = np.random.default_rng(4)
    x = rng.integers(-top if dtype == "int16" else 0, top, (9, 300)).astype(dtype)
    x[:, 0] = top  # one constant feature: std exactly 0
    parts = [partial(x[i : i + 1]) for i in range(len(x))]
    clean = _resumed(parts, len(parts))
    bound = int(np.abs(x.astype(np.int64)).max())
    assert (clean.s1 is not None) == (len(x) * bound < limit)
    for k in (1, 2, 4, 8):
        assert _bits(_resumed(parts, k)) == _bits(clean)
    st = finalize(clean)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(st.mean, x64.mean(0), rtol=1e-12, atol=1e-9)
    np.testing.assert_allclose(st.std, x64.std(0), rtol=1e-10)
    assert st.std[0] == 0.0 and st.mean[0] == top
    if clean.s1 is not None:
        mean, std = _exact_figures(x)
        assert st.mean.tobytes() == mean.tobytes() and st.std.tobytes() == std.tobytes()


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")  # numpy's, column 2
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blocks_with_nan_are_reduced_slab_by_slab(dtype):
    """A float block with NaN (a packed field's fill value over land) is reduced a cache-sized
    slab at a time: no float64 copy of the block nor block-sized masks (the general path made
    several), and numpy's figures (the 9.3 M-sample netCDF-4 case of issue 29 spent 0.74 s of
    a 3.1 s prepare in the general path)."""
    import tracemalloc

    rng = np.random.default_rng(5)
    x = (rng.normal(size=(400_000, 3)) * 10 + 3).astype(dtype)
    x[rng.random(x.shape) < 0.2] = np.nan
    x[:, 2] = np.nan  # a feature of NaN only
    tracemalloc.start()
    p = partial(x)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < x.nbytes / 4, (peak, x.nbytes)
    x64 = x[:, :2].astype("float64")
    with np.errstate(all="ignore"):
        assert p.nan_count.tolist() == np.isnan(x).sum(axis=0).tolist()
        assert p.count.tolist() == (~np.isnan(x)).sum(axis=0).tolist()
        np.testing.assert_allclose(p.mean[:2], np.nanmean(x64, axis=0), rtol=1e-12)
        m2 = np.nansum((x64 - np.nanmean(x64, axis=0)) ** 2, axis=0)
        np.testing.assert_allclose(p.m2[:2], m2, rtol=1e-7)
        np.testing.assert_array_equal(p.min[:2], np.nanmin(x64, axis=0))
        np.testing.assert_array_equal(p.max[:2], np.nanmax(x64, axis=0))
    assert p.mean[2] == 0 and p.m2[2] == 0 and np.isnan(p.min[2]) and np.isnan(p.max[2])


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")  # numpy's, column 2
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64", "int16", "uint8"])
@pytest.mark.parametrize("n", [1003, 4096])  # a tail of rows past the widened ones, and none
def test_narrow_blocks_give_numpys_figures(dtype, n):
    """A block of few features (a window series' levels) is reduced as wide rows and folded
    per feature: numpy's figures, min and max exact in the block's type, NaN counted."""
    rng = np.random.default_rng(11)
    x = (rng.normal(size=(n, 3)) * 100 + 7).astype(dtype)
    if dtype.startswith("float"):
        x[rng.random(x.shape) < 0.1] = np.nan
        x[:, 2] = np.nan  # a feature of NaN only
    p = partial(x)
    x64 = x.astype("float64")
    ok = ~np.all(np.isnan(x64), axis=0)
    with np.errstate(all="ignore"):
        mean = np.nanmean(x64, axis=0)
        np.testing.assert_allclose(p.mean[ok], mean[ok], rtol=1e-12)
        m2 = np.nansum((x64 - mean) ** 2, axis=0)
        np.testing.assert_allclose(p.m2[ok], m2[ok], rtol=1e-6)
        np.testing.assert_array_equal(p.min[ok], np.nanmin(x64, axis=0)[ok])
        np.testing.assert_array_equal(p.max[ok], np.nanmax(x64, axis=0)[ok])
    assert p.nan_count.tolist() == np.isnan(x64).sum(axis=0).tolist()
    assert p.count.tolist() == (~np.isnan(x64)).sum(axis=0).tolist()
    if not ok[2]:
        assert p.mean[2] == 0 and p.m2[2] == 0 and np.isnan(p.min[2]) and np.isnan(p.max[2])


def test_narrow_blocks_cost_about_what_wide_ones_do():
    """numpy reduces a long axis of 4 columns at a few tens of MB/s (1.6 s of a 3.8 s window
    prepare on 70 MB, issue 29): a (n, 4) block costs about what the same bytes as rows of
    256 features cost (before: 8-30x), best of 5 to ride out a loaded machine."""
    import time

    x = np.random.default_rng(0).normal(size=(1 << 20, 4)).astype("float32")  # 16 MiB
    wide = x.reshape(-1, 256)

    def best(block: np.ndarray) -> float:
        times = []
        for _ in range(5):
            t = time.thread_time()
            partial(block)
            times.append(time.thread_time() - t)
        return min(times)

    narrow_s, wide_s = best(x), best(wide)
    assert narrow_s < 3 * wide_s, (narrow_s, wide_s)


def test_a_nan_in_the_first_slab_stops_the_finite_pass_at_that_slab(monkeypatch):
    """A block of few features with NaN (a packed field's ``_FillValue`` over land: one float32
    feature per grid point) leaves the finite path at the first slab whose sum is NaN, not
    after a whole pass of sums, min and max over the block (0.05 s to 0.04 s of CPU for the
    9.3 M samples of issue 29's packed netCDF-4 case); its figures are the NaN path's."""
    import shardload.prep.stats.block as stats
    from shardload.prep.stats import kernel

    monkeypatch.setattr(kernel, "KERNEL", None)  # numpy's path (the kernel's: test_stats_kernel)
    rng = np.random.default_rng(11)
    x = (rng.normal(size=(400_000, 1)) * 10 + 3).astype("float32")
    x[rng.random(x.shape) < 0.2] = np.nan
    assert np.isnan(x[:100]).any()
    calls = []
    add_rows = stats._add_rows
    monkeypatch.setattr(
        stats, "_add_rows", lambda acc, rows: (calls.append(len(rows)), add_rows(acc, rows))
    )
    assert stats._partial_slabs(stats.as_features(x)) is None
    assert len(calls) == 1, calls  # one slab summed, then the NaN path
    monkeypatch.setattr(stats, "_add_rows", add_rows)
    p, q = partial(x), stats._partial_slabs_nan(stats.as_features(x))
    for f in ("count", "mean", "m2", "min", "max", "nan_count"):
        np.testing.assert_array_equal(getattr(p, f), getattr(q, f))
