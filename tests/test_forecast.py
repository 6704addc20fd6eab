"""The forecast example's pieces on known inputs: persistence, the autoregressive rollout, the
rollout loss, the grid read from feature names, and the CNN's start as persistence."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("lightning")

from shardload.errors import ShardloadError  # noqa: E402
from shardload.train.forecast import (  # noqa: E402
    StateCNN,
    persistence,
    plan_state_grid,
    rollout,
    rollout_loss,
)


def test_persistence_repeats_the_last_input_state():
    inputs = torch.tensor([[[1.0, 2.0], [3.0, 4.0]], [[5.0, 6.0], [7.0, 8.0]]])  # (B 2, I 2, F 2)
    got = persistence(inputs, 3)
    assert got.shape == (2, 3, 2)
    assert got.tolist() == [[[3.0, 4.0]] * 3, [[7.0, 8.0]] * 3]


def test_rollout_feeds_predictions_back():
    seen = []

    def step(window):  # next = last + the first of the window: sees what was fed back
        seen.append(window.clone())
        return window[:, -1] + window[:, 0]

    inputs = torch.tensor([[[1.0], [2.0]]])  # one sample, I 2, F 1
    got = rollout(step, inputs, 3)
    assert got.shape == (1, 3, 1)
    assert got[0, :, 0].tolist() == [3.0, 5.0, 8.0]  # 2+1, 3+2, 5+3
    assert seen[2][0, :, 0].tolist() == [3.0, 5.0]


def test_rollout_loss_is_the_mean_over_steps_and_features():
    pred = torch.zeros(1, 2, 2)
    target = torch.tensor([[[1.0, 1.0], [3.0, 1.0]]])
    assert float(rollout_loss(pred, target)) == pytest.approx((1 + 1 + 9 + 1) / 4)
    # persistence scored the same way: step 1 exact, step 2 off by 2 in one feature
    inputs = torch.tensor([[[0.0, 0.0], [1.0, 1.0]]])
    assert float(rollout_loss(persistence(inputs, 2), target)) == pytest.approx(4 / 4)


def test_grid_from_feature_names_and_a_bad_one():
    feats = [f"{v}[{a},{o}]" for v in ("t", "q") for a in ("45.0", "-45.0") for o in ("0", "180")]
    g = plan_state_grid(feats)
    assert g.shape == (2, 2, 2) and g.variables == ("t", "q")
    with pytest.raises(ShardloadError, match="VAR\\[LAT,LON\\]"):
        plan_state_grid(["x[0]", "x[1]"])
    with pytest.raises(ShardloadError, match="C order"):
        plan_state_grid([feats[1], feats[0], *feats[2:]])  # two longitudes swapped in one row


def test_cnn_starts_as_persistence_and_wraps_in_longitude():
    feats = [f"t[{a},{o}]" for a in ("30", "-30") for o in range(8)]
    model = StateCNN(plan_state_grid(feats), inputs=2, hidden=4, layers=2)
    states = torch.randn(3, 2, 16)
    assert torch.equal(model(states), states[:, -1])
    # a learnt increment treats every longitude alike: shifting the input shifts the output
    torch.nn.init.normal_(model.convs[-1].weight)
    grid = states.reshape(3, 2, 2, 8)
    rolled = torch.roll(grid, 3, dims=-1).reshape(3, 2, 16)
    out = model(states).reshape(3, 2, 8)
    torch.testing.assert_close(model(rolled).reshape(3, 2, 8), torch.roll(out, 3, dims=-1))


def test_a_store_without_dates_is_refused_with_what_it_has():
    from types import SimpleNamespace

    from shardload.train.forecast import ForecastTask

    undated = SimpleNamespace(time=None, arrays={"x": None, "y": None})
    with pytest.raises(ShardloadError, match=r"dated store.*\['x', 'y'\].*no time axis"):
        ForecastTask(undated)
    with pytest.raises(ShardloadError, match="--rollout must be >= 1"):
        ForecastTask(undated, rollout=0)


def test_the_forecast_logs_no_metric_it_does_not_compute(tmp_path, monkeypatch):
    """The heating-rate errors belong to radiation stores: a forecast run's per-epoch log line,
    metrics.csv and metrics.json hold no NaN (they held hr_rmse_sw/lw as NaN; issue #25)."""
    import json
    import shutil
    from importlib import resources

    from shardload.cli.app import main
    from shardload.samples.states import write_states_sample

    monkeypatch.setenv("SHARDLOAD_HOME", str(tmp_path / "home"))
    write_states_sample(tmp_path, dates=24, lat=4, lon=8)
    shutil.copy(str(resources.files("shardload.configs") / "era5-states.yaml"), tmp_path)
    assert main(["prepare", str(tmp_path / "era5-states.yaml"), "--no-progress"]) == 0
    out = tmp_path / "out"
    argv = ["train", "forecast", str(tmp_path / "era5-states"), "--out", str(out)]
    assert main([*argv, "--epochs", "1", "--batch-size", "4", "--num-workers", "0"]) == 0
    csv_text = (out / "metrics.csv").read_text()
    assert csv_text.splitlines()[0] == "epoch,train_loss,val_loss,samples_per_s,train_seconds"
    assert "nan" not in csv_text.lower(), csv_text
    metrics = json.loads((out / "metrics.json").read_text())
    assert None not in metrics.values() and "hr_rmse_sw" not in metrics, metrics
    (log,) = (tmp_path / "home" / "logs").glob("train-*.log")
    (epoch_line,) = [ln for ln in log.read_text().splitlines() if "epoch 1/1:" in ln]
    assert "val_loss" in epoch_line and "nan" not in epoch_line.lower(), epoch_line
