"""Normalisation from the manifest's per-feature statistics, applied to whole batches.

:class:`Normalize` is a picklable callable on a batch (a dict of tensors). Passed as the
``collate_fn`` of a :class:`~shardload.torch.StreamingDataLoader` it runs in the DataLoader
workers, in place on the batch's tensors (so a batch in a shared-memory ring slot keeps its
zero-copy hand-off); features are the last axis, as in :mod:`shardload.prep.stats`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from shardload.errors import ShardloadError

#: how an array is scaled: ``(x - mean) / std`` or ``x / max(|min|, |max|)`` (as the MAELSTROM
#: radiation benchmark scales its inputs)
METHODS = ("standardize", "maxscale")

#: normalised inputs are clipped to +-INPUT_CLIP standard deviations: rare values hundreds of
#: standard deviations out (a nearly constant feature) swamp a first layer and the model learns
#: only the mean (the examples' ExampleTask._clip and the demo's MLP)
INPUT_CLIP = 5.0


def plan_scale(stats: Any, method: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature ``(shift, scale)`` float32 so that ``(x - shift) / scale`` normalises (pure).

    Features that are constant, all-NaN or zero get scale 1 (they are shifted only), so no
    division by zero can make a NaN out of a finite value.
    """
    if method == "standardize":
        shift = np.nan_to_num(np.asarray(stats.mean, dtype=np.float64))
        scale = np.asarray(stats.std, dtype=np.float64)
    elif method == "maxscale":
        lo = np.abs(np.asarray(stats.min, dtype=np.float64))
        hi = np.abs(np.asarray(stats.max, dtype=np.float64))
        shift = np.zeros_like(lo)
        scale = np.fmax(lo, hi)
    else:
        raise ShardloadError(f"normalisation method {method!r} unknown; use one of {METHODS}")
    scale = np.where(np.isfinite(scale) & (scale > 0), scale, 1.0)
    return shift.astype(np.float32), scale.astype(np.float32)


class Normalize:
    """``batch[a] = (batch[a] - shift) / scale`` for the chosen arrays, in place.

    Parameters
    ----------
    manifest
        A store's manifest (its ``stats``).
    arrays
        Names of the arrays to normalise (floating point, with statistics in the manifest).
    method
        ``"standardize"`` or ``"maxscale"``.
    """

    def __init__(self, manifest: Any, arrays: Sequence[str], *, method: str = "standardize"):
        self.method = method
        self.params: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in arrays:
            if name not in manifest.arrays:
                raise ShardloadError(
                    f"normalise: array {name!r} is not in the store; it has {sorted(manifest.arrays)}"
                )
            if not np.issubdtype(np.dtype(manifest.arrays[name].dtype), np.floating):
                raise ShardloadError(
                    f"normalise: array {name!r} has dtype {manifest.arrays[name].dtype}; only "
                    "floating-point arrays can be normalised"
                )
            st = manifest.stats.get(name)
            if st is None:
                raise ShardloadError(
                    f"normalise: the store has no statistics for array {name!r} (prepared "
                    "without stats?)"
                )
            self.params[name] = plan_scale(st, method)
        self._tensors: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        #: variable-length arrays: their padding (after NAME_length values) stays zero
        self.ragged = tuple(n for n in arrays if manifest.arrays[n].is_ragged)

    def inverse(self, name: str, values: torch.Tensor) -> torch.Tensor:
        """Back to physical units (a new tensor)."""
        shift, scale = self._params(name, values)
        return values * scale + shift

    def _params(self, name: str, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        got = self._tensors.get(name)
        if got is None or got[0].device != like.device:
            shift, scale = self.params[name]
            got = (torch.from_numpy(shift).to(like.device), torch.from_numpy(scale).to(like.device))
            self._tensors[name] = got
        return got

    def __call__(self, batch: Mapping[str, torch.Tensor]) -> Mapping[str, torch.Tensor]:
        for name in self.params:
            t = batch[name]
            shift, scale = self._params(name, t)
            t.sub_(shift).div_(scale)
        for name in getattr(self, "ragged", ()):
            t, n = batch[name], batch[name + "_length"]
            cols = torch.arange(t.shape[-1], device=t.device)
            t.masked_fill_(cols >= n.to(t.device)[:, None], 0)
        return batch

    def __getstate__(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "params": self.params,
            "_tensors": {},
            "ragged": getattr(self, "ragged", ()),
        }
