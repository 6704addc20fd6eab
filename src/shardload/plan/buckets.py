"""Length-bucketed batches for variable-length arrays (pure numpy).

Within each shuffle group, rows are sorted by length and dealt to the group's batch slots in a
random slot order: each batch holds rows of similar length (less padding), while which rows a
group holds, how many batches there are and where they start stay exactly the plan's. So
equal batches per rank hold, and resume (same shape or elastic) rebuilds the same order: the
planner (``plan/epoch.py`` ``_iter_groups``) and the resume (``plan/resume.py``
``_unconsumed``) both apply :meth:`Buckets.reorder` to a group's shuffled order.

>>> order = np.arange(8)
>>> lengths = np.array([5, 1, 7, 2, 8, 1, 6, 2])
>>> out = bucket_order(order, lengths, 0, 4, np.random.default_rng(0))
>>> sorted(out.tolist()) == list(range(8)), [sorted(lengths[out[:4]].tolist()), sorted(lengths[out[4:]].tolist())]
(True, [[1, 1, 2, 2], [5, 6, 7, 8]])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def bucket_order(
    order: np.ndarray, keys: np.ndarray, at: int, batch_size: int, rng: np.random.Generator
) -> np.ndarray:
    """``order`` (a permutation of a group's rows) re-dealt so that the rows landing in each
    batch slot are consecutive in length order. ``keys[i]`` is the length of the group's row
    ``i``; the group starts at stream position ``at``; slots are cut where
    :func:`shardload.plan.epoch.group_batches` cuts them. Ties keep ``order``'s (random) order."""
    from shardload.plan.groups import group_batches

    order = np.asarray(order, np.int64)
    n = len(order)
    if n == 0:
        return order
    by_length = order[np.argsort(np.asarray(keys)[order], kind="stable")]
    slots = group_batches(at, n, batch_size)
    out = np.empty_like(order)
    c = 0
    for j in rng.permutation(len(slots)):
        src, take = int(slots[j, 2]), int(slots[j, 3])
        out[src : src + take] = by_length[c : c + take]
        c += take
    return out


@dataclass(frozen=True, eq=False)
class Buckets:
    """Bucket by ``lengths`` (int64, one per global row of the store)."""

    lengths: np.ndarray

    def reorder(
        self, order: np.ndarray, rows: np.ndarray, at: int, batch_size: int, key: tuple[int, ...]
    ) -> np.ndarray:
        """A group's ``order`` (indices into its global ``rows``) bucketed; seeded by ``key``
        (the worker's seed key and the group index)."""
        rng = np.random.default_rng((*key, 0xB0C7))
        return bucket_order(order, self.lengths[rows], at, batch_size, rng)


def bucketed_fingerprint(fingerprint: str) -> str:
    """A plan's fingerprint with bucketing (a state of one never resumes the other)."""
    return f"{fingerprint}+bucket"
