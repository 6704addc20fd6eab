"""The mean predictor: the validation loss of predicting the train split's mean target.

Every example run reports its final validation loss beside this one (``metrics.json``): a model
that learnt nothing ends near it, so ``val_loss / val_loss_mean_predictor`` says how much of the
targets' variance the model explains (1 - R^2 in normalised units). Reads only ``y``, one pass
over train and one over val, in numpy (no torch).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np


def _split_rows(store: Any, split: str, *, batch_rows: int) -> Iterator[np.ndarray]:
    m = store.manifest
    if split in m.split_rows:
        ranges = [tuple(m.split_rows[split])]
    else:
        ranges = [m.chunk_range(i) for i in m.split_chunks(split)]
    for a, b in ranges:
        for start in range(a, b, batch_rows):
            yield np.asarray(store.read("y", start, min(b, start + batch_rows)), dtype=np.float64)


def mean_predictor_loss(
    store: Any,
    *,
    scale: np.ndarray | None = None,
    train_split: str = "train",
    val_split: str = "val",
    batch_rows: int = 8192,
) -> float:
    """Mean squared error over ``val`` of predicting, for every target element, its mean over
    ``train``; in the units the training loss uses: the targets divided by ``scale`` (per
    feature, the last axis; the shift cancels), or raw units when ``scale`` is None."""
    total: np.ndarray | None = None
    rows = 0
    for y in _split_rows(store, train_split, batch_rows=batch_rows):
        s = y.sum(axis=0)
        total = s if total is None else total + s
        rows += len(y)
    if total is None or rows == 0:
        return float("nan")
    mean = total / rows
    inv = 1.0 if scale is None else 1.0 / np.asarray(scale, dtype=np.float64)
    err, count = 0.0, 0
    for y in _split_rows(store, val_split, batch_rows=batch_rows):
        d = (y - mean) * inv
        err += float(np.square(d).sum())
        count += d.size
    return err / count if count else float("nan")


def write_metrics_json(path: Path, values: dict[str, Any]) -> None:
    """``values`` as JSON (NaN as null), written to a temporary file and renamed into place."""
    clean = {
        k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in values.items()
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(clean, indent=2) + "\n")
    os.replace(tmp, path)
