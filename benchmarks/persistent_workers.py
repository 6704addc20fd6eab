"""``StreamingDataLoader`` with 2 workers over several epochs: a fresh loader (fresh worker
processes) each epoch, or one loader with ``persistent_workers=True`` (issue 25: each fresh
worker pays its start, imports and fresh pages again). Prints each epoch's seconds and the CPU
seconds of all epochs: the main process and the workers (a fresh loader's workers are reaped
after their epoch; persistent ones are read from ``/proc`` before the loader shuts down).

Usage::

    PYTHONPATH=src python benchmarks/persistent_workers.py /tmp/bdl/default --persistent 0
    PYTHONPATH=src python benchmarks/persistent_workers.py /tmp/bdl/default --persistent 1
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch  # noqa: F401  (imported first, as a training program does)

from shardload.torch import StreamingDataLoader, StreamingDataset


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--persistent", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    t0, walls, workers_cpu = os.times(), [], 0.0
    ds = StreamingDataset(args.store, batch_size=256, seed=0)
    kw = {"num_workers": args.workers, "prefetch_factor": 2}
    keep = StreamingDataLoader(ds, persistent_workers=True, **kw) if args.persistent else None
    n = 0
    for e in range(args.epochs):
        ds.set_epoch(e)
        t = time.perf_counter()
        loader = keep if keep is not None else StreamingDataLoader(ds, **kw)
        n = sum(1 for _ in loader)
        walls.append(time.perf_counter() - t)
        if keep is None:
            del loader
            gc.collect()
    if keep is not None:
        workers_cpu = sum(_cpu(w.pid) for w in keep._iterator._workers)  # type: ignore[union-attr]
        del keep
        gc.collect()
    t1 = os.times()
    workers_cpu += t1.children_user + t1.children_system - t0.children_user - t0.children_system
    main_cpu = t1.user + t1.system - t0.user - t0.system
    print(
        f"persistent={bool(args.persistent)}: {n} batches an epoch; epochs "
        f"{', '.join(f'{w:.2f}' for w in walls)} s; CPU s of {args.epochs} epochs: main "
        f"{main_cpu:.2f}, workers {workers_cpu:.2f}; load average {os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
