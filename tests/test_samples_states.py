"""``shardload sample states``: global states whose next date follows a learnable rule (the
forecast example's data), and the shipped ``era5-states.yaml`` that makes a dated store of them
with train and val time ranges."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

from shardload.cli.app import main
from shardload.errors import ConfigError
from shardload.samples.states import (
    DIFFUSION,
    RELAX,
    _laplacian,
    _shift,
    level_names,
    states_fields,
    write_states_sample,
    zonal_shift_cells,
)

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "shardload" / "configs"


def test_schema_and_reproducible(tmp_path):
    path = write_states_sample(tmp_path, dates=12, lat=8, lon=16)
    with xr.open_dataset(path) as ds:
        assert set(ds.data_vars) == {"t", "q", "z"}
        assert ds["t"].dims == ("time", "latitude", "longitude")
        assert ds["t"].shape == (12, 8, 16) and ds["t"].dtype == np.float32
        steps = np.diff(ds["time"].values).astype("timedelta64[h]").astype(int)
        assert set(steps.tolist()) == {6}
        assert float(ds["t"].min()) > 200 and float(ds["t"].max()) < 330
    again = write_states_sample(tmp_path / "b", dates=12, lat=8, lon=16)
    assert again.read_bytes() == path.read_bytes()


def test_the_rule_predicts_far_better_than_persistence():
    f = states_fields(dates=300, lat=16, lon=32, seed=1)
    clim = f["t"].mean(axis=(0, 2), keepdims=True)[0]
    a = f["t"].astype(np.float64) - clim
    cells = zonal_shift_cells(f["latitude"])
    rule = np.stack([_shift(x, cells) for x in a[:-1]])
    rule += DIFFUSION * np.stack([_laplacian(x) for x in rule]) - RELAX * rule
    err_rule = np.mean((rule - a[1:]) ** 2)
    err_persistence = np.mean((a[:-1] - a[1:]) ** 2)
    # the forcing is all the rule misses (the climate here is estimated, hence not exact)
    assert err_rule < 0.4 * err_persistence, (err_rule, err_persistence)


def test_shipped_config_makes_a_dated_store_with_train_and_val(tmp_path):
    assert main(["sample", "states", "--out", str(tmp_path), "--dates", "400"]) == 0
    shutil.copy(CONFIGS / "era5-states.yaml", tmp_path)
    assert main(["prepare", str(tmp_path / "era5-states.yaml"), "--no-progress"]) == 0
    import shardload

    store = shardload.open_store(tmp_path / "era5-states")
    assert store.time is not None and store.time.frequency_text == "6h"
    assert store.manifest.arrays["state"].shape == (400, 3 * 32 * 64)
    train, val = (store.manifest.split_num_rows(s) for s in ("train", "val"))
    assert train + val == 400 and 0.15 * 400 <= val <= 0.25 * 400, (train, val)


def test_levels_make_wide_states_of_the_same_dynamics(tmp_path):
    assert main(["sample", "states", "--out", str(tmp_path), "--dates", "6", "--lat", "4",
                 "--lon", "10", "--levels", "3"]) == 0  # fmt: skip
    f = states_fields(dates=6, lat=4, lon=10, seed=0)
    with xr.open_dataset(tmp_path / "states-6h.nc") as ds:
        assert list(ds.data_vars) == level_names(3) == [
            "t_1", "t_2", "t_3", "q_1", "q_2", "q_3", "z_1", "z_2", "z_3"
        ]  # fmt: skip
        assert all(ds[v].dtype == np.float32 and ds[v].shape == (6, 4, 10) for v in ds.data_vars)
        np.testing.assert_array_equal(ds["t_1"].values, f["t"])
        np.testing.assert_allclose(ds["t_3"].values, f["t"] - 13.0, rtol=1e-6)
        np.testing.assert_allclose(ds["q_2"].values, f["q"] * np.exp(-0.25), rtol=1e-6)
        np.testing.assert_allclose(ds["z_3"].values, f["z"] + 3000.0, rtol=1e-6)
        assert ds["q_2"].attrs["units"] == "g kg**-1"
    with pytest.raises(ConfigError, match="levels >= 1"):
        write_states_sample(tmp_path / "bad", dates=6, lat=4, lon=10, levels=0)
