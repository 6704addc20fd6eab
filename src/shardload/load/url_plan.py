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

from shardload.plan.epoch import EpochPlan
from shardload.plan.groups import worker_spans


def plan_url_reads(
    store: Any, names: Sequence[str], plan: EpochPlan, rank: int, worker: int
) -> None:
    """Hand ``store``'s reader this worker's row spans of ``plan`` (by URL only)."""
    plan_reads: Callable[..., None] | None = getattr(store.reader, "plan_reads", None)
    if plan_reads is None or store.is_local:
        return
    spans = worker_spans(plan, rank, worker)  # no group's rows dealt: only where they lie
    ranges = spans.ex < 0
    first = (spans.base + spans.lo)[ranges]
    last = first + (spans.hi - spans.lo)[ranges]
    arrays = store.manifest.arrays
    plan_reads([n for n in names if n in arrays], first, last)
