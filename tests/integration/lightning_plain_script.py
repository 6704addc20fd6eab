"""Run as a script: a real Lightning ``Trainer(strategy="ddp", devices=2, accelerator="cpu")``
fits 2 epochs over a StreamingDataset through a plain ``DataLoader(num_workers=2)``; Lightning
starts rank 1 by running this script again. Each rank writes the rows of the batches it trained
on, per epoch, to ``OUT_DIR/rank{r}.json``.

usage: lightning_plain_script.py STORE OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L
import torch
from torch.utils.data import DataLoader

from shardload.torch import StreamingDataset


class Model(L.LightningModule):
    def __init__(self, out: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.out = out
        self.seen: dict[int, list[list[int]]] = {}

    def training_step(self, batch: dict[str, torch.Tensor], i: int) -> torch.Tensor:
        self.seen.setdefault(self.current_epoch, []).append(batch["index"].tolist())
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def on_train_end(self) -> None:
        Path(self.out, f"rank{self.global_rank}.json").write_text(json.dumps(self.seen))


def main() -> None:
    store, out = sys.argv[1], sys.argv[2]
    ds = StreamingDataset(store, batch_size=16, split="train", seed=3)
    # CPython before 3.11.8 (gh-112275): a child forked while another thread holds the
    # interpreter's thread-state lock hangs in os.fork() for good. New workers forked each epoch
    # while the last epoch's queue threads exit hit it (a CI run hung once, py-spy and gdb:
    # _PyThreadState_DeleteExcept); such interpreters start the workers from a forkserver.
    ctx = "forkserver" if sys.version_info < (3, 11, 8) else None
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=ctx)
    trainer = L.Trainer(
        strategy="ddp",
        devices=2,
        accelerator="cpu",
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Model(out), loader)


if __name__ == "__main__":
    main()
