"""Tendency statistics (and the statistics of the states) of a store shardload prepares equal
those anemoi-datasets computes for the same data (issue #27): same period, same missing date,
same steps; per variable (anemoi's) from shardload's per feature by the exact merge of each
variable's features.

anemoi builds its store from a netCDF holding every date and a recipe declaring one date
missing (its row NaN); shardload prepares the same netCDF without that date (a gap, declared
missing). Both leave out every pair with a missing date and every pair not inside the period,
and take the increments of float32 states in float32 (anemoi: ``combined[delta:] -
combined[:-delta]`` before its float64 sums). Differences that remain are documented in
docs/weather.md ("Compared with anemoi-datasets").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from anemoi_helpers import GriddedSpec, Reference, build_store, read_reference
from shardload.manifest.features import FeatureStats
from shardload.manifest.merge import _valid_counts
from shardload.manifest.time import tendency_key

#: anemoi builds a store (about 20 s)
pytestmark = pytest.mark.slow

MISSING = ("2020-01-02T06:00:00",)  # row 5 of 12
SPEC = GriddedSpec(
    length=12,
    variables=("t2m", "msl", "z"),
    grid=(3, 4),
    missing=MISSING,
    seed=3,
    # anemoi's deltas as durations; its default period: the first int(0.8 * 12) = 9 dates
    recipe_extra={"statistics": {"tendencies": ["6h", "12h"]}},
)
#: shardload's step k -> anemoi's delta at the 6-hourly frequency
DELTAS = {1: "6h", 2: "12h"}
STATS = ("mean", "stdev", "minimum", "maximum")


def per_variable(s: FeatureStats, num_variables: int) -> dict[str, np.ndarray]:
    """Per-feature statistics of rows ``(variable, cell)`` flattened, merged over each
    variable's cells (Chan et al.'s update from counts, means and population variances)."""
    n = _valid_counts(s).reshape(num_variables, -1).astype(np.float64)
    mean, std = s.mean.reshape(num_variables, -1), s.std.reshape(num_variables, -1)
    total = n.sum(axis=1)
    m = (n * mean).sum(axis=1) / total
    m2 = (n * std**2).sum(axis=1) + (n * (mean - m[:, None]) ** 2).sum(axis=1)
    return {
        "mean": m,
        "stdev": np.sqrt(m2 / total),
        "minimum": s.min.reshape(num_variables, -1).min(axis=1),
        "maximum": s.max.reshape(num_variables, -1).max(axis=1),
    }


@pytest.fixture(scope="module")
def both(tmp_path_factory) -> tuple[shardload.Store, Reference]:
    root: Path = tmp_path_factory.mktemp("tendencies")
    ref = read_reference(build_store(root, SPEC, name="anemoi.zarr"))
    # the same values, the missing date absent from the file (a gap, as anemoi's row)
    with xr.open_dataset(root / "anemoi.nc") as ds:
        ds.drop_sel(time=[np.datetime64(d) for d in MISSING]).to_netcdf(root / "gaps.nc")
    store = shardload.prepare(
        {
            "source": str(root / "gaps.nc"),
            "sample_dims": ["time"],
            "arrays": {"data": list(SPEC.variables)},
            "dates": {"missing": list(MISSING), "tendencies": list(DELTAS)},
            # train = the first 9 dates: anemoi's default period for 12 dates
            "chunk_rows": 1,
            "splits": {"train": 0.75, "val": 0.25},
            "out": str(root / "shardload"),
        }
    )
    return store, ref


def test_same_period_and_dates(both):
    store, ref = both
    assert ref.missing == {5}
    period = store.manifest.time["statistics"]
    assert period["rows"] == [[0, 9]] and period["num_dates"] == 8  # 9 dates, one missing
    assert store.manifest.stats["data"].count == 8
    # pairs inside rows [0, 9) with neither date missing: 8 - 2 of step 1, 7 - 2 of step 2
    assert store.manifest.stats[tendency_key("data", 1)].count == 6
    assert store.manifest.stats[tendency_key("data", 2)].count == 5


def test_statistics_of_states_equal_anemois(both):
    store, ref = both
    order = [SPEC.variables.index(v) for v in ref.variables]  # anemoi sorts its variables
    got = per_variable(store.manifest.stats["data"], len(SPEC.variables))
    for stat in STATS:
        np.testing.assert_allclose(got[stat][order], ref.statistics[stat], rtol=1e-12, err_msg=stat)


@pytest.mark.parametrize("k", sorted(DELTAS))
def test_tendency_statistics_equal_anemois(both, k):
    store, ref = both
    order = [SPEC.variables.index(v) for v in ref.variables]
    got = per_variable(store.manifest.stats[tendency_key("data", k)], len(SPEC.variables))
    for stat in STATS:
        want = ref.tendencies[f"statistics_tendencies_{DELTAS[k]}_{stat}"]
        # min and max are float32 increments in both: exactly equal
        rtol = 0 if stat in ("minimum", "maximum") else 1e-12
        np.testing.assert_allclose(got[stat][order], want, rtol=rtol, atol=1e-14, err_msg=stat)
