"""prepare writes dated stores (issue #27): the time axis of a flat view over time, missing
dates (gaps and all-NaN states) found and checked against the declared ones, statistics over
the train split only, tendency statistics; stores whose samples are not dates unchanged."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr

import shardload
from shardload.errors import ConfigError, NaNError, StoreError, ViewError
from shardload.manifest.consistency import check_manifest_consistent
from shardload.manifest.time import tendency_key

DATES = pd.date_range("2020-01-01", periods=40, freq="6h")
GAPS = [7, 8]  # rows of the dates the file lacks
NAN_STATE = 20  # a state that is all NaN in the file


def series() -> xr.Dataset:
    """40 dates every 6 h (an ERA5-like state per date: t on levels, z at the surface), the
    state of row 20 all NaN; the file lacks the dates of rows 7 and 8."""
    rng = np.random.default_rng(0)
    t = rng.normal(size=(40, 3, 4, 5)).cumsum(0).astype("f4")  # tendencies differ from states
    z = (rng.normal(size=(40, 4, 5)) * 10 + 100).astype("f4")
    t[NAN_STATE], z[NAN_STATE] = np.nan, np.nan
    dims = ("time", "level", "lat", "lon")
    ds = xr.Dataset(
        {"t": (dims, t), "z": (dims[:1] + dims[2:], z)},
        coords={"time": DATES, "level": [500, 700, 850]},
    )
    keep = np.ones(40, bool)
    keep[GAPS] = False
    return ds.isel(time=keep)


@pytest.fixture(scope="module")
def src(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dated") / "era5-like.nc"
    series().to_netcdf(path)
    return path


def config(src: Path, out: Path, **kw):
    c = {
        "source": str(src),
        "sample_dims": ["time"],
        "arrays": {"x": ["t", "z"]},
        "chunk_rows": 3,
        "out": str(out),
    }
    c.update(kw)
    return c


def expected_rows() -> np.ndarray:
    """The store's rows: every date of the axis, NaN where the file lacks the date."""
    ds = series()
    x = np.concatenate([ds.t.values.reshape(38, -1), ds.z.values.reshape(38, -1)], axis=1)
    out = np.full((40, x.shape[1]), np.nan, "f4")
    out[np.setdiff1d(np.arange(40), GAPS)] = x
    return out


def split_rows(store, split: str) -> np.ndarray:
    m = store.manifest
    return np.concatenate([np.arange(*m.chunk_range(c)) for c in sorted(m.splits[split])])


def assert_stats(st, values: np.ndarray) -> None:
    values = values.astype(np.float64)
    np.testing.assert_allclose(st.mean, values.mean(axis=0), rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(st.std, values.std(axis=0), rtol=1e-6, atol=1e-9)
    np.testing.assert_array_equal(st.min, values.min(axis=0))
    np.testing.assert_array_equal(st.max, values.max(axis=0))
    assert st.count == len(values)


def test_time_axis_missing_dates_and_coordinate(tmp_path, src, caplog):
    with caplog.at_level(logging.INFO, logger="shardload.prep.driver"):
        store = shardload.prepare(config(src, tmp_path / "s"))
    axis = store.time
    assert axis is not None and axis == store.manifest.time_axis
    assert len(store) == axis.length == 40
    assert axis.frequency_text == "6h" and axis.start == np.datetime64("2020-01-01T00:00")
    np.testing.assert_array_equal(axis.dates, DATES.values.astype("datetime64[s]"))
    assert axis.missing == (*GAPS, NAN_STATE)
    np.testing.assert_array_equal(store.read("x"), expected_rows())  # NaN rows for the gaps
    np.testing.assert_array_equal(store.to_xarray()["time"].values, DATES.values)
    found = [r.getMessage() for r in caplog.records if "missing date" in r.getMessage()]
    assert len(found) == 1 and "2020-01-02T18:00:00" in found[0]  # logged once, with dates
    assert "2020-01-06T00:00:00" in found[0]  # the all-NaN state's date


def test_statistics_cover_the_train_split_without_missing_dates(tmp_path, src):
    store = shardload.prepare(config(src, tmp_path / "s"))
    x = expected_rows()
    train = np.setdiff1d(split_rows(store, "train"), [*GAPS, NAN_STATE])
    assert len(train) < 38  # val and test rows are left out
    assert_stats(store.manifest.stats["x"], x[train])
    period = store.manifest.time["statistics"]
    assert period["period"] == "train" and period["num_dates"] == len(train)
    covered = np.concatenate([np.arange(a, b) for a, b in period["rows"]])
    np.testing.assert_array_equal(covered, split_rows(store, "train"))
    # every row instead: the option
    every = shardload.prepare(config(src, tmp_path / "all", dates={"statistics": "all"}))
    present = np.setdiff1d(np.arange(40), [*GAPS, NAN_STATE])
    assert_stats(every.manifest.stats["x"], x[present])
    assert every.manifest.time["statistics"]["rows"] == [[0, 40]]


def tendency_values(x: np.ndarray, use: np.ndarray, k: int) -> np.ndarray:
    """numpy over the whole series: x[t+k] - x[t] (in x's float32) where both rows are used,
    as float64 for the statistics."""
    pair = use[:-k] & use[k:]
    return (x[k:] - x[:-k])[pair].astype(np.float64)


@pytest.mark.parametrize(
    "layout", [{"chunk_rows": 3}, {"chunk_rows": 1}, {"chunk_rows": 2, "shard_chunks": 3}]
)
def test_tendency_statistics_equal_numpy_over_the_whole_series(tmp_path, src, layout):
    c = config(src, tmp_path / "s", dates={"statistics": "all", "tendencies": [1, 2]}, **layout)
    store = shardload.prepare(c)
    x = expected_rows()
    use = ~store.time.missing_mask
    for k in (1, 2):
        st = store.manifest.stats[tendency_key("x", k)]
        assert_stats(st, tendency_values(x, use, k))
    # over the train split: pairs whose two dates are both in it
    train = shardload.prepare(config(src, tmp_path / "t", **layout))
    use = np.zeros(40, bool)
    use[split_rows(train, "train")] = True
    use &= ~train.time.missing_mask
    assert_stats(train.manifest.stats["x/tendency_1"], tendency_values(x, use, 1))
    assert "x/tendency_2" not in train.manifest.stats  # default steps: [1]


def test_parallel_and_sequential_runs_give_the_same_statistics(tmp_path, src):
    one = shardload.prepare(config(src, tmp_path / "a", execution="sync"))
    two = shardload.prepare(
        config(src, tmp_path / "b", execution={"scheduler": "threads", "num_workers": 2})
    )
    for name in ("x", "x/tendency_1"):
        a, b = one.manifest.stats[name], two.manifest.stats[name]
        for f in ("mean", "std", "min", "max"):
            np.testing.assert_array_equal(getattr(a, f), getattr(b, f))


def test_declared_missing_dates_agree(tmp_path, src):
    declared = ["2020-01-02T18:00", "2020-01-03T00:00", "2020-01-06T00:00"]
    store = shardload.prepare(config(src, tmp_path / "s", dates={"missing": declared}))
    assert store.time.missing == (*GAPS, NAN_STATE)


def test_declared_missing_dates_that_disagree_are_an_error_naming_them(tmp_path, src):
    # a declared date with data, and the all-NaN state not declared
    declared = ["2020-01-02T18:00", "2020-01-03T00:00", "2020-01-05T00:00"]
    with pytest.raises(ViewError) as exc:
        shardload.prepare(config(src, tmp_path / "s", dates={"missing": declared}))
    msg = str(exc.value)
    assert "declared missing have data: 2020-01-05T00:00:00" in msg
    assert "not declared missing: 2020-01-06T00:00:00" in msg
    # a gap not declared: before anything is written
    with pytest.raises(ViewError, match=r"lacks 1 date.*2020-01-03T00:00:00"):
        shardload.prepare(
            config(src, tmp_path / "g", dates={"missing": ["2020-01-02T18:00", "2020-01-06"]})
        )
    assert not (tmp_path / "g.partial").exists()
    with pytest.raises(ConfigError, match="2020-01-01T01:00:00 not on the time axis"):
        shardload.prepare(config(src, tmp_path / "o", dates={"missing": ["2020-01-01T01:00"]}))


def test_integer_arrays_with_gaps_are_refused_naming_the_array(tmp_path, src):
    with pytest.raises(ViewError, match=r"array 'x' is int32.*2020-01-02T18:00:00.*dtype: float32"):
        shardload.prepare(config(src, tmp_path / "s", dtype="int32", nan="ignore"))


def test_nan_fail_counts_values_not_missing_states(tmp_path, src):
    store = shardload.prepare(config(src, tmp_path / "s", nan="fail"))  # gaps + a NaN state
    assert store.time.missing == (*GAPS, NAN_STATE)
    ds = series().load()
    ds.t.values[30, 0, 0, 0] = np.nan  # one NaN value in a state that has data
    path = tmp_path / "one-nan.nc"
    ds.to_netcdf(path)
    with pytest.raises(NaNError, match=r"array 'x' \(t\[500,0,0\]\) in chunk 10"):
        shardload.prepare(config(path, tmp_path / "n", nan="fail", splits={"train": 0.5}))


def test_stores_whose_samples_are_not_dates_are_unchanged(tmp_path, src, caplog):
    ds = series()
    # grid points as samples: not dated, statistics over every row
    grid = shardload.prepare(
        config(src, tmp_path / "grid", sample_dims=["lon"], arrays={"x": ["z"]})
    )
    assert grid.time is None and grid.manifest.time == {}
    assert_stats(grid.manifest.stats["x"], ds.z.values.transpose(2, 0, 1).reshape(5, -1))
    # dates: false: the file's rows as they are
    plain = shardload.prepare(config(src, tmp_path / "plain", dates=False))
    assert plain.time is None and len(plain) == 38
    assert sorted(plain.manifest.stats) == ["x"]
    # a time coordinate that is not regular: a warning, not dated
    odd = ds.isel(time=[0, 1, 3, 4, 5, 9])
    odd = odd.assign_coords(time=odd.time.values + np.array([0, 0, 0, 3600, 0, 0], "m8[s]"))
    path = tmp_path / "odd.nc"
    odd.to_netcdf(path)
    with caplog.at_level(logging.WARNING, logger="shardload.prep.driver"):
        store = shardload.prepare(config(path, tmp_path / "odd", splits={}))
    assert store.time is None and len(store) == 6
    assert any("'time' is not a regular axis" in r.getMessage() for r in caplog.records)
    # ... and an error when the config asks for dates
    with pytest.raises(ViewError, match="time coordinate 'time' is not a regular axis"):
        shardload.prepare(config(path, tmp_path / "odd2", splits={}, dates={}))


def test_dates_config_is_checked(tmp_path, src):
    with pytest.raises(ConfigError, match=r"dates\.statistics: 'training' is not a split"):
        shardload.prepare(config(src, tmp_path / "s", dates={"statistics": "training"}))
    with pytest.raises(ConfigError, match="dates: a dated store is a flat view over one"):
        shardload.prepare(config(src, tmp_path / "s", sample_dims=["time", "lat"], dates={}))
    with pytest.raises(ConfigError, match=r"dates\.frequency: frequency 'often' is not understood"):
        shardload.prepare(config(src, tmp_path / "s", dates={"frequency": "often"}))
    # a frequency finer than the data's: every other date missing, declared or not
    store = shardload.prepare(config(src, tmp_path / "f", dates={"frequency": "3h"}))
    assert store.time.length == 79 and store.time.frequency_text == "3h"


def test_a_time_axis_that_contradicts_the_length_is_refused(tmp_path, src):
    from dataclasses import replace

    store = shardload.prepare(config(src, tmp_path / "s"))
    bad = replace(store.manifest, time={**store.manifest.time, "length": 41})
    with pytest.raises(StoreError, match="time axis has 41 dates; the store has 40 rows"):
        check_manifest_consistent(bad, where="shardload.json")


def test_a_run_that_failed_the_declared_check_resumes_once_the_list_is_right(tmp_path, src, caplog):
    wrong = ["2020-01-02T18:00", "2020-01-03T00:00"]  # the all-NaN state not declared
    with pytest.raises(ViewError, match="not declared missing: 2020-01-06T00:00:00"):
        shardload.prepare(config(src, tmp_path / "s", dates={"missing": wrong}))
    assert (tmp_path / "s.partial").is_dir() and not (tmp_path / "s").exists()
    right = [*wrong, "2020-01-06T00:00"]
    with caplog.at_level(logging.INFO, logger="shardload.prep.driver"):
        store = shardload.prepare(config(src, tmp_path / "s", dates={"missing": right}))
    assert any("14 of 14 block(s) already written" in r.getMessage() for r in caplog.records)
    assert store.time.missing == (*GAPS, NAN_STATE)
    np.testing.assert_array_equal(store.read("x"), expected_rows())


def test_a_copy_keeps_the_time_axis_and_the_statistics(tmp_path, src):
    store = shardload.prepare(config(src, tmp_path / "s"))
    copy = shardload.copy(tmp_path / "s", tmp_path / "c", format="npy", compression="none")
    assert copy.time == store.time and copy.manifest.time == store.manifest.time
    assert sorted(copy.manifest.stats) == ["x", "x/tendency_1"]
    for name in ("x", "x/tendency_1"):
        for f in ("count", "mean", "std", "min", "max"):
            a, b = getattr(copy.manifest.stats[name], f), getattr(store.manifest.stats[name], f)
            np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(copy.read("x"), expected_rows())


@pytest.mark.parametrize("period", ["train", "all"])
def test_a_resumed_run_gives_a_clean_run_s_statistics_and_missing_dates(
    tmp_path, src, monkeypatch, period
):
    """Interrupted at block 30 with the statistics saved after every block (missing dates 7,
    8, 20 in the saved prefix), resumed with the same period or another one (the saved
    statistics are then not used): the clean run's statistics and time axis, bit for bit."""
    import errno

    from shardload.formats.npy.write import NpyWriter
    from shardload.prep import run as prep_run
    from shardload.prep import tasks as pipeline

    c = config(src, tmp_path / "s", chunk_rows=1, format="npy", execution="sync")
    want = {**c, "dates": {"statistics": period}, "out": str(tmp_path / "ref")}
    ref = shardload.prepare(want)
    monkeypatch.setattr(prep_run, "STATS_SAVE_BYTES", 0)
    monkeypatch.setattr(prep_run, "STATS_SAVE_FACTOR", 0)
    real = NpyWriter.write_block

    def flaky(self, root, name, chunk_index, start, data, *, bounds):
        if chunk_index == 30:
            raise OSError(errno.EIO, "Input/output error")
        return real(self, root, name, chunk_index, start, data, bounds=bounds)

    monkeypatch.setattr(NpyWriter, "write_block", flaky)
    with pytest.raises(StoreError, match="chunk 30"):
        shardload.prepare(c)  # the default period: train
    monkeypatch.undo()
    progress = tmp_path / "s.partial" / "_progress"
    recorded = sorted(int(p.stem[6:]) for p in progress.glob("block-*.npz"))
    saved = np.load(progress / "stats.npz")
    assert int(saved["blocks"]) == 30 and recorded[:30] == list(range(30))
    np.testing.assert_array_equal(saved["_notes/missing_rows"], [*GAPS, NAN_STATE])
    again = []
    real_stats = pipeline.block_stats
    monkeypatch.setattr(pipeline, "block_stats", lambda j, b: again.append(b) or real_stats(j, b))
    store = shardload.prepare({**want, "out": c["out"]})
    # resumed: the recorded blocks not rewritten; their statistics read again unless saved
    assert sorted(again) == recorded[30 if period == "train" else 0 :]
    assert store.manifest.time == ref.manifest.time
    assert store.time.missing == (*GAPS, NAN_STATE)
    for name in ("x", "x/tendency_1"):
        a, b = store.manifest.stats[name], ref.manifest.stats[name]
        for f in ("count", "mean", "std", "min", "max", "nan_count"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (name, f)


def test_prepare_check_shows_the_time_axis_and_its_gaps(tmp_path, src, capsys):
    import yaml

    from shardload.cli.app import main

    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config(src, tmp_path / "s")))
    assert main(["prepare", "--check", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert (
        "dates     2020-01-01T00:00:00 to 2020-01-10T18:00:00 every 6h; 2 date(s) missing in "
        "the source (2020-01-02T18:00:00, 2020-01-03T00:00:00)" in out
    )
    assert "statistics over train (missing dates left out); tendencies [1]" in out
    assert not (tmp_path / "s.partial").exists()


def test_a_dated_store_s_splits_are_time_ranges_in_order_unless_shuffle_is_asked(tmp_path, src):
    store = shardload.prepare(config(src, tmp_path / "s"))  # 14 chunks of 3 dates
    train, val, test = (split_rows(store, s) for s in ("train", "val", "test"))
    assert train[0] == 0 and val[0] == train[-1] + 1 and test[0] == val[-1] + 1
    assert test[-1] == 39 and len(np.concatenate([train, val, test])) == 40
    assert store.manifest.time["statistics"]["rows"] == [[0, len(train)]]
    assert store.manifest.provenance["config"]["split_shuffle"] is False
    shuffled = shardload.prepare(config(src, tmp_path / "sh", split_shuffle=True))
    assert not np.array_equal(split_rows(shuffled, "train"), train)  # as asked
    # stores whose samples are not dates: shuffled chunks, as before
    grid = shardload.prepare(
        config(src, tmp_path / "g", sample_dims=["lat"], arrays={"x": ["z"]}, chunk_rows=1)
    )
    assert grid.manifest.provenance["config"]["split_shuffle"] is True


def test_dates_keys_as_yaml_writes_them():
    import yaml

    from shardload.prep.config import load_config

    base = {"source": "a.nc", "sample_dims": ["time"], "arrays": {"x": ["t"]}, "out": "o"}
    text = "dates: {frequency: 6h, missing: [2020-01-02T18:00:00, 2020-01-03], tendencies: [2, 1]}"
    d = load_config({**base, **yaml.safe_load(text)}).dates  # YAML reads them as datetimes
    assert d.enabled and d.frequency_s == 21600 and d.tendencies == (1, 2)
    assert d.missing == ("2020-01-02T18:00:00", "2020-01-03T00:00:00")
    assert load_config({**base, "dates": True}).dates.enabled is True
    assert load_config({**base, "dates": False}).dates.enabled is False
    assert load_config(base).dates.enabled is None and load_config(base).dates.missing is None
    assert load_config({**base, "dates": {"missing": []}}).dates.missing == ()
