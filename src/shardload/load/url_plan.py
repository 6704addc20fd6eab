"""The reading loop tells a store read by URL which rows this worker reads this epoch.

Called once per worker and epoch (:func:`plan_url_reads`, from ``batches.read_batches``). A
reader that offers ``plan_reads(names, first, last)`` (the Zarr reader of a sharded store by
URL: ``formats/zarr/kept.py``) then keeps the chunks that one group's requests brought for a
later group of this worker, instead of fetching them again. The spans are the worker's
range segments in plan order (segments of explicit rows, read by another path, left out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import iter_worker_spans


def plan_url_reads(
    store: Any, names: Sequence[str], plan: EpochPlan, rank: int, worker: int
) -> None:
    """Hand ``store``'s reader this worker's row spans of ``plan`` (by URL only)."""
    plan_reads: Callable[..., None] | None = getattr(store.reader, "plan_reads", None)
    if plan_reads is None or store.is_local:
        return
    firsts, lasts = [], []
    for spans, _ in iter_worker_spans(plan, rank, worker):
        ranges = spans.ex < 0
        first = (spans.base + spans.lo)[ranges]
        firsts.append(first)
        lasts.append(first + (spans.hi - spans.lo)[ranges])
    arrays = store.manifest.arrays
    first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
    last = np.concatenate(lasts) if lasts else np.zeros(0, np.int64)
    plan_reads([n for n in names if n in arrays], first, last)
