"""anemoi-datasets stores read as they are (issue #27): ``open_store`` of a store built by
``anemoi-datasets create`` serves ``anemoi.datasets.open_dataset(path)[i]`` for every row, with
its dates, missing dates, variables, statistics and grid, locally and by URL, through every
loader; a dated store's missing dates never reach a batch unless asked for.

The stores are built by anemoi-datasets itself (its own venv: tests/anemoi_helpers.py) from a
gridded netCDF written here; the reference values are anemoi's own reads. Tests that need it
skip, saying why, without that venv; the tests of the planning and of shardload's own dated
stores run without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import shardload
from anemoi_helpers import GriddedSpec, Reference, build_store, read_reference
from shardload.errors import PlanError, StoreError
from shardload.formats.zarr.anemoi import anemoi_metadata
from shardload.load.spec import LoadSpec
from shardload.plan.resume import plan_state

#: each test here reads stores anemoi-datasets builds (about 40 s for the two, once per module)
pytestmark = pytest.mark.slow

#: two missing dates of the "dated" store (rows 2 and 9), anemoi's own missing_dates
MISSING = ("2020-01-01T12:00:00", "2020-01-03T06:00:00")
SPECS = {
    "gridded": GriddedSpec(
        length=12,
        variables=("t2m", "msl", "z"),
        grid=(3, 4),
        recipe_extra={"statistics": {"tendencies": True}},  # statistics of x[t] - x[t - delta]
    ),
    "dated": GriddedSpec(length=16, grid=(2, 5), members=3, missing=MISSING, seed=1),
}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, tuple[Path, Reference]]:
    """Each store of SPECS built by anemoi-datasets, and anemoi's reading of it."""
    root = tmp_path_factory.mktemp("anemoi")
    out = {}
    for name, spec in SPECS.items():
        path = build_store(root / name, spec, name=f"{name}.zarr")
        out[name] = (path, read_reference(path))
    return out


def kept_rows(ref: Reference) -> list[int]:
    return [i for i in range(len(ref.rows)) if i not in ref.missing]


def check_batches(batches, ref: Reference) -> list[int]:
    """Every batch's values are anemoi's rows of its index, with no NaN; the indices."""
    seen = []
    for b in batches:
        idx = np.asarray(b["index"])
        data = np.asarray(b["data"])
        assert not np.isnan(data).any(), f"NaN served in rows {idx.tolist()}"
        np.testing.assert_array_equal(data, ref.rows[idx])
        seen += idx.tolist()
    assert not set(seen) & ref.missing, "a missing date was served"
    return seen


# -- opening ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_open_store_serves_what_open_dataset_serves(built, name):
    path, ref = built[name]
    store = shardload.open_store(path)
    assert store.arrays == ("data",)
    n, v, e, c = ref.rows.shape
    assert store.manifest.arrays["data"].shape == (n, v, e, c)
    assert (e, c) == (SPECS[name].members or 1, int(np.prod(SPECS[name].grid)))
    # read natively (chunk files decoded into place), one member or several (chunks that
    # split a date by member), never through zarr-python
    assert store.reader.layout("data") is not None
    rows = store.read("data")
    for i in kept_rows(ref):
        np.testing.assert_array_equal(rows[i], ref.rows[i], err_msg=f"row {i}")
    for i in ref.missing:  # read directly, a missing date's row is as stored: never written
        assert np.isnan(rows[i]).all()
    axis = store.time
    assert axis is not None
    np.testing.assert_array_equal(axis.dates, ref.dates)
    assert set(axis.missing) == set(ref.missing)
    assert axis.seconds == ref.frequency_s
    meta = anemoi_metadata(store.manifest)
    assert meta is not None
    assert list(meta.variables) == ref.variables
    assert meta.field_shape == ref.field_shape
    for stat in ("mean", "stdev", "minimum", "maximum"):
        np.testing.assert_array_equal(meta.statistics[stat], ref.statistics[stat], err_msg=stat)
    np.testing.assert_array_equal(meta.latitudes, ref.latitudes)
    np.testing.assert_array_equal(meta.longitudes, ref.longitudes)
    got = {
        f"statistics_tendencies_{delta}_{stat}": values
        for delta, by in meta.tendencies.items()
        for stat, values in by.items()
    }
    assert sorted(got) == sorted(ref.tendencies)
    assert bool(got) == (name == "gridded")  # the recipe asked for them
    for key, values in ref.tendencies.items():
        np.testing.assert_array_equal(got[key], values, err_msg=key)


def test_dated_store_has_its_missing_dates(built):
    _, ref = built["dated"]
    assert sorted(ref.missing) == [2, 9]  # anemoi's own reading of the recipe's missing dates
    store = shardload.open_store(built["dated"][0])
    assert [str(d) for d in store.time.missing_dates] == list(MISSING)


# -- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", list(SPECS))
def test_iter_batches_default_shuffle_serves_every_kept_row_once(built, name):
    path, ref = built[name]
    seen = check_batches(shardload.iter_batches(path, batch_size=3, seed=2), ref)
    assert sorted(seen) == kept_rows(ref)


def test_missing_dates_options(built):
    path, ref = built["dated"]
    rows = [i for b in shardload.iter_batches(path, batch_size=4, missing_dates="include")
            for i in b["index"].tolist()]  # fmt: skip
    assert sorted(rows) == list(range(len(ref.rows)))
    with pytest.raises(PlanError, match=r"missing_dates='error'.*2020-01-01T12:00:00 \(row 2\)"):
        shardload.iter_batches(path, batch_size=4, missing_dates="error")
    # a row range without missing dates is fine with "error"
    got = shardload.iter_batches(path, batch_size=4, rows=(3, 9), missing_dates="error")
    assert sorted(check_batches(got, ref)) == list(range(3, 9))
    with pytest.raises(PlanError, match="missing_dates='drop'"):
        shardload.iter_batches(path, batch_size=4, missing_dates="drop")


def test_map_dataset_leaves_missing_dates_out(built):
    from shardload.torch import MapDataset

    path, ref = built["dated"]
    ds = MapDataset(path)
    assert len(ds) == len(kept_rows(ref))
    got = [int(ds[i]["index"]) for i in range(len(ds))]
    assert got == kept_rows(ref)
    np.testing.assert_array_equal(ds[2]["data"].numpy(), ref.rows[3])


@pytest.mark.parametrize("world", [2, 3])
def test_ranks_disjoint_and_equal(built, world):
    path, ref = built["dated"]
    per_rank = [
        list(shardload.iter_batches(path, batch_size=2, rank=r, world_size=world, seed=5))
        for r in range(world)
    ]
    assert len({len(b) for b in per_rank}) == 1, "ranks got different batch counts"
    rows = [check_batches(b, ref) for b in per_rank]
    assert len({len(r) for r in rows}) == 1, "ranks got different row counts"
    flat = [i for r in rows for i in r]
    assert len(flat) == len(set(flat)), "a row was served to two ranks"
    # "drop" leaves out fewer rows than ranks to keep the ranks equal
    assert len(kept_rows(ref)) - len(flat) < world


def test_streaming_dataset_two_workers(built):
    from torch.utils.data import DataLoader

    from shardload.torch import StreamingDataset

    path, ref = built["dated"]
    ds = StreamingDataset(path, batch_size=2, seed=3)
    seen = check_batches(DataLoader(ds, batch_size=None, num_workers=2), ref)
    assert sorted(seen) == kept_rows(ref)


def test_streaming_dataset_ranks_disjoint_and_equal(built):
    from shardload.torch import StreamingDataset

    path, ref = built["dated"]
    rows = []
    for r in range(2):
        ds = StreamingDataset(path, batch_size=2, rank=r, world_size=2)
        rows.append(check_batches(iter(ds), ref))
    assert len(rows[0]) == len(rows[1]) == len(kept_rows(ref)) // 2
    assert not set(rows[0]) & set(rows[1])


def test_resume_mid_epoch_equals_the_uninterrupted_run(built):
    from _resume import assert_resumes_exactly

    path, _ = built["dated"]
    assert_resumes_exactly(path, world=2, workers=2, consumed=(1, 3), batch_size=1, seed=7)


def test_streaming_dataloader_resumes_mid_epoch(built):
    """StreamingDataLoader's state after 3 batches (2 workers): a fresh loader given it yields
    exactly the rest of the epoch, with 2 workers and with none."""
    from shardload.torch import StreamingDataLoader, StreamingDataset

    path, ref = built["dated"]

    def loader(workers: int) -> StreamingDataLoader:
        ds = StreamingDataset(path, batch_size=2, seed=4)
        ds.set_epoch(1)
        return StreamingDataLoader(ds, num_workers=workers)

    full = [b["index"].tolist() for b in loader(2)]
    it = iter(first := loader(2))
    head = [next(it)["index"].tolist() for _ in range(3)]
    state = first.state_dict()
    del it
    for workers in (2, 0):
        again = loader(workers)
        again.load_state_dict(state)
        rest = list(again)
        check_batches(rest, ref)
        got = head + [b["index"].tolist() for b in rest]
        if workers == 2:
            assert got == full
        else:
            assert sorted(i for b in got for i in b) == sorted(i for b in full for i in b)


def test_elastic_resume_reads_exactly_the_unseen_rows(built):
    from shardload.plan.groups import iter_rank_batches

    path, ref = built["dated"]
    spec = LoadSpec.build(path, batch_size=1, seed=1)
    plan = spec.plan(world_size=2, num_workers=2, epoch=0)
    consumed = 2
    state = plan_state(plan, consumed).to_dict()
    state["dataset"] = spec.fingerprint
    left = {i for r in range(2) for b in list(iter_rank_batches(plan, r))[consumed:] for i in b}
    got = []
    for r in range(3):
        for w in range(2):
            got += check_batches(
                shardload.iter_batches(
                    path,
                    batch_size=1,
                    seed=1,
                    state=state,
                    rank=r,
                    world_size=3,
                    worker=w,
                    num_workers=2,
                ),
                ref,
            )
    assert len(got) == len(set(got))
    assert set(got) <= {int(i) for i in left}
    assert len(left) - len(got) < 3  # "drop": at most one row short per new rank


def test_by_url_equals_locally(built):
    from shardload.move.serve import serving

    path, ref = built["dated"]
    with serving(path.parent) as url:
        remote = shardload.open_store(url + path.name)
        assert remote.time == shardload.open_store(path).time
        rows = remote.read("data")
        for i in kept_rows(ref):
            np.testing.assert_array_equal(rows[i], ref.rows[i])
        local = list(shardload.iter_batches(path, batch_size=3, seed=4))
        by_url = list(shardload.iter_batches(url + path.name, batch_size=3, seed=4))
        assert len(local) == len(by_url)
        for a, b in zip(local, by_url, strict=True):
            np.testing.assert_array_equal(a["index"], b["index"])
            np.testing.assert_array_equal(a["data"], b["data"])
        assert sorted(check_batches(by_url, ref)) == kept_rows(ref)


def test_verify_says_there_are_no_checksums(built):
    path, _ = built["dated"]
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert "no checksums" in res.stdout and "anemoi-datasets" in res.stdout, res.stdout
    assert "all good" in res.stdout


# -- stores anemoi refuses, and shardload too --------------------------------------------------


def test_dates_that_are_not_a_regular_range_are_refused(built, tmp_path):
    """A store whose rows are not one per date of its range (older anemoi-datasets versions dropped
    missing dates' rows) would serve rows under the wrong dates: refused, naming the row."""
    import shutil

    import zarr

    path, _ = built["gridded"]
    bad = tmp_path / "bad.zarr"
    shutil.copytree(path, bad)
    dates = zarr.open_array(str(bad / "dates"), mode="r+")
    shifted = np.asarray(dates[:]).astype("datetime64[s]")
    shifted[5:] += np.timedelta64(6, "h")  # row 5 on is one date late: a date left out
    dates[:] = shifted
    with pytest.raises(StoreError, match=r"row 5 is dated .*not one row per date"):
        shardload.open_store(bad)


def test_other_arrays_are_refused_by_name(built):
    path, _ = built["gridded"]
    with pytest.raises(StoreError, match=r"anemoi-datasets store.*'data'"):
        shardload.open_store(path, arrays=["latitudes"])
    assert shardload.open_store(path, arrays=["data"]).time is not None
