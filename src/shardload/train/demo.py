"""A small MLP trained from a store: the demo's last step and a template for real training.

Inputs and targets are standardised with the per-feature statistics from the manifest (no pass
over the data needed). Torch is imported here, inside the function, so the demo's other steps
run without it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from shardload.train.baseline import mean_predictor_loss


def _norm(store: Any, name: str) -> tuple[np.ndarray, np.ndarray]:
    st = store.manifest.stats[name]
    mean = np.nan_to_num(np.asarray(st.mean, dtype=np.float32))
    std = np.asarray(st.std, dtype=np.float32)
    std = np.where(np.isfinite(std) & (std > 0), std, 1.0).astype(np.float32)
    return mean, std


def train_mlp(
    store: Any,
    *,
    steps: int = 300,
    batch_size: int = 256,
    num_workers: int = 2,
    x: str = "x",
    y: str = "y",
    hidden: int = 256,
    lr: float = 1e-3,
    seed: int = 0,
) -> dict[str, Any]:
    import torch
    from torch import nn

    from shardload.torch import StreamingDataLoader, StreamingDataset
    from shardload.train.transforms import INPUT_CLIP

    torch.manual_seed(seed)
    ds = StreamingDataset(store, batch_size=batch_size, split="train", shuffle=True, seed=seed)
    loader = StreamingDataLoader(ds, num_workers=num_workers, persistent_workers=num_workers > 0)
    (mx, sx), (my, sy) = _norm(store, x), _norm(store, y)
    mx_t, sx_t, my_t, sy_t = (torch.from_numpy(a) for a in (mx, sx, my, sy))
    n_in, n_out = store.manifest.arrays[x].shape[1], store.manifest.arrays[y].shape[1]
    model = nn.Sequential(
        nn.Linear(n_in, hidden),
        nn.SiLU(),
        nn.Linear(hidden, hidden),
        nn.SiLU(),
        nn.Linear(hidden, n_out),
    )
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    row_bytes = store.manifest.arrays[x].row_bytes + store.manifest.arrays[y].row_bytes
    losses: list[float] = []
    seen, step, epoch = 0, 0, 0
    t0 = time.perf_counter()
    while step < steps:
        ds.set_epoch(epoch)
        for batch in loader:
            xb = ((batch[x] - mx_t) / sx_t).clamp(-INPUT_CLIP, INPUT_CLIP)
            yb = (batch[y] - my_t) / sy_t
            loss = nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            seen += len(batch["index"])
            step += 1
            if step >= steps:
                break
        epoch += 1
    dt = time.perf_counter() - t0
    val_loss, val_rows = _validate(store, model, (mx_t, sx_t, my_t, sy_t), x, y, batch_size)
    return {
        "val_loss": val_loss,
        # what a model that learnt nothing gets, in the same (standardised) units
        "val_loss_mean_predictor": mean_predictor_loss(store, scale=sy),
        "val_rows": val_rows,
        "steps": step,
        "epochs": epoch,
        "params": sum(p.numel() for p in model.parameters()),
        "first_loss": float(np.mean(losses[:10])),
        "last_loss": float(np.mean(losses[-10:])),
        "samples_per_s": seen / dt,
        "mb_per_s": seen * row_bytes / dt / 1e6,
        "seconds": dt,
        "model": model,
    }


def _validate(
    store: Any, model: Any, norm: tuple[Any, ...], x: str, y: str, batch_size: int
) -> tuple[float, int]:
    """Mean MSE (normalised) over the store's ``val`` split, every row once, and its rows."""
    import torch

    from shardload.torch import StreamingDataset
    from shardload.train.transforms import INPUT_CLIP

    mx, sx, my, sy = norm
    ds = StreamingDataset(store, batch_size=batch_size, split="val", shuffle=False)
    total, rows = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(ds, batch_size=None):
            pred = model(((batch[x] - mx) / sx).clamp(-INPUT_CLIP, INPUT_CLIP))
            err = torch.nn.functional.mse_loss(pred, (batch[y] - my) / sy, reduction="sum")
            total += float(err) / pred.shape[-1]
            rows += len(batch["index"])
    model.train()
    return total / max(1, rows), rows
