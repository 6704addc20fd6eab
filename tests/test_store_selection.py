"""Open-time selection and combination of dated stores (``shardload.select``, ``join``,
``concat``; issue #27): every result's values equal numpy on the stores' own rows (through
``Store.read``, ``iter_batches`` and ``window=K``), its time axis and missing rows are right,
a concatenation's statistics equal numpy over both stores' rows, and bad options are errors
naming the option.
"""

from __future__ import annotations

import pickle

import numpy as np
import pytest

import shardload
from _resume import assert_resumes_exactly
from _stores import make_store
from dated_fixtures import START, dated_store, set_time_axis
from shardload.errors import PlanError
from shardload.manifest.features import FeatureStats
from shardload.manifest.merge import merge_feature_stats

H6 = np.timedelta64(6, "h")
MISS_A = (3, 4, 9)
MISS_B = (2,)


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sel")
    a = dated_store(tmp, n=40, missing=MISS_A, splits={"all": 1.0}, name="a")
    z = dated_store(
        tmp, n=40, missing=(5,), fmt="zarr", compression="zstd", splits={"all": 1.0}, name="z"
    )
    b = dated_store(tmp, n=12, missing=MISS_B, chunk_rows=4, splits={"all": 1.0}, name="b")
    b = set_time_axis(tmp / "b", start=START + 40 * H6, missing=MISS_B)  # right after a
    g = dated_store(tmp, n=12, missing=MISS_B, chunk_rows=4, splits={"all": 1.0}, name="g")
    g = set_time_axis(tmp / "g", start=START + 43 * H6, missing=MISS_B)  # 3 dates after a
    return {"a": a, "z": z, "b": b, "g": g}


def rows(store, name="x"):
    return store.read(name, 0, len(store))


def batches(store, **kw):
    got = list(shardload.iter_batches(store, batch_size=5, shuffle=False, **kw))
    return {k: np.concatenate([b[k] for b in got]) for k in got[0]}


def test_time_selection_rows_dates_and_missing(st):
    a = st["a"]
    s = shardload.select(a, start="2020-01-01T12", end="2020-01-07", frequency="12h")
    assert len(s) == 12 and s.time.start == np.datetime64("2020-01-01T12")
    assert s.time.frequency_text == "12h"
    np.testing.assert_array_equal(s.time.dates, a.time.dates[2:25:2])
    assert s.time.missing == (1,)  # row 4 of a; rows 3 and 9 are not selected
    for name in ("x", "y"):
        np.testing.assert_array_equal(rows(s, name), rows(a, name)[2:25:2])
        np.testing.assert_array_equal(s.read(name, 3, 8), rows(a, name)[8:17:2])
    # a chunk of the selection lies in one chunk of a (5 rows: 2 selected rows each)
    b = np.asarray(a.chunk_bounds)
    for lo, hi in zip(s.chunk_bounds[:-1], s.chunk_bounds[1:], strict=True):
        first, last = 2 + 2 * lo, 2 + 2 * (hi - 1)
        assert np.searchsorted(b, first, "right") == np.searchsorted(b, last, "right")
    got = batches(s)  # missing_dates="skip": the row of 2020-01-02T00 left out
    keep = [i for i in range(12) if i != 1]
    np.testing.assert_array_equal(got["index"], keep)
    np.testing.assert_array_equal(got["x"], rows(a)[2:25:2][keep])
    with pytest.raises(PlanError, match="missing_dates='error'"):
        batches(s, missing_dates="error")


def test_time_selection_of_a_compressed_store_and_defaults(st):
    z = st["z"]
    s = shardload.select(z, frequency="18h")
    np.testing.assert_array_equal(rows(s), rows(z)[::3])
    assert s.time.missing == () and s.time.start == z.time.start and len(s) == 14
    s = shardload.select(z, end="2020-01-02T06")
    np.testing.assert_array_equal(rows(s), rows(z)[:6])
    assert s.time.missing == (5,) and s.manifest.splits == {}


def test_windows_over_a_selection(st):
    a = st["a"]
    s = shardload.select(a, start="2020-01-02T06", frequency="12h")
    full, dates, seen = rows(a), a.time.dates, []
    for batch in shardload.iter_batches(s, batch_size=4, window=3, seed=1):
        for i, r in enumerate(batch["index"].tolist()):
            base = 5 + 2 * r  # row of a
            np.testing.assert_array_equal(batch["x"][i], full[base : base + 6 : 2])
            np.testing.assert_array_equal(batch["dates"][i], dates[base : base + 6 : 2])
            seen.append(r)
    # windows of 3 selected dates (rows 5, 7, 9, ... of a) that touch none of a's rows 9
    want = [r for r in range(len(s) - 2) if 9 not in {5 + 2 * (r + j) for j in range(3)}]
    assert sorted(seen) == want


def test_arrays_selected_dropped_renamed_in_order(st):
    a = st["a"]
    s = shardload.select(a, arrays=["y", "x"], rename={"x": "state"})
    assert s.arrays == ("y", "state")
    np.testing.assert_array_equal(rows(s, "state"), rows(a, "x"))
    assert s.manifest.stats["state"] == a.manifest.stats["x"]
    assert s.manifest.splits == a.manifest.splits and s.chunk_bounds == a.chunk_bounds
    assert s.time == a.time
    d = shardload.select(a, drop=["x"])
    assert d.arrays == ("y",) and set(d.manifest.stats) == {"y"}
    got = batches(d)
    assert set(got) == {"y", "index"}
    np.testing.assert_array_equal(got["y"], np.delete(rows(a, "y"), MISS_A, axis=0))


def test_join_same_dates_more_arrays(st):
    a, z = st["a"], st["z"]
    j = shardload.join(a, shardload.select(z, rename={"x": "x2", "y": "y2"}))
    assert j.arrays == ("x", "y", "x2", "y2")
    assert j.time.missing == (3, 4, 5, 9)  # missing in either
    np.testing.assert_array_equal(rows(j, "x2"), rows(z))
    np.testing.assert_array_equal(j.read("x", 7, 23), rows(a)[7:23])
    assert j.manifest.stats["x2"] == z.manifest.stats["x"]
    got = batches(j)
    keep = [i for i in range(40) if i not in (3, 4, 5, 9)]
    np.testing.assert_array_equal(got["x"], rows(a)[keep])
    np.testing.assert_array_equal(got["y2"], rows(z, "y")[keep])


def test_join_errors_name_the_disagreement(st):
    a, b, z = st["a"], st["b"], st["z"]
    with pytest.raises(PlanError, match=r"join: array 'x' is in .*a and in .*z.*rename"):
        shardload.join(a, z)
    with pytest.raises(PlanError, match=r"b\) starts at 2020-01-11T00:00:00, .*a 2020-01-01"):
        shardload.join(a, shardload.select(b, rename={"x": "u", "y": "v"}))
    with pytest.raises(PlanError, match=r"a\) has a length of 30, .*a 40"):
        shardload.join(a, shardload.select(a, end="2020-01-08T06", rename={"x": "u", "y": "v"}))


def test_concat_adjacent_and_with_a_gap(st):
    a, b, g = st["a"], st["b"], st["g"]
    c = shardload.concat(a, b)
    assert len(c) == 52 and c.time.start == a.time.start and c.time.end == b.time.end
    assert c.time.missing == (*MISS_A, 42)
    for name in ("x", "y"):
        np.testing.assert_array_equal(rows(c, name), np.concatenate([rows(a, name), rows(b, name)]))
    np.testing.assert_array_equal(c.read("x", 37, 45), np.concatenate([rows(a)[37:], rows(b)[:5]]))
    c = shardload.concat(a, g)
    assert len(c) == 55 and c.time.missing == (*MISS_A, 40, 41, 42, 45)
    np.testing.assert_array_equal(rows(c)[43:], rows(g))
    assert np.isnan(rows(c)[40:43]).all() and (rows(c, "y")[40:43] == 0).all()
    got = batches(c)  # the gap's dates are never served
    keep = [i for i in range(55) if i not in c.time.missing]
    np.testing.assert_array_equal(got["index"], keep)
    np.testing.assert_array_equal(got["x"], rows(c)[keep])
    assert not np.isnan(got["x"]).any()


def test_concat_statistics_are_those_of_both_stores_rows(st):
    a, b = st["a"], st["b"]
    c = shardload.concat(a, b)
    for name in ("x", "y"):
        both = np.concatenate(
            [np.delete(rows(a, name), MISS_A, 0), np.delete(rows(b, name), MISS_B, 0)]
        )
        both = both.astype("f8")
        s = c.manifest.stats[name]
        assert s.count == len(both) == 37 + 11
        np.testing.assert_allclose(s.mean, both.mean(0), rtol=1e-12)
        np.testing.assert_allclose(s.std, both.std(0), rtol=1e-9)
        np.testing.assert_array_equal(s.min, both.min(0))
        np.testing.assert_array_equal(s.max, both.max(0))
        assert not s.nan_count.any()


def test_concat_windows_across_the_seam_and_resume(st):
    a, b = st["a"], st["b"]
    c = shardload.concat(a, b)
    full, seen = rows(c), []
    for batch in shardload.iter_batches(c, batch_size=4, window=4, seed=2):
        for i, r in enumerate(batch["index"].tolist()):
            np.testing.assert_array_equal(batch["x"][i], full[r : r + 4])
            np.testing.assert_array_equal(batch["dates"][i], c.time.dates[r : r + 4])
            seen.append(r)
    bad = set(c.time.missing)
    assert sorted(seen) == [r for r in range(len(c) - 3) if not bad & set(range(r, r + 4))]
    assert 38 in seen  # a window over the seam (rows 38-41: two of a, two of b)
    assert_resumes_exactly(c, world=2, workers=2, batch_size=3, window=3, shuffle=True)
    again = pickle.loads(pickle.dumps(c))  # as DataLoader workers get it
    np.testing.assert_array_equal(rows(again), full)


def test_concat_errors_name_the_store(st):
    a, b, g = st["a"], st["b"], st["g"]
    with pytest.raises(PlanError, match=r"b\) has frequency 12h, .*a 6h"):
        shardload.concat(a, shardload.select(b, frequency="12h"))
    with pytest.raises(PlanError, match=r"a starts at 2020-01-01T00:00:00, .*not a date after"):
        shardload.concat(b, a)
    with pytest.raises(PlanError, match=r"g has arrays \['x', 'y'\], select\(.*a\) \['x'\]"):
        shardload.concat(shardload.select(a, arrays=["x"]), g)
    with pytest.raises(PlanError, match="concat needs two stores"):
        shardload.concat(a)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"start": "2020-01-01T03"}, r"start='2020-01-01T03'.* not on this time axis"),
        ({"end": "2021-01-01"}, r"end='2021-01-01'.* not on this time axis"),
        ({"frequency": "9h"}, r"frequency='9h' is not a multiple of the native frequency 6h"),
        ({"frequency": "3h"}, r"frequency='3h' is not a multiple"),
        ({"start": "2020-01-03", "end": "2020-01-02"}, r"end='2020-01-02' comes before start"),
        ({"arrays": ["x", "w"]}, r"arrays=: array\(s\) \['w'\] not in store"),
        ({"drop": ["w"]}, r"drop=: array\(s\) \['w'\] not in store"),
        ({"rename": {"w": "v"}}, r"rename=: array\(s\) \['w'\] not in store"),
        ({"rename": {"x": "y"}}, r"rename=: two arrays .* would be named 'y'"),
        ({"drop": ["x", "y"]}, "leave no array"),
        ({"arrays": "x"}, "give a list of array names"),
    ],
)
def test_select_errors_name_the_option(st, kw, match):
    with pytest.raises(PlanError, match=match):
        shardload.select(st["a"], **kw)


def test_time_options_need_a_dated_store(tmp_path):
    plain = make_store(tmp_path)
    with pytest.raises(PlanError, match="has no time axis"):
        shardload.select(plain, start="2020-01-01")
    assert shardload.select(plain, arrays=[plain.arrays[0]]).arrays == (plain.arrays[0],)


def test_time_selection_statistics_are_the_underlying_stores(st):
    a = st["a"]
    s = shardload.select(a, start="2020-01-03", frequency="12h", rename={"x": "u"})
    assert s.manifest.stats["u"] == a.manifest.stats["x"]
    entry = s.manifest.time["statistics"]
    assert entry["of"][0]["store"] == a.url and "selected from" in entry["rows"]
    # two periods of one store: their statistics are the store's, not their rows': no merge
    c = shardload.concat(
        shardload.select(a, end="2020-01-05"), shardload.select(a, start="2020-01-06")
    )
    assert dict(c.manifest.stats) == {} and "none" in c.manifest.time["statistics"]["rows"]
    np.testing.assert_array_equal(
        rows(c), np.concatenate([rows(a)[:17], np.full((3, 24), np.nan), rows(a)[20:]])
    )
    assert c.time.missing == (*MISS_A, 17, 18, 19)


def _stats(v: np.ndarray, exact: bool = False) -> FeatureStats:
    valid = ~np.isnan(v)
    n = valid.sum(0)
    sums = None
    if exact:
        iv = v.astype(np.int64)
        sums = (len(v), iv.sum(0), (iv * iv).sum(0))
    return FeatureStats(
        int(n.max()),
        np.nanmean(v, 0),
        np.nanstd(v, 0),
        np.nanmin(v, 0),
        np.nanmax(v, 0),
        (~valid).sum(0),
        sums,
    )


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's of a feature without values
def test_merged_statistics_with_nan_and_exact_sums():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(30, 4)), rng.normal(3, 2, size=(17, 4))
    x[:5, 1] = np.nan  # per-feature counts differ
    y[:, 2] = np.nan  # a feature with no value in y
    y[3, 0] = np.nan
    both = np.concatenate([x, y])
    m = merge_feature_stats(_stats(x), _stats(y))
    np.testing.assert_allclose(m.mean, np.nanmean(both, 0), rtol=1e-12)
    np.testing.assert_allclose(m.std, np.nanstd(both, 0), rtol=1e-12)
    np.testing.assert_array_equal(m.nan_count, np.isnan(both).sum(0))
    np.testing.assert_array_equal(m.min, np.nanmin(both, 0))
    assert m.count == 47  # the most values of a feature (feature 3: every row)
    i, j = rng.integers(-1000, 1000, (30, 3)), rng.integers(0, 10**6, (9, 3))
    e = merge_feature_stats(_stats(i.astype("f8"), True), _stats(j.astype("f8"), True))
    ij = np.concatenate([i, j])
    assert e.exact_sums is not None and e.exact_sums[0] == 39
    np.testing.assert_array_equal(e.exact_sums[1], ij.sum(0))
    np.testing.assert_allclose(e.mean, ij.mean(0), rtol=1e-15)
    np.testing.assert_allclose(e.std, ij.std(0), rtol=1e-13)


def test_torch_datasets_read_a_combination(st):
    pytest.importorskip("torch")
    from shardload.torch import MapDataset, StreamingDataLoader, StreamingDataset

    c = shardload.concat(st["a"], st["g"])
    keep = [i for i in range(len(c)) if i not in c.time.missing]
    full = rows(c)
    ds = MapDataset(c)
    assert len(ds) == len(keep)
    np.testing.assert_array_equal(np.asarray(ds[len(keep) - 1]["x"]), full[keep[-1]])
    seen = []
    loader = StreamingDataLoader(StreamingDataset(c, batch_size=4, seed=1), num_workers=2)
    for b in loader:
        idx = b["index"].numpy()
        np.testing.assert_array_equal(b["x"].numpy(), full[idx])
        seen += idx.tolist()
    assert sorted(seen) == keep


def test_variables_need_an_anemoi_store(st):
    with pytest.raises(PlanError, match=r"variables=.*anemoi-datasets store's array 'data'"):
        shardload.select(st["a"], variables=["t2m"])


def test_tendency_statistics_follow_the_selection(tmp_path):
    import xarray as xr

    rng = np.random.default_rng(0)
    t = rng.normal(size=(16, 2, 3)).cumsum(0).astype("f4")
    dates = START + np.arange(16) * H6
    xr.Dataset({"t": (("time", "lat", "lon"), t)}, coords={"time": dates}).to_netcdf(
        tmp_path / "t.nc"
    )
    store = shardload.prepare(
        {
            "source": str(tmp_path / "t.nc"),
            "sample_dims": ["time"],
            "arrays": {"x": ["t"]},
            "chunk_rows": 4,
            "dates": {"statistics": "all", "tendencies": [1, 2]},
            "out": str(tmp_path / "s"),
        }
    )
    stats = store.manifest.stats
    r = shardload.select(store, rename={"x": "u"})
    assert r.manifest.stats["u/tendency_2"] == stats["x/tendency_2"]
    assert r.manifest.time["tendencies"] == [1, 2]
    s = shardload.select(store, frequency="12h", rename={"x": "u"})
    # one step of the selection is two of the store
    assert s.manifest.stats["u/tendency_1"] == stats["x/tendency_2"]
    assert "u/tendency_2" not in s.manifest.stats and s.manifest.time["tendencies"] == [1]
    assert s.manifest.stats["u"] == stats["x"]


def test_to_xarray_of_a_selection_has_its_rows_and_no_stale_coordinates(st):
    pytest.importorskip("dask")
    a = st["a"]
    s = shardload.select(a, frequency="12h")
    ds = s.to_xarray()
    np.testing.assert_array_equal(ds["x"].values, rows(a)[::2])
    assert "time" not in ds.coords  # prepare's coordinates describe a's rows, not these
    assert "time" in a.to_xarray().coords


def test_planner_doctests():
    import doctest

    from shardload.manifest import combine, merge

    for module in (combine, merge):
        result = doctest.testmod(module)
        assert result.failed == 0 and result.attempted > 0


@pytest.mark.parametrize("fmt", ["a", "z"])
def test_time_selections_sweep_equal_numpy(st, fmt):
    store = st[fmt]
    full, dates, missing = rows(store), store.time.dates, set(store.time.missing)
    for r0, r1, step in [(0, 39, 1), (1, 38, 3), (7, 7, 1), (4, 36, 4), (0, 39, 7), (13, 29, 5)]:
        s = shardload.select(store, start=dates[r0], end=dates[r1], frequency=f"{6 * step}h")
        base = list(range(r0, r1 + 1, step))
        assert len(s) == len(base)
        np.testing.assert_array_equal(s.time.dates, dates[base])
        assert s.time.missing == tuple(i for i, r in enumerate(base) if r in missing)
        np.testing.assert_array_equal(rows(s), full[base])
        keep = [i for i, r in enumerate(base) if r not in missing]
        got = batches(s)
        np.testing.assert_array_equal(got["index"], keep)
        np.testing.assert_array_equal(got["y"], rows(store, "y")[base][keep])
