"""``shardload sample era5``: cfgrib's ERA5 schema with enough time steps for the shipped
``era5-window.yaml`` to cut train and val windows (it once made a train-only store that
``shardload train lstm`` refused)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import xarray as xr

from shardload.cli.app import main
from shardload.samples.era5 import write_era5_sample

CONFIGS = Path(__file__).resolve().parents[1] / "src" / "shardload" / "configs"


def test_schema_of_the_cfgrib_sample_with_more_steps(tmp_path):
    path = write_era5_sample(tmp_path, members=2, times=6, grid_deg=15)
    with xr.open_dataset(path) as ds:
        assert set(ds.data_vars) == {"z", "t"}
        assert ds["t"].dims == ("number", "time", "isobaricInhPa", "latitude", "longitude")
        assert ds["t"].shape == (2, 6, 2, 13, 24) and ds["t"].dtype == np.float32
        assert list(ds["isobaricInhPa"].values) == [850.0, 500.0]
        assert float(ds["t"].min()) > 200 and float(ds["t"].max()) < 320
    again = write_era5_sample(tmp_path / "b", members=2, times=6, grid_deg=15)
    assert again.read_bytes() == path.read_bytes()


def test_shipped_window_config_has_train_and_val(tmp_path):
    assert main(["sample", "era5", "--out", str(tmp_path), "--grid-deg", "15"]) == 0
    shutil.copy(CONFIGS / "era5-window.yaml", tmp_path)
    assert main(["prepare", str(tmp_path / "era5-window.yaml"), "--no-progress"]) == 0
    import shardload

    store = shardload.open_store(tmp_path / "era5-window")
    m = store.manifest
    assert {"train", "val"} <= set(m.splits)
    assert m.split_num_rows("val") >= 0.15 * len(store), m.split_rows
    assert store.read("x").shape[1:] == (2, 4) and store.read("y").shape[1:] == (2,)
