"""Time the pure epoch planner: plan, elastic resume and one shuffle group (measured, reported).

PYTHONPATH=src python benchmarks/plan_epoch.py [--chunks 100000] [--world 16] [--workers 8]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from shardload.plan.epoch import plan_epoch
from shardload.plan.groups import iter_worker_groups
from shardload.plan.resume import plan_resume


def best_of(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--chunks", type=int, default=100_000)
    ap.add_argument("--chunk-rows", type=int, default=1000)
    ap.add_argument("--world", type=int, default=16)
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256)
    a = ap.parse_args()
    sizes = np.full(a.chunks, a.chunk_rows)
    sizes[-1] = max(1, a.chunk_rows // 3)
    kw = dict(world_size=a.world, num_workers=a.workers, batch_size=a.batch, epoch=1)
    plan = plan_epoch(sizes, **kw)
    k = plan.batches_per_rank // 3
    rows = int(sizes.sum())
    print(f"{a.chunks} chunks ({rows} rows) x {a.world} ranks x {a.workers} workers")
    print(f"plan_epoch:            {best_of(lambda: plan_epoch(sizes, **kw)) * 1e3:8.1f} ms")
    t = best_of(lambda: plan_resume(plan, k, world_size=a.world - 1, num_workers=a.workers))
    print(f"plan_resume (elastic): {t * 1e3:8.1f} ms")
    t = best_of(lambda: plan_resume(plan, k))
    print(f"plan_resume (same):    {t * 1e3:8.1f} ms")
    t = best_of(lambda: next(iter_worker_groups(plan, 0, 0)))
    print(f"first shuffle group:   {t * 1e3:8.2f} ms")


if __name__ == "__main__":
    main()
