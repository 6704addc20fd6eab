"""Lightning callbacks of ``shardload train``: the step limit, atomic checkpoints, epoch lines.

- :class:`StepLimit` stops after ``max_steps`` optimizer steps in all by asking the trainer to
  stop, which Lightning answers by validating the cut epoch (``Trainer(max_steps=...)`` ends the
  loop without validating an epoch it cuts).
- :class:`AtomicCheckpoint` keeps ``last.ckpt`` current: every ``every_n_steps`` steps, at the
  step where the limit cuts the run, and at the end of every epoch (called by the task once
  the epoch's metrics row exists). Each save goes to a temporary file renamed into place, so
  a run killed while saving leaves the previous checkpoint whole.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from shardload.train import CHECKPOINT_NAME

log = logging.getLogger("shardload.train")


def save_atomic(trainer: pl.Trainer, path: Path) -> None:
    """``trainer.save_checkpoint`` to ``path`` through a temporary name (every rank calls it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    trainer.save_checkpoint(tmp)
    if trainer.is_global_zero:
        os.replace(tmp, path)
    trainer.strategy.barrier("shardload_checkpoint")


class StepLimit(pl.Callback):
    """Stop after ``max_steps`` optimizer steps in all; the epoch it cuts is validated."""

    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if trainer.global_step >= self.max_steps:
            trainer.should_stop = True


class AtomicCheckpoint(pl.Callback):
    """``DIR/last.ckpt`` every ``every_n_steps`` steps (0: never mid-epoch) and when
    :class:`StepLimit` cuts the run; :meth:`save` at every epoch's end."""

    def __init__(self, out_dir: Path, *, every_n_steps: int, max_steps: int | None) -> None:
        self.path = Path(out_dir) / CHECKPOINT_NAME
        self.every_n_steps = every_n_steps
        self.max_steps = max_steps
        self._saved_step = -1

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        step = trainer.global_step
        periodic = self.every_n_steps > 0 and step % self.every_n_steps == 0
        if periodic or (self.max_steps is not None and step >= self.max_steps):
            self.save(trainer)

    def save(self, trainer: pl.Trainer) -> None:
        save_atomic(trainer, self.path)
        self._saved_step = trainer.global_step
