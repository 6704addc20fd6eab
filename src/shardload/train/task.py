"""The LightningModule of the examples: one regression task per model kind, with the
radiation heating-rate metric and a per-epoch ``metrics.csv``.

Heating rates (K/day) come from the predicted and the true fluxes (de-normalised) and the
pressure on half levels, through :func:`shardload.prep.sources.radiation_rows.heating_rate_np` (the
function that computes the stored ``hr_sw`` / ``hr_lw``); the metric is their RMSE over every
level of every validation column, per band, summed over ranks before the square root.
"""

from __future__ import annotations

import csv
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch import nn

from shardload.errors import ShardloadError
from shardload.train.graph import GraphBatcher
from shardload.train.models import GNN, MLP, LSTMRegressor
from shardload.train.needs import check_store_fits
from shardload.train.transforms import INPUT_CLIP, Normalize

log = logging.getLogger("shardload.train")

KINDS = ("mlp", "gnn", "lstm")
BANDS = ("sw", "lw")
COLUMNS = (
    "epoch",
    "train_loss",
    "val_loss",
    "hr_rmse_sw",
    "hr_rmse_lw",
    "samples_per_s",
    "train_seconds",
)


@dataclass(frozen=True)
class HeatingRateColumns:
    """Where the fluxes and the half-level pressure sit in a batch (pure data).

    ``flux[band] = (dn, up)``: index arrays into the target's last axis (flat: one column per
    half level; graph: one feature index each, per node). ``pressure``: indices into the
    input's last axis.
    """

    flux: dict[str, tuple[np.ndarray, np.ndarray]]
    pressure: np.ndarray


def plan_heating_rate_columns(kind: str, manifest: Any) -> HeatingRateColumns | None:
    """The radiation columns the heating-rate metric needs, or None if the store lacks them."""
    xf = list(manifest.arrays["x"].features or ())
    yf = list(manifest.arrays["y"].features or ()) if "y" in manifest.arrays else []
    try:
        if kind == "mlp":
            levels = sum(1 for f in yf if f.startswith("flux_dn_sw["))
            if levels < 2:
                return None
            flux = {
                b: tuple(
                    np.array([yf.index(f"flux_{d}_{b}[{k}]") for k in range(levels)])
                    for d in ("dn", "up")
                )
                for b in BANDS
            }
            pressure = np.array([xf.index(f"hl_inputs[{k},pressure_hl]") for k in range(levels)])
        elif kind == "gnn":
            flux = {
                b: (np.array([yf.index(f"flux_dn_{b}")]), np.array([yf.index(f"flux_up_{b}")]))
                for b in BANDS
            }
            pressure = np.array([xf.index("pressure_hl")])
        else:
            return None
    except ValueError:
        return None
    return HeatingRateColumns(flux=flux, pressure=pressure)  # type: ignore[arg-type]


class ExampleTask(pl.LightningModule):
    """Regression of ``y`` from a store's inputs with MSE on normalised targets.

    Parameters
    ----------
    kind
        ``"mlp"`` (``x`` (B, F) -> ``y`` (B, T)), ``"gnn"`` (a graph store: ``x``, ``edge_attr``,
        ``y`` on nodes) or ``"lstm"`` (``x`` (B, lookback, F) -> ``y``).
    manifest
        The store's manifest (shapes, features, statistics, static graph).
    normalize
        The :class:`~shardload.train.transforms.Normalize` the loaders apply (None: raw values);
        used here to put predictions back in physical units for the heating rates.
    out_dir
        Where rank 0 writes ``metrics.csv`` (a row per epoch); None: nowhere.
    """

    #: the model kinds this task builds (a subclass with its own ``_build_model`` has others)
    kinds: tuple[str, ...] = KINDS

    def __init__(
        self,
        kind: str,
        manifest: Any,
        *,
        normalize: Normalize | None = None,
        out_dir: str | Path | None = None,
        lr: float = 1e-3,
        hidden: int | None = None,
    ) -> None:
        super().__init__()
        if kind not in self.kinds:
            raise ShardloadError(f"model {kind!r} unknown; use one of {self.kinds}")
        self.kind, self.lr, self.normalize = kind, lr, normalize
        self.hr: HeatingRateColumns | None = None
        self._build_model(manifest, hidden)
        self.out_dir = Path(out_dir) if out_dir is not None else None
        self.rows: list[dict[str, float]] = []
        #: losses of baselines the task scores itself on the validation batches (forecast:
        #: persistence), by metrics.json name; the mean predictor's otherwise comes from the store
        self.baselines: dict[str, float] = {}
        #: called with the trainer after a whole epoch's row is written (the checkpoint)
        self.epoch_end: Callable[[Any], None] | None = None
        self._restored: tuple[np.ndarray, np.ndarray, float] | None = None
        self._epoch_done = False
        self._reset_epoch()

    def _build_model(self, manifest: Any, hidden: int | None) -> None:
        """``self.model`` for ``self.kind`` from the store's shapes (and the heating-rate
        columns, where the store has them)."""
        arrays = manifest.arrays
        check_store_fits(self.kind, arrays)
        xs, ys = arrays["x"].shape, arrays["y"].shape
        self.model: nn.Module
        if self.kind == "mlp":
            self.model = MLP(int(np.prod(xs[1:])), int(np.prod(ys[1:])), hidden=hidden or 256)
        elif self.kind == "lstm":
            self.model = LSTMRegressor(xs[2], int(np.prod(ys[1:])), hidden=hidden or 64)
        else:
            self.model = GNN(xs[2], arrays["edge_attr"].shape[2], ys[2], hidden=hidden or 64)
            self.graphs = GraphBatcher(manifest.static)
        self.hr = plan_heating_rate_columns(self.kind, manifest)

    # -- steps -------------------------------------------------------------------------------------
    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        x = self._clip(batch["x"])
        if self.kind == "gnn":
            edges = self._clip(batch["edge_attr"])
            graph = self.graphs(x, edges, directed_edge_attr=False)
            return self.model(graph).reshape(batch["y"].shape)
        return self.model(x).reshape(batch["y"].shape)

    def _clip(self, t: torch.Tensor) -> torch.Tensor:
        # normalised inputs can hold rare values hundreds of standard deviations out (a feature
        # that is nearly constant, e.g. a trace gas at the model top): they swamp the first
        # layer and the model learns only the mean; beyond INPUT_CLIP they are held at it
        return t.clamp(-INPUT_CLIP, INPUT_CLIP) if self.normalize is not None else t

    def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self(batch), batch["y"])
        n = len(batch["index"])
        self._sums[0] += float(loss.detach()) * n
        self._sums[1] += n
        return loss

    def validation_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> None:
        pred = self(batch)
        n = len(batch["index"])
        self._sums[2] += float(nn.functional.mse_loss(pred, batch["y"])) * n
        self._sums[3] += n
        if self.hr is not None:
            self._heating_rate_errors(batch, pred)

    def _physical(self, name: str, t: torch.Tensor) -> np.ndarray:
        t = t.detach().float()
        if self.normalize is not None and name in self.normalize.params:
            t = self.normalize.inverse(name, t)
        return t.cpu().numpy()

    def _heating_rate_errors(self, batch: dict[str, torch.Tensor], pred: torch.Tensor) -> None:
        from shardload.prep.sources.radiation_rows import heating_rate_np

        assert self.hr is not None
        x, y, p = (
            self._physical(n, t) for n, t in (("x", batch["x"]), ("y", batch["y"]), ("y", pred))
        )
        pressure = x[..., self.hr.pressure]
        if self.kind == "gnn":  # (B, nodes, 1): one feature per node
            pressure = pressure[..., 0]
        for i, band in enumerate(BANDS):
            dn, up = self.hr.flux[band]

            def pick(a: np.ndarray, idx: np.ndarray) -> np.ndarray:
                return a[..., idx][..., 0] if self.kind == "gnn" else a[..., idx]

            hr_true = heating_rate_np(pick(y, dn), pick(y, up), pressure)
            hr_pred = heating_rate_np(pick(p, dn), pick(p, up), pressure)
            err = (hr_pred.astype(np.float64) - hr_true) ** 2
            ok = np.isfinite(err)
            self._hr[i, 0] += float(err[ok].sum())
            self._hr[i, 1] += int(ok.sum())

    # -- epoch bookkeeping ------------------------------------------------------------------------
    def _reset_epoch(self) -> None:
        self._sums = np.zeros(4)  # train loss*rows, train rows, val loss*rows, val rows
        self._hr = np.zeros((2, 2))  # per band: squared error sum, count
        self._t0 = time.perf_counter()
        self._train_s: float | None = None

    def on_train_epoch_start(self) -> None:
        self._epoch_done = False
        if self._restored is not None:  # resumed mid-epoch: keep the epoch's sums so far
            self._sums, self._hr, elapsed = self._restored
            self._t0 = time.perf_counter() - elapsed
            self._train_s, self._restored = None, None
            return
        self._reset_epoch()

    def on_validation_epoch_start(self) -> None:
        if self.trainer.training and self._train_s is None:
            self._train_s = time.perf_counter() - self._t0
        self._sums[2:] = 0  # a cut epoch validated again after a resume counts once
        self._hr[:] = 0

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        elapsed = self._train_s if self._train_s is not None else time.perf_counter() - self._t0
        checkpoint["shardload_train"] = {
            "rows": [{k: float(v) for k, v in r.items()} for r in self.rows],
            "sums": self._sums.tolist(),
            "hr": self._hr.tolist(),
            "train_seconds": elapsed,
            "mid_epoch": not self._epoch_done,
        }

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("shardload_train")
        if state is None:
            return
        self.rows = [dict(r) for r in state["rows"]]
        if state["mid_epoch"]:
            self._restored = (
                np.asarray(state["sums"], dtype=np.float64),
                np.asarray(state["hr"], dtype=np.float64),
                float(state["train_seconds"]),
            )

    def _reduce(self, values: np.ndarray) -> np.ndarray:
        t = torch.as_tensor(values, dtype=torch.float64, device=self.device)
        return self.trainer.strategy.reduce(t, reduce_op="sum").cpu().numpy()  # type: ignore[no-any-return]

    def on_train_epoch_end(self) -> None:
        train_s = self._train_s if self._train_s is not None else time.perf_counter() - self._t0
        sums, hr = self._reduce(self._sums), self._reduce(self._hr)
        seconds = (
            float(self._reduce(np.array([train_s]))[0]) / self.trainer.world_size
        )  # mean over ranks
        row = {
            "epoch": self.current_epoch,
            "train_loss": sums[0] / sums[1] if sums[1] else float("nan"),
            "val_loss": sums[2] / sums[3] if sums[3] else float("nan"),
        }
        if self.hr is not None:  # only where the store has fluxes and pressure (radiation)
            row["hr_rmse_sw"] = float(np.sqrt(hr[0, 0] / hr[0, 1])) if hr[0, 1] else float("nan")
            row["hr_rmse_lw"] = float(np.sqrt(hr[1, 0] / hr[1, 1])) if hr[1, 1] else float("nan")
        row["samples_per_s"] = sums[1] / seconds if seconds > 0 else float("nan")
        row["train_seconds"] = seconds
        # a row per epoch: an epoch cut by --max-steps and finished after --resume is replaced
        self.rows = [r for r in self.rows if int(r["epoch"]) != self.current_epoch] + [row]
        # the same on every rank (reduced above); sync_dist keeps Lightning's DDP check quiet
        self.log_dict({k: float(v) for k, v in row.items() if k != "epoch"}, sync_dist=True)
        if self.trainer.is_global_zero:
            if self.out_dir is not None:
                write_metrics(self.out_dir / "metrics.csv", self.rows)
            log.info(
                "epoch %d/%d: %s",
                self.current_epoch + 1,
                self.trainer.max_epochs,
                ", ".join(f"{k} {float(v):.4g}" for k, v in row.items() if k != "epoch"),
            )
        self._epoch_done = True
        if (
            self.epoch_end is not None
            and self.trainer.fit_loop.epoch_loop.batch_progress.is_last_batch
        ):
            self.epoch_end(
                self.trainer
            )  # a whole epoch: checkpoint (a cut one was saved at its cut)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.lr)


def write_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    """``rows`` as CSV, the columns of :data:`COLUMNS` that the rows have (no ``hr_rmse_*``
    for a task without heating rates, e.g. forecast)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".csv.tmp")
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        for row in rows:
            w.writerow({k: (int(v) if k == "epoch" else f"{float(v):.6g}") for k, v in row.items()})
    tmp.replace(path)
