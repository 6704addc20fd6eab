"""``StreamingDataLoader`` with 2 workers over several epochs: a fresh loader (fresh worker
processes) each epoch, or one loader with ``persistent_workers=True`` (issue 25: each fresh
worker pays its start, imports and fresh pages again). Prints each epoch's seconds and the CPU
seconds of all epochs: the main process and the workers (a fresh loader's workers are reaped
after their epoch; persistent ones are read from ``/proc`` before the loader shuts down); then
the workers' user and system CPU seconds of each epoch (read from ``/proc``).

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
    return sum(_user_system(pid))


def _user_system(pid: int) -> tuple[float, float]:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _workers_cpu(loader: StreamingDataLoader) -> tuple[float, float]:
    """The user and system CPU s of ``loader``'s live workers so far."""
    got = [_user_system(w.pid) for w in loader._iterator._workers]  # type: ignore[union-attr]
    return sum(u for u, _ in got), sum(s for _, s in got)


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
    per_epoch = []  # the workers' (user, system) CPU s of each epoch
    for e in range(args.epochs):
        ds.set_epoch(e)
        t = time.perf_counter()
        loader = keep if keep is not None else StreamingDataLoader(ds, **kw)
        before = _workers_cpu(loader) if keep is not None and e else (0.0, 0.0)
        n = sum(1 for _ in loader)
        walls.append(time.perf_counter() - t)
        now = _workers_cpu(loader)
        per_epoch.append((now[0] - before[0], now[1] - before[1]))
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
    print(
        "workers' CPU s by epoch (user + system): "
        + ", ".join(f"{u + s:.2f} ({u:.2f} + {s:.2f})" for u, s in per_epoch)
    )


if __name__ == "__main__":
    main()
