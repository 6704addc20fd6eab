"""What a node cache keeps: the file whose next use is farthest goes first (Belady), from the plan.

The loader knows every chunk it reads this epoch, in order, and the next epoch's order too (it
is seeded by ``(seed, epoch)``), so a cache smaller than the store need not guess from the past
(least recently used): it evicts the entry that the plan reads again last, or never. For
entries of one size that is optimal (Belady, 1966: no other choice of evictions gives more
hits); ``tests/test_plan_cache.py`` checks it against a brute-force search on every small case.

Pure numpy, no I/O: :func:`plan_node_reads` turns epoch plans into the times at which the ranks
of one node read each chunk; :func:`next_use_after` answers the eviction question for one key;
:func:`simulate_cache` replays a sequence under ``"belady"`` or ``"lru"`` (tests, benchmarks).

>>> simulate_cache(list("abcabdab"), 2, policy="lru").hits
0
>>> simulate_cache(list("abcabdab"), 2, policy="belady").hits
2
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from shardload.errors import PlanError

if TYPE_CHECKING:  # the plan's types live with the planner
    from shardload.plan.epoch import EpochPlan

__all__ = [
    "NEVER",
    "CacheRun",
    "NodeReads",
    "next_use_after",
    "next_uses",
    "plan_node_reads",
    "simulate_cache",
    "sorted_steps",
    "use_times",
]

#: The "next use" of a key the plan never reads again.
NEVER = np.iinfo(np.int64).max
POLICIES = ("belady", "lru")


def next_uses(keys: Sequence[Hashable]) -> np.ndarray:
    """For each access ``i``, the index of the next access to the same key (``NEVER``: none).

    >>> next_uses(list("abab c")).tolist()[:3]
    [2, 3, 9223372036854775807]
    """
    out = np.full(len(keys), NEVER, dtype=np.int64)
    last: dict[Hashable, int] = {}
    for i in range(len(keys) - 1, -1, -1):
        out[i] = last.get(keys[i], NEVER)
        last[keys[i]] = i
    return out


def use_times(keys: Sequence[Hashable], times: Sequence[int] | None = None) -> dict:
    """Each key's access times, sorted (``times[i]`` of access ``i``; default its index)."""
    t = np.arange(len(keys)) if times is None else np.asarray(times, dtype=np.int64)
    if len(t) != len(keys):
        raise PlanError(f"use_times: {len(keys)} keys but {len(t)} times")
    found: dict[Hashable, list[int]] = {}
    for k, ti in zip(keys, t.tolist(), strict=True):
        found.setdefault(k, []).append(ti)
    return {k: np.sort(np.asarray(v, dtype=np.int64)) for k, v in found.items()}


def sorted_steps(values: Iterable[int]) -> np.ndarray:
    """The distinct ``values``, sorted, as int64: ``np.unique``'s answer without its first
    call's import of ``numpy.ma`` (numpy 2: 7 ms, paid by each new process planning a cache).

    >>> sorted_steps([5, 3, 5]).tolist()
    [3, 5]
    """
    return np.asarray(sorted(set(values)), dtype=np.int64)


def next_use_after(times: np.ndarray | None, now: int, *, strict: bool = False) -> int:
    """The first of the sorted ``times`` at or after ``now`` (after it with ``strict``), or
    ``NEVER``; ``times`` None (a key the plan does not read) is ``NEVER`` too."""
    if times is None or not len(times):
        return int(NEVER)
    i = int(np.searchsorted(times, now, side="right" if strict else "left"))
    return int(times[i]) if i < len(times) else int(NEVER)


@dataclass(frozen=True)
class CacheRun:
    """What replaying a sequence through a cache did: hits, misses, evictions."""

    hits: int
    misses: int
    evictions: int


def simulate_cache(
    keys: Sequence[Hashable],
    capacity: int,
    *,
    policy: str = "belady",
    sizes: Mapping[Hashable, int] | None = None,
    bypass: bool = False,
) -> CacheRun:
    """Replay ``keys`` through a cache of ``capacity`` (entries, or bytes with ``sizes``).

    ``"belady"`` evicts the entry whose next use is farthest; ``"lru"`` the least recently used.
    ``bypass``: a missed key read again later than every held entry is not kept (Belady only).
    With ``sizes``, entries are evicted until the new one fits; one larger than the capacity is
    never kept.
    """
    if policy not in POLICIES:
        raise PlanError(f"cache policy {policy!r} is unknown; choose one of {list(POLICIES)}")
    if capacity < 0:
        raise PlanError(f"cache capacity must be >= 0, got {capacity}")
    size = (lambda k: 1) if sizes is None else (lambda k: int(sizes[k]))
    nxt = next_uses(keys)
    hits = evictions = 0
    held: dict[Hashable, int] = {}  # key -> its next use (Belady) / any (LRU)
    order: OrderedDict[Hashable, None] = OrderedDict()  # LRU recency
    heap: list[tuple[int, int, Hashable]] = []  # (-next use, tie, key), stale entries skipped
    used = 0
    for i, k in enumerate(keys):
        if k in held:
            hits += 1
            held[k] = int(nxt[i])
            order.move_to_end(k)
            heapq.heappush(heap, (-int(nxt[i]), i, k))
            continue
        s = size(k)
        if s > capacity:
            continue
        while used + s > capacity:
            if policy == "lru":
                victim = next(iter(order))
            else:
                while -heap[0][0] != held.get(heap[0][2], -1) or heap[0][2] not in held:
                    heapq.heappop(heap)
                victim = heap[0][2]
                if bypass and int(nxt[i]) >= held[victim]:
                    break
            used -= size(victim)
            del held[victim], order[victim]
            evictions += 1
        if used + s > capacity:  # bypassed
            continue
        held[k] = int(nxt[i])
        order[k] = None
        heapq.heappush(heap, (-int(nxt[i]), i, k))
        used += s
    return CacheRun(hits=hits, misses=len(keys) - hits, evictions=evictions)


@dataclass(frozen=True)
class NodeReads:
    """The reads of the ranks of one node, segment by segment, over one or more epochs.

    ``time[i]`` is the step (a rank's batch counter, epochs one after the other) at which
    segment ``i`` is read: rows ``start[i]:stop[i]`` of the store (inside chunk ``chunk[i]``);
    ``rank``/``worker`` say who reads it. Ranks of a job step in lockstep (one batch each per
    optimizer step), and the DataLoader takes the workers' batches in turn (``k % W``), so the
    step is a clock shared by every process of the node.
    """

    time: np.ndarray
    chunk: np.ndarray
    start: np.ndarray
    stop: np.ndarray
    rank: np.ndarray
    worker: np.ndarray


def plan_node_reads(plans: Sequence[EpochPlan], ranks: Sequence[int]) -> NodeReads:
    """The reads of ``ranks`` (those of one node) in ``plans`` (consecutive epochs), in time order.

    A segment's time is the rank step of the batch its first row goes to (before a worker's
    shuffle group deals its rows: the group is read as a whole, when it starts).

    >>> from shardload.plan.epoch import plan_epoch
    >>> p = plan_epoch([2, 2, 2], batch_size=2, num_workers=2, shuffle=False, shuffle_chunks=1)
    >>> r = plan_node_reads([p, p], [0])
    >>> r.time.tolist(), r.chunk.tolist()
    ([0, 1, 2, 3, 4, 5], [0, 2, 1, 0, 2, 1])
    >>> p = plan_epoch([2, 2, 2], batch_size=2, num_workers=1, shuffle=False, shuffle_chunks=2)
    >>> plan_node_reads([p], [0]).time.tolist()  # chunks 0 and 1: one group, read at step 0
    [0, 0, 2]
    """
    parts: list[tuple[np.ndarray, ...]] = []
    offset = 0
    for plan in plans:
        W = max(1, plan.num_workers)
        for r in ranks:
            if not 0 <= r < plan.world_size:
                raise PlanError(f"rank {r} is not within 0..{plan.world_size - 1}")
            for w, wp in enumerate(plan.workers[r]):
                sp = wp.spans
                if not len(sp):
                    continue
                keep = sp.cum[1:] > wp.skip_rows  # segments a resume has not consumed yet
                k = max(1, int(plan.shuffle_chunks))
                first = sp.cum[np.arange(len(sp)) // k * k]  # where each one's group starts
                pos = np.maximum(first - wp.skip_rows, 0)[keep]
                lo, hi = (sp.base + sp.lo).copy(), sp.base + sp.hi
                for i in np.flatnonzero(sp.ex >= 0).tolist():  # explicit rows (a resume's)
                    rows = sp.offsets(i)
                    lo[i], hi[i] = sp.base[i] + rows.min(), sp.base[i] + rows.max() + 1
                n = int(keep.sum())
                step = offset + pos // plan.batch_size * W + w
                parts.append(
                    (step, sp.chunk[keep], lo[keep], hi[keep], np.full(n, r), np.full(n, w))
                )
        offset += plan.batches_per_rank
    if not parts:
        e = np.zeros(0, dtype=np.int64)
        return NodeReads(e, e, e, e, e, e)
    cols = [np.concatenate([p[j] for p in parts]).astype(np.int64) for j in range(6)]
    order = np.argsort(cols[0], kind="stable")
    return NodeReads(*(c[order] for c in cols))
