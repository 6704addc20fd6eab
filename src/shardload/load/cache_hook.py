"""The reading loop tells the node cache its plan: which files this node reads, when, and next.

Called once per worker and epoch (:func:`plan_node_cache`, from ``batches.read_batches``) when
the store was opened with ``cache_dir``. The epoch's plan and the next epoch's (the same options,
``epoch + 1``: it is seeded, so known now) are turned into the steps at which the ranks of this
node read each chunk (``plan.cache_plan.plan_node_reads``), then into the stored files that hold
those rows (npy and Parquet chunk files, Zarr chunk or shard files) with the store's digests
of them. The cache evicts by that schedule and reads this worker's next files ahead
(``move/cache_prefetch.py``).

The ranks of this node: ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (set by torchrun) when present
(node ranks are consecutive), else this rank alone.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from shardload.plan.cache_plan import plan_node_reads, sorted_steps
from shardload.plan.epoch import EpochPlan

if TYPE_CHECKING:
    from shardload.load.spec import LoadSpec

log = logging.getLogger("shardload.load")


def node_ranks(rank: int, world_size: int) -> list[int]:
    """The ranks that share this node (and its cache folder)."""
    try:
        local, local_world = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    except (KeyError, ValueError):
        return [rank]
    first = rank - local
    if not (0 <= local < local_world and first >= 0 and first + local_world <= world_size):
        return [rank]
    return list(range(first, first + local_world))


def unit_files(reader: Any, name: str, start: int, stop: int) -> list[tuple[int, str]]:
    """The stored files holding rows ``start:stop`` of array ``name``, as ``(checksum unit,
    path)``: Zarr chunk or shard files (``objects``), npy and Parquet chunk files (``path``);
    [] for a format whose files are not units of rows (HDF5, one file: cached whole, LRU)."""
    objects = getattr(reader, "objects", None)
    if callable(objects):
        obj = objects(name)
        return [] if obj is None else [(k, obj.path(k)) for k in obj.units(start, stop)]
    path = getattr(reader, "path", None)
    bounds = getattr(reader, "bounds", None)
    if callable(path) and bounds is not None:
        first = int(np.searchsorted(bounds, start, side="right")) - 1
        last = int(np.searchsorted(bounds, max(start, stop - 1), side="right")) - 1
        return [(i, path(name, i)) for i in range(first, last + 1)]
    return []


def plan_node_cache(spec: LoadSpec, plan: EpochPlan, rank: int, worker: int) -> bool:
    """Hand the cache of ``spec``'s store this epoch's and the next one's reads (no-op unless
    the store was opened with ``cache_dir``). Whether the cache holds every file this worker
    reads this epoch already (a warm epoch: the loop reads it in place, as a local store)."""
    store = spec.store
    plan_cache: Callable[..., bool] | None = getattr(store.fs, "plan_cache", None)
    if plan_cache is None or getattr(store.fs, "node_cache", None) is None:
        return False
    following = spec.plan(
        world_size=plan.world_size, num_workers=plan.num_workers, epoch=plan.epoch + 1
    )
    reads = plan_node_reads([plan, following], node_ranks(rank, plan.world_size))
    reader = store.reader
    names = [n for n in spec.selection.arrays if n in store.manifest.arrays]
    sums = _digests(reader, store.manifest)
    files: dict[int, list[tuple[str, int | None]]] = {}  # chunk -> its files (and digests)
    for c in sorted(set(reads.chunk.tolist())):
        a, b = store.manifest.chunk_range(c)
        found = []
        for name in names:
            for unit, path in unit_files(reader, name, a, b):
                recorded = sums.get(name)
                ok = recorded is not None and 0 <= unit < len(recorded)
                found.append((path, int(recorded[unit]) if recorded is not None and ok else None))
        files[c] = found
    times: dict[str, list[int]] = {}
    mine: list[tuple[int, str]] = []
    ours = (reads.rank == rank) & (reads.worker == worker)
    for t, c, me in zip(reads.time.tolist(), reads.chunk.tolist(), ours.tolist(), strict=True):
        for path, _ in files[c]:
            times.setdefault(path, []).append(t)
            if me:
                mine.append((t, path))
    digests = {p: d for found in files.values() for p, d in found if d is not None}
    warm = plan_cache(
        {p: sorted_steps(t) for p, t in times.items()},
        mine,
        digests,
        lag_steps=lag_steps(plan, rank, worker, spec.prefetch),
    )
    log.debug("cache plan: %d files, %d reads of this worker", len(times), len(mine))
    return bool(warm)


def lag_steps(plan: EpochPlan, rank: int, worker: int, prefetch: int) -> int:
    """Steps the loop may read ahead of the batch it yields: the groups in flight (``prefetch``
    segments, whole groups) and two more, in steps of this worker's groups."""
    wp = plan.workers[rank][worker]
    k = max(1, int(plan.shuffle_chunks))
    groups = max(1, -(-len(wp.spans) // k))
    per_group = max(1, wp.num_batches * max(1, plan.num_workers) // groups)
    return (max(1, -(-int(prefetch) // k)) + 2) * per_group


def _digests(reader: Any, manifest: Any) -> dict[str, np.ndarray]:
    """The store's checksums by array (none for a store without them)."""
    verifier = getattr(reader, "verifier", None)
    if verifier is None or not getattr(manifest, "checksums", ""):
        return {}
    return dict(verifier.sums())
