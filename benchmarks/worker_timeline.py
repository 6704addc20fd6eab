"""Where a ``StreamingDataLoader`` epoch's time and CPU go, worker by worker (issue 25).

For each epoch (a fresh dataset and loader with ``--workers`` workers, torch imported first):
the main process's CPU seconds, the workers' user and system CPU seconds, when each worker
entered ``iter()``, got its first batch from the reader and sent its first bundle, and when the
training loop got its first batch (seconds from the dataset's construction).

Usage::

    PYTHONPATH=src python benchmarks/worker_timeline.py /tmp/bdl/default --epochs 3
"""

from __future__ import annotations

import argparse
import gc
import os
import time

import torch  # noqa: F401  (imported first, as a training program does)
from torch.utils.data import get_worker_info

import shardload.torch.dataset as D
from shardload.torch import StreamingDataLoader, StreamingDataset

T0 = [0.0]
_iter = D.StreamingDataset.__iter__
_yield = D.StreamingDataset._yield


def stamp(what: str) -> None:
    print(f"    {what} at {time.perf_counter() - T0[0]:.3f} s", flush=True)


def timed_iter(self):  # type: ignore[no-untyped-def]
    info = get_worker_info()
    if info is None:
        return _iter(self)
    stamp(f"worker {info.id} iter()")
    it = _iter(self)

    def gen():  # type: ignore[no-untyped-def]
        for k, x in enumerate(it):
            if k == 0:
                stamp(f"worker {info.id} first bundle sent")
            yield x

    return gen()


def timed_yield(self, batches, *a, **k):  # type: ignore[no-untyped-def]
    def gen():  # type: ignore[no-untyped-def]
        try:
            for k, b in enumerate(batches):
                if k == 0:
                    stamp(f"worker {get_worker_info().id} first batch read")
                yield b
        finally:
            batches.close()

    return _yield(self, gen(), *a, **k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    args = ap.parse_args()
    D.StreamingDataset.__iter__ = timed_iter  # type: ignore[method-assign]
    D.StreamingDataset._yield = timed_yield  # type: ignore[method-assign]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    for epoch in range(args.epochs):
        t0 = os.times()
        T0[0] = time.perf_counter()
        print(f"  epoch {epoch}:")
        ds = StreamingDataset(args.store, batch_size=args.batch_size, seed=0)
        ds.set_epoch(epoch)
        dl = StreamingDataLoader(ds, num_workers=args.workers, prefetch_factor=2)
        n = 0
        for _ in dl:
            n += 1
            if n == 1:
                stamp("main: first batch")
        secs = time.perf_counter() - T0[0]
        del dl
        gc.collect()  # the workers are shut down and waited for: their CPU counts
        t1 = os.times()
        print(
            f"    {n} batches in {secs:.2f} s; CPU s: main {t1.user + t1.system - t0.user - t0.system:.2f}, "
            f"workers user {t1.children_user - t0.children_user:.2f} "
            f"system {t1.children_system - t0.children_system:.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
