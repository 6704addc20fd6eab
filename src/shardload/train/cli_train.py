"""``shardload train {mlp,gnn,lstm,forecast} STORE``: train an example model with Lightning.

Trains on the store's ``train`` split, validates on ``val`` each epoch (also an epoch cut by
``--max-steps``), and writes into ``--out`` (default ``$SHARDLOAD_HOME/artifacts/<model>-<time>``):
``metrics.csv`` (a row per epoch), ``metrics.json`` (the last ``val_loss`` and the mean
predictor's ``val_loss_mean_predictor``; forecast: also persistence's ``val_loss_persistence``),
``last.ckpt`` (kept current atomically: every
``--checkpoint-every`` steps and every epoch; ``--resume`` continues from it, mid-epoch
included), ``model.ckpt`` (the final one) and ``loss.png`` (when matplotlib is installed).
"""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from shardload.errors import ShardloadError
from shardload.train import CHECKPOINT_NAME
from shardload.train.needs import NEEDS, check_store_fits

log = logging.getLogger("shardload.train")

#: carries the output folder to the processes Lightning's DDP launcher starts (same command
#: line, so a default folder named by the time would differ per rank)
OUT_ENV = "SHARDLOAD_TRAIN_OUT"
#: the files a run writes into --out (what --overwrite replaces)
OUTPUTS = ("metrics.csv", "metrics.json", CHECKPOINT_NAME, "model.ckpt", "loss.png")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train an example model (mlp, gnn, lstm, forecast) on a store with PyTorch Lightning",
        description="Train on the store's train split, validate on its val split each epoch, and "
        "write metrics.csv (a row per epoch), metrics.json (last val_loss and the mean "
        "predictor's), last.ckpt (every --checkpoint-every steps and every epoch; --resume "
        "continues from it), model.ckpt and loss.png into --out. mlp reads a "
        "flat store (x, y), gnn a radiation graph store (x, edge_attr, y; needs the 'gnn' "
        "extra), lstm a window store (x (samples, lookback, features), y), forecast a dated store "
        "of global states (state: VAR[LAT,LON] features; windows of --inputs + --rollout dates) "
        "and also reports persistence's val_loss_persistence.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("model", choices=("mlp", "gnn", "lstm", "forecast"))
    p.add_argument("store", help="path or URL of a prepared store")
    p.add_argument(
        "--epochs",
        type=int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="epochs (default: 10; forecast: 4)",
    )
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="S",
        help="stop after S optimizer steps in all; the epoch it cuts is validated",
    )
    p.add_argument(
        "--batch-size",
        type=int,
        default=argparse.SUPPRESS,
        metavar="B",
        help="rows (forecast: windows) per batch per rank (default: 256; forecast: 32)",
    )
    p.add_argument(
        "--num-workers", type=int, default=2, metavar="W", help="DataLoader workers per rank"
    )
    p.add_argument("--devices", type=int, default=1, metavar="D", help="processes (DDP when > 1)")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output folder (default $SHARDLOAD_HOME/artifacts/<model>-<time>); an existing "
        "one is refused unless --overwrite or --resume",
    )
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--overwrite",
        action="store_true",
        help=f"replace the outputs of an earlier run in --out ({', '.join(OUTPUTS)})",
    )
    again.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last.ckpt (exactly: the same batches, also "
        "mid-epoch); give the same options, --epochs / --max-steps may grow",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=200,
        metavar="S",
        help="also save last.ckpt every S optimizer steps (0: only at the end of each epoch)",
    )
    p.add_argument(
        "--normalize",
        choices=("standardize", "maxscale", "none"),
        default="standardize",
        help="scale inputs and targets with the manifest's statistics, in the loader workers",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    _add_forecast_options(p)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train)


def _add_forecast_options(p: Any) -> None:
    g = p.add_argument_group("forecast (a dated store: windows of --inputs + --rollout dates)")
    g.add_argument("--inputs", type=int, default=2, metavar="I", help="input states (dates)")
    g.add_argument(
        "--rollout",
        type=int,
        default=2,
        metavar="O",
        help="states predicted autoregressively, all in the loss",
    )


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        out = Path(args.out)
    elif os.environ.get(OUT_ENV):
        out = Path(os.environ[OUT_ENV])
    else:
        if args.resume:
            raise ShardloadError("--resume needs --out DIR: the folder of the run to continue")
        from shardload.util.home import ensure_home

        out = ensure_home() / "artifacts" / f"{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    os.environ[OUT_ENV] = str(out)
    return out


def _check(args: argparse.Namespace) -> None:
    forecast = args.model == "forecast"
    # per-model defaults (argparse.SUPPRESS: absent unless given)
    if getattr(args, "epochs", None) is None:
        args.epochs = 4 if forecast else 10
    if getattr(args, "batch_size", None) is None:
        args.batch_size = 32 if forecast else 256
    for name in ("epochs", "batch_size", "devices", "inputs", "rollout"):
        if getattr(args, name) < 1:
            raise ShardloadError(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
            )
    for name in ("num_workers", "checkpoint_every"):
        if getattr(args, name) < 0:
            raise ShardloadError(
                f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}"
            )
    if args.max_steps is not None and args.max_steps < 1:
        raise ShardloadError(f"--max-steps must be >= 1, got {args.max_steps}")


def check_dependencies(model: str) -> bool:
    """Raise before any work when a needed package is missing; False (with a warning) when
    only matplotlib, for the loss plot, is."""
    need = [("lightning", "shardload[train]"), ("torch", "shardload[train]")]
    if model == "gnn":
        need.append(("torch_geometric", "shardload[gnn]"))
    missing = [(m, extra) for m, extra in need if importlib.util.find_spec(m) is None]
    if missing:
        raise ShardloadError(
            f"shardload train {model} needs "
            + ", ".join(m for m, _ in missing)
            + ": pip install "
            + " ".join(sorted({f"'{e}'" for _, e in missing}))
        )
    if importlib.util.find_spec("matplotlib") is None:
        log.warning("matplotlib is not installed: no loss.png (pip install 'shardload[train]')")
        return False
    return True


def prepare_out(out: Path, *, overwrite: bool, resume: bool) -> None:
    """Refuse an earlier run's folder unless --overwrite (its outputs are removed) or --resume
    (its last.ckpt must exist)."""
    if resume:
        if not (out / CHECKPOINT_NAME).is_file():
            raise ShardloadError(f"--resume: {out / CHECKPOINT_NAME} does not exist")
        return
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        if not overwrite:
            raise ShardloadError(
                f"--out {out} exists and is not empty; pass --overwrite to replace an earlier "
                "run's outputs, --resume to continue it, or another --out"
            )
        if not out.is_dir():
            raise ShardloadError(f"--out {out} is a file, not a folder")
        for name in OUTPUTS:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)


def _quiet_lightning() -> None:
    """One copy of each Lightning message: its loggers propagate to ours instead of printing
    through handlers of their own too; its tips and notices below warnings are dropped."""
    for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.setLevel(logging.WARNING)
        lg.propagate = True
    warnings.filterwarnings("ignore", message=".*`srun` command is available.*")
    warnings.filterwarnings("ignore", message=".*LeafSpec.*is deprecated.*")
    # our loaders' __len__ is exact with workers (the plan gives each worker its own rows)
    warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")


def _set_threads(args: argparse.Namespace) -> None:
    """PyTorch's threads: the cores each rank has left beside its DataLoader workers. Its
    default (every core) on top of the workers oversubscribes the cores, and OpenMP's busy
    waits then slow message passing down several times (the GNN example: 18 against 134
    samples/s on a 2-core machine). ``OMP_NUM_THREADS`` set by the user wins."""
    if os.environ.get("OMP_NUM_THREADS"):
        return
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    threads = max(1, (cores or 1) // args.devices - args.num_workers)
    torch.set_num_threads(threads)
    log.debug("torch threads per rank: %d", threads)


def cmd_train(args: argparse.Namespace) -> int:
    _check(args)
    plot = check_dependencies(args.model)
    from shardload.store.core import open_store

    store = open_store(args.store)
    m = store.manifest
    for split in ("train", "val"):
        if split not in m.splits:
            raise ShardloadError(
                f"store {store.url} has no {split!r} split (it has {sorted(m.splits) or 'none'}); "
                "prepare it with splits: {train: ..., val: ..., test: ...}"
            )
    if args.model in NEEDS:
        check_store_fits(args.model, m.arrays)
    out = _out_dir(args)
    if int(os.environ.get("LOCAL_RANK", "0")) == 0 and os.environ.get("NODE_RANK", "0") == "0":
        prepare_out(out, overwrite=args.overwrite, resume=args.resume)
    # Lightning and torch (seconds to import) once the store and --out are known to do
    import lightning.pytorch as pl

    _quiet_lightning()
    from shardload.torch.lightning import ShardloadDataModule
    from shardload.train.callbacks import AtomicCheckpoint, StepLimit, save_atomic
    from shardload.train.transforms import Normalize

    _set_threads(args)
    pl.seed_everything(args.seed, verbose=False)
    arrays = NEEDS.get(args.model, ("state",))
    norm = None
    if args.normalize != "none":
        norm = Normalize(m, [a for a in arrays if a in m.arrays], method=args.normalize)
    task, options = _task(args, m, norm, out)
    dm = ShardloadDataModule(
        store,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        seed=args.seed,
        test_split=None,
        transform=norm,
        arrays=[a for a in arrays if a in m.arrays],
        **options,
    )
    ckpt = AtomicCheckpoint(out, every_n_steps=args.checkpoint_every, max_steps=args.max_steps)
    task.epoch_end = ckpt.save
    callbacks: list[Any] = [ckpt]
    if args.max_steps is not None:
        callbacks.insert(0, StepLimit(args.max_steps))
    bar = sys.stderr.isatty()
    if bar:
        callbacks.append(pl.callbacks.TQDMProgressBar())
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        devices=args.devices,
        accelerator="cpu",
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        callbacks=callbacks,
        enable_checkpointing=False,
        enable_progress_bar=bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=str(out),
    )
    trainer.fit(task, datamodule=dm, ckpt_path=str(out / CHECKPOINT_NAME) if args.resume else None)
    save_atomic(trainer, out / "model.ckpt")
    if trainer.is_global_zero:
        _report(args, task.rows, out, store, norm, plot=plot, baselines=task.baselines)
    return 0


def _task(args: argparse.Namespace, m: Any, norm: Any, out: Path) -> tuple[Any, dict[str, Any]]:
    """The LightningModule of ``args.model`` and the loader options it needs (forecast: the
    window of dates)."""
    if args.model == "forecast":
        from shardload.train.forecast import ForecastTask

        task: Any = ForecastTask(
            m, inputs=args.inputs, rollout=args.rollout, normalize=norm, out_dir=out, lr=args.lr
        )
        return task, {"window": task.window}
    from shardload.train.task import ExampleTask

    return ExampleTask(args.model, m, normalize=norm, out_dir=out, lr=args.lr), {}


def _report(
    args: argparse.Namespace,
    rows: list[dict[str, float]],
    out: Path,
    store: Any,
    norm: Any,
    *,
    plot: bool,
    baselines: dict[str, float] | None = None,
) -> None:
    """metrics.json (the last val_loss beside the mean predictor's, and the task's own
    ``baselines`` where it has them: forecast's persistence), loss.png, a summary."""
    from shardload.train.baseline import mean_predictor_loss, write_metrics_json

    extra = dict(baselines or {})
    if "val_loss_mean_predictor" in extra:
        baseline = extra.pop("val_loss_mean_predictor")
    else:
        baseline = mean_predictor_loss(store, scale=None if norm is None else norm.params["y"][1])
    last = rows[-1] if rows else {}
    val = float(last.get("val_loss", float("nan")))
    write_metrics_json(
        out / "metrics.json",
        {
            "model": args.model,
            "store": store.url,
            "epochs": len(rows),
            "val_loss": val,
            "val_loss_mean_predictor": baseline,
            "val_loss_ratio": val / baseline if baseline else float("nan"),
            "train_loss": float(last.get("train_loss", float("nan"))),
            # the heating-rate errors where the task computes them (radiation stores only)
            **{k: float(last[k]) for k in ("hr_rmse_sw", "hr_rmse_lw") if k in last},
            **extra,
        },
    )
    wrote = [out / "metrics.csv", out / "metrics.json", out / "model.ckpt", out / CHECKPOINT_NAME]
    if plot:
        plot_losses(rows, out / "loss.png", title=f"{args.model} on {store.url}")
        wrote.append(out / "loss.png")
    print(
        f"trained {args.model}: {len(rows)} epochs, val_loss {val:.4g} "
        f"(mean predictor {baseline:.4g}, ratio {val / baseline:.3g})"
        + "".join(f", {k.removeprefix('val_loss_')} {v:.4g}" for k, v in extra.items())
    )
    print("wrote " + ", ".join(str(p) for p in wrote))


def plot_losses(rows: list[dict[str, float]], path: Path, *, title: str = "") -> None:
    """Train and validation loss per epoch (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    epochs = [int(r["epoch"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.plot(epochs, [r["train_loss"] for r in rows], "o-", label="train")
    ax.plot(epochs, [r["val_loss"] for r in rows], "s-", label="val")
    ax.set_xlabel("epoch")
    ax.set_ylabel("MSE (normalised units)")
    ax.set_yscale("log")
    ax.set_title(title, fontsize=8)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
