"""``shardload train forecast``: a CNN that steps global states forward, trained on windows of
dates of a dated store with a rollout loss, and measured against persistence.

Each sample is a window of ``inputs + rollout`` consecutive dates of the store's state array
(``StreamingDataset(..., window=K)``: ``(B, K, features)``, the features being every variable
at every grid point, as ``prepare`` flattens ``t[lat,lon]``, ``q[lat,lon]``, ...). The model sees
the last ``inputs`` states (and the latitude) and predicts the next state as an increment of the
last one; its predictions are fed back for ``rollout`` steps, and the loss is the mean squared
error over every predicted state (normalised units). Validation also scores, on the same
windows and in the same units, *persistence* (every future state = the last input) and the
*mean predictor* (every future state = the train split's mean).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from shardload.errors import ShardloadError
from shardload.train.task import ExampleTask

#: the state array the forecast reads (configs/era5-states.yaml names it so)
STATE = "state"
_FEATURE = re.compile(r"^(?P<var>[^\[]+)\[(?P<lat>[^,\]]+),(?P<lon>[^\]]+)\]$")


@dataclass(frozen=True)
class StateGrid:
    """How a flat state row is laid out: ``variables`` x ``lat`` x ``lon``, C order."""

    variables: tuple[str, ...]
    latitudes: np.ndarray
    num_lon: int

    @property
    def shape(self) -> tuple[int, int, int]:
        return (len(self.variables), len(self.latitudes), self.num_lon)


def plan_state_grid(features: tuple[str, ...] | list[str]) -> StateGrid:
    """The grid of a flat state from its feature names ``VAR[LAT,LON]`` (pure).

    >>> g = plan_state_grid(["t[10.0,0.0]", "t[10.0,90.0]", "t[-10.0,0.0]", "t[-10.0,90.0]",
    ...                      "q[10.0,0.0]", "q[10.0,90.0]", "q[-10.0,0.0]", "q[-10.0,90.0]"])
    >>> g.shape, g.variables, g.latitudes.tolist()
    ((2, 2, 2), ('t', 'q'), [10.0, -10.0])
    """
    parsed = [_FEATURE.match(f) for f in features]
    if not features or any(p is None for p in parsed):
        bad = next((f for f, p in zip(features, parsed, strict=True) if p is None), None)
        raise ShardloadError(
            f"forecast: the state's features must be VAR[LAT,LON] (a flat view of fields on "
            f"(latitude, longitude), as configs/era5-states.yaml makes); got {bad!r}"
        )
    variables = tuple(dict.fromkeys(p["var"] for p in parsed if p is not None))
    lats = list(dict.fromkeys(p["lat"] for p in parsed if p is not None))
    lons = list(dict.fromkeys(p["lon"] for p in parsed if p is not None))
    expect = [f"{v}[{a},{o}]" for v in variables for a in lats for o in lons]
    if list(features) != expect:
        raise ShardloadError(
            "forecast: the state's features are not a whole (variable, latitude, longitude) "
            f"grid in C order ({len(variables)} x {len(lats)} x {len(lons)})"
        )
    return StateGrid(variables, np.array([float(a) for a in lats]), len(lons))


def persistence(inputs: torch.Tensor, steps: int) -> torch.Tensor:
    """``(B, I, F) -> (B, steps, F)``: every future state equals the last input state."""
    return inputs[:, -1:].expand(-1, steps, *inputs.shape[2:])


def rollout(
    step: Callable[[torch.Tensor], torch.Tensor], inputs: torch.Tensor, steps: int
) -> torch.Tensor:
    """``(B, I, F) -> (B, steps, F)``: ``step`` maps the last ``I`` states to the next one; each
    prediction joins the inputs of the next step (autoregressive)."""
    window, out = inputs, []
    for _ in range(steps):
        nxt = step(window)
        out.append(nxt)
        window = torch.cat([window[:, 1:], nxt[:, None]], dim=1)
    return torch.stack(out, dim=1)


def rollout_loss(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error over every rollout step, state and feature (steps weigh equally)."""
    return F.mse_loss(pred, target)


class StateCNN(nn.Module):
    """The next state from the last ``inputs`` states on a global grid: ``(B, I, V*H*W) ->
    (B, V*H*W)``, the last state plus a learnt increment. Convolutions wrap around in
    longitude and repeat the edge row at the poles; sine and cosine of latitude are two more
    input channels (the dynamics depend on latitude)."""

    def __init__(self, grid: StateGrid, *, inputs: int, hidden: int = 32, layers: int = 4):
        super().__init__()
        self.grid, self.inputs = grid, inputs
        v, h, w = grid.shape
        lat = torch.as_tensor(np.deg2rad(grid.latitudes), dtype=torch.float32)
        coords = torch.stack([lat.sin(), lat.cos()])[:, :, None].expand(2, h, w)
        self.register_buffer("coords", coords.contiguous(), persistent=False)
        chans = [v * inputs + 2] + [hidden] * (layers - 1) + [v]
        convs = [nn.Conv2d(a, b, kernel_size=3) for a, b in itertools.pairwise(chans)]
        nn.init.zeros_(convs[-1].weight)  # starts as persistence
        nn.init.zeros_(convs[-1].bias)  # type: ignore[arg-type]
        self.convs = nn.ModuleList(convs)

    def forward(self, states: torch.Tensor) -> torch.Tensor:
        b = states.shape[0]
        v, h, w = self.grid.shape
        x = states.reshape(b, self.inputs * v, h, w)
        x = torch.cat([x, self.get_buffer("coords").expand(b, -1, -1, -1)], dim=1)
        for i, conv in enumerate(self.convs):
            x = F.pad(F.pad(x, (1, 1, 0, 0), mode="circular"), (0, 0, 1, 1), mode="replicate")
            x = conv(x)
            if i < len(self.convs) - 1:
                x = F.silu(x)
        return states[:, -1] + x.reshape(b, v * h * w)


class ForecastTask(ExampleTask):
    """Rollout training of :class:`StateCNN` on windows of ``inputs + rollout`` dates of the
    store's ``state`` array; the epoch bookkeeping, ``metrics.csv`` and resume are
    :class:`~shardload.train.task.ExampleTask`'s. After each validation, ``baselines`` holds
    the persistence and mean-predictor losses over the same windows (summed over ranks)."""

    kinds = ("forecast",)
    train_mean: torch.Tensor

    def __init__(
        self,
        manifest: Any,
        *,
        inputs: int = 2,
        rollout: int = 2,
        normalize: Any = None,
        out_dir: Any = None,
        lr: float = 1e-3,
        hidden: int | None = None,
    ) -> None:
        if inputs < 1 or rollout < 1:
            raise ShardloadError(f"--inputs and --rollout must be >= 1, got {inputs}, {rollout}")
        self._options = (inputs, rollout)
        super().__init__(
            "forecast", manifest, normalize=normalize, out_dir=out_dir, lr=lr, hidden=hidden
        )
        self._base = np.zeros(3)

    def _build_model(self, manifest: Any, hidden: int | None) -> None:
        if manifest.time is None or STATE not in manifest.arrays:
            raise ShardloadError(
                f"model forecast needs a dated store with an array {STATE!r} (one row per date, "
                f"as configs/era5-states.yaml prepares); this one has {sorted(manifest.arrays)}"
                + ("" if manifest.time is not None else " and no time axis")
            )
        self.inputs, self.steps = self._options
        grid = plan_state_grid(manifest.arrays[STATE].features or ())
        self.model = StateCNN(grid, inputs=self.inputs, hidden=hidden or 16)
        mean = np.asarray(manifest.stats[STATE].mean, dtype=np.float32)
        if self.normalize is not None and STATE in self.normalize.params:
            shift, scale = self.normalize.params[STATE]
            mean = (mean - shift) / scale
        self.register_buffer("train_mean", torch.from_numpy(np.nan_to_num(mean)), persistent=False)

    @property
    def window(self) -> int:
        """Dates per sample: the inputs and the rollout targets."""
        return self.inputs + self.steps

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:  # type: ignore[override]
        return rollout(self.model, batch[STATE][:, : self.inputs], self.steps)

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = rollout_loss(self(batch), batch[STATE][:, self.inputs :])
        n = len(batch["index"])
        self._sums[0] += float(loss.detach()) * n
        self._sums[1] += n
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        states = batch[STATE]
        target = states[:, self.inputs :]
        n = len(batch["index"])
        self._sums[2] += float(rollout_loss(self(batch), target)) * n
        self._sums[3] += n
        still = persistence(states[:, : self.inputs], self.steps)
        self._base[0] += float(rollout_loss(still, target)) * n
        self._base[1] += float(rollout_loss(self.train_mean.expand_as(target), target)) * n
        self._base[2] += n

    def on_validation_epoch_start(self) -> None:
        super().on_validation_epoch_start()
        self._base[:] = 0

    def on_validation_epoch_end(self) -> None:
        base = self._reduce(self._base)
        if base[2]:
            self.baselines = {
                "val_loss_persistence": float(base[0] / base[2]),
                "val_loss_mean_predictor": float(base[1] / base[2]),
            }
