"""Run by tests/test_lightning.py in a subprocess (Lightning's ddp launcher re-runs this script
for rank 1): fit a tiny model on a store through ShardloadDataModule and record the ``index``
of every training batch, per rank, in ``OUT/seen-<tag>-rank<r>.txt`` (lines: epoch step rows).

usage: lightning_script.py STORE OUT TAG EPOCHS WORKERS [CKPT_EVERY | RESUME_CKPT]
"""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch

from shardload.torch.lightning import ShardloadDataModule


class Recorder(pl.LightningModule):
    def __init__(self, out: Path, tag: str) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 1)
        self.out, self.tag = out, tag

    def training_step(self, batch, batch_idx):
        rows = " ".join(str(int(i)) for i in batch["index"])
        path = self.out / f"seen-{self.tag}-rank{self.global_rank}.txt"
        with open(path, "a") as f:
            f.write(f"{self.current_epoch} {self.global_step} {rows}\n")
        return self.lin(batch["x"]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.lin(batch["x"]).pow(2).mean(), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1e-3)


def main() -> None:
    store, out, tag, epochs, workers = sys.argv[1:6]
    extra = sys.argv[6] if len(sys.argv) > 6 else ""
    out_dir = Path(out)
    callbacks = []
    resume = None
    if extra.isdigit():
        callbacks.append(
            pl.callbacks.ModelCheckpoint(
                dirpath=out_dir / "ckpt",
                filename="{epoch}-{step}",
                save_top_k=-1,
                every_n_train_steps=int(extra),
            )
        )
    elif extra:
        resume = extra
    dm = ShardloadDataModule(store, batch_size=8, num_workers=int(workers), seed=3)
    trainer = pl.Trainer(
        strategy="ddp",
        devices=2,
        accelerator="cpu",
        max_epochs=int(epochs),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=bool(callbacks),
        callbacks=callbacks,
        num_sanity_val_steps=0,
        default_root_dir=str(out_dir),
    )
    trainer.fit(Recorder(out_dir, tag), datamodule=dm, ckpt_path=resume)


if __name__ == "__main__":
    main()
    # the interpreter's last collection at exit skips what is left (torch's and Lightning's
    # modules: seconds of a loaded CI machine, in each rank); what the test reads is written
    gc.freeze()
