"""``shardload train {mlp,gnn,lstm} STORE``: train an example model with Lightning.

Trains on the store's ``train`` split, validates on ``val`` each epoch, and writes into ``--out``
(default ``$SHARDLOAD_HOME/artifacts/<model>-<time>``): ``metrics.csv`` (a row per epoch),
``model.ckpt`` (a Lightning checkpoint) and ``loss.png``.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
import warnings
from pathlib import Path
from typing import Any

from shardload.errors import ShardloadError

log = logging.getLogger("shardload.train")

#: carries the output folder to the processes Lightning's DDP launcher starts (same command
#: line, so a default folder named by the time would differ per rank)
OUT_ENV = "SHARDLOAD_TRAIN_OUT"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "train",
        help="train an example model (mlp, gnn, lstm) on a store with PyTorch Lightning",
        description="Train on the store's train split, validate on its val split each epoch, and "
        "write metrics.csv (a row per epoch), model.ckpt and loss.png into --out. mlp reads a "
        "flat store (x, y), gnn a radiation graph store (x, edge_attr, y; needs the 'gnn' "
        "extra), lstm a window store (x (samples, lookback, features), y).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("model", choices=("mlp", "gnn", "lstm"))
    p.add_argument("store", help="path or URL of a prepared store")
    p.add_argument("--epochs", type=int, default=10, metavar="N")
    p.add_argument(
        "--max-steps",
        type=int,
        default=None,
        metavar="S",
        help="stop after S optimizer steps in all (each epoch is also cut to at most S steps)",
    )
    p.add_argument(
        "--batch-size", type=int, default=256, metavar="B", help="rows per batch per rank"
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
        help="output folder (default $SHARDLOAD_HOME/artifacts/<model>-<time>)",
    )
    p.add_argument(
        "--normalize",
        choices=("standardize", "maxscale", "none"),
        default="standardize",
        help="scale inputs and targets with the manifest's statistics, in the loader workers",
    )
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_train)


def _out_dir(args: argparse.Namespace) -> Path:
    if args.out is not None:
        out = Path(args.out)
    elif os.environ.get(OUT_ENV):
        out = Path(os.environ[OUT_ENV])
    else:
        from shardload.util.home import ensure_home

        out = ensure_home() / "artifacts" / f"{args.model}-{time.strftime('%Y%m%d-%H%M%S')}"
    os.environ[OUT_ENV] = str(out)
    return out


def _check(args: argparse.Namespace) -> None:
    for name in ("epochs", "batch_size", "devices"):
        if getattr(args, name) < 1:
            raise ShardloadError(
                f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}"
            )
    if args.num_workers < 0:
        raise ShardloadError(f"--num-workers must be >= 0, got {args.num_workers}")
    if args.max_steps is not None and args.max_steps < 1:
        raise ShardloadError(f"--max-steps must be >= 1, got {args.max_steps}")


def cmd_train(args: argparse.Namespace) -> int:
    _check(args)
    try:
        import lightning.pytorch as pl
    except ImportError as exc:
        raise ShardloadError(
            "shardload train needs PyTorch Lightning: pip install 'shardload[train]'"
        ) from exc
    from shardload.store.core import open_store
    from shardload.torch.lightning import ShardloadDataModule
    from shardload.train.task import ExampleTask
    from shardload.train.transforms import Normalize

    store = open_store(args.store)
    m = store.manifest
    for split in ("train", "val"):
        if split not in m.splits:
            raise ShardloadError(
                f"store {store.url} has no {split!r} split (it has {sorted(m.splits) or 'none'}); "
                "prepare it with splits: {train: ..., val: ..., test: ...}"
            )
    out = _out_dir(args)
    out.mkdir(parents=True, exist_ok=True)
    pl.seed_everything(args.seed, verbose=False)
    arrays = {"mlp": ("x", "y"), "lstm": ("x", "y"), "gnn": ("x", "edge_attr", "y")}[args.model]
    norm = None
    if args.normalize != "none":
        norm = Normalize(m, [a for a in arrays if a in m.arrays], method=args.normalize)
    task = ExampleTask(args.model, m, normalize=norm, out_dir=out, lr=args.lr)
    dm = ShardloadDataModule(
        store,
        batch_size=args.batch_size,
        num_workers=args.num_workers,
        seed=args.seed,
        test_split=None,
        transform=norm,
        arrays=[a for a in arrays if a in m.arrays],
    )
    limit: int | float = 1.0 if args.max_steps is None else args.max_steps
    trainer = pl.Trainer(
        max_epochs=args.epochs,
        max_steps=-1 if args.max_steps is None else args.max_steps,
        limit_train_batches=limit,
        devices=args.devices,
        accelerator="cpu",
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        default_root_dir=str(out),
    )
    with warnings.catch_warnings():
        # our loaders' __len__ is exact with workers (the plan gives each worker its own rows)
        warnings.filterwarnings("ignore", message=".*`IterableDataset` has `__len__` defined.*")
        trainer.fit(task, datamodule=dm)
    trainer.save_checkpoint(out / "model.ckpt")
    if trainer.is_global_zero:
        plot_losses(task.rows, out / "loss.png", title=f"{args.model} on {store.url}")
        last = task.rows[-1] if task.rows else {}
        print(
            f"trained {args.model}: {len(task.rows)} epochs, "
            + ", ".join(f"{k} {float(v):.4g}" for k, v in last.items() if k != "epoch")
        )
        print(f"wrote {out / 'metrics.csv'}, {out / 'model.ckpt'}, {out / 'loss.png'}")
    return 0


def plot_losses(rows: list[dict[str, float]], path: Path, *, title: str = "") -> None:
    """Train and validation loss per epoch (matplotlib, Agg backend)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ShardloadError(
            "the loss plot needs matplotlib: pip install 'shardload[train]'"
        ) from exc
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
