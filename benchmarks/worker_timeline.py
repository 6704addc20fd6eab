"""Where a ``StreamingDataLoader`` epoch's time and CPU go, worker by worker (issue 25).

For each epoch (a fresh dataset and loader with ``--workers`` workers, torch imported first;
``--persistent``: one loader whose workers serve every epoch): when each worker entered
``iter()``, had its plan, got its first batch from the reader and sent its first bundle, and
when the training loop got its first batch (seconds from the epoch's start). CPU seconds by
phase: the main process's import of ``shardload.torch`` (first epoch), building the dataset,
``iter()`` (starting the workers) and the loop; each worker's planning, its first batch and
the rest, with the system part and minor page faults; then the workers' and main process's
totals.

Usage::

    PYTHONPATH=src python benchmarks/worker_timeline.py /tmp/bdl/default --epochs 3
    PYTHONPATH=src python benchmarks/worker_timeline.py /tmp/bdl/default --epochs 4 --persistent
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import time

import torch  # noqa: F401  (imported first, as a training program does)
from torch.utils.data import get_worker_info

#: the epoch's start, shared with forked workers (persistent ones see each new epoch's)
T0 = multiprocessing.get_context("fork").Value("d", 0.0, lock=False)
_TICK = os.sysconf("SC_CLK_TCK")


def stamp(what: str) -> None:
    print(f"    {what} at {time.perf_counter() - T0.value:.3f} s", flush=True)


def proc_cpu() -> tuple[float, float, int]:
    """This process's (CPU s, system CPU s, minor page faults) so far."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK, int(fields[12]) / _TICK, int(fields[7])


def phase(a: tuple[float, float, int], b: tuple[float, float, int]) -> str:
    return f"{b[0] - a[0]:.2f} CPU s (system {b[1] - a[1]:.2f}, {b[2] - a[2]} faults)"


def instrument(D, B) -> None:  # type: ignore[no-untyped-def]
    """Wrap the dataset's iteration (D: shardload.torch.dataset) to stamp each worker."""
    _iter, _yield, _read = D.StreamingDataset.__iter__, D.StreamingDataset._yield, D.read_batches
    marks: dict[str, tuple[float, float, int]] = {}

    def timed_read(*a, **k):  # type: ignore[no-untyped-def]
        got = _read(*a, **k)  # plans the epoch (or takes the main process's plan)
        if get_worker_info() is not None:
            marks["planned"] = proc_cpu()
            stamp(
                f"worker {get_worker_info().id} planned ({phase(marks['iter'], marks['planned'])})"
            )
        return got

    def timed_iter(self):  # type: ignore[no-untyped-def]
        info = get_worker_info()
        if info is None:
            return _iter(self)
        marks["iter"] = proc_cpu()
        stamp(f"worker {info.id} iter()")
        it = _iter(self)

        def gen():  # type: ignore[no-untyped-def]
            for k, x in enumerate(it):
                if k == 0:
                    stamp(f"worker {info.id} first bundle sent")
                yield x
            end = proc_cpu()
            print(
                f"    worker {info.id}: first batch {phase(marks['planned'], marks['first'])}; "
                f"the rest {phase(marks['first'], end)}",
                flush=True,
            )

        return gen()

    def timed_yield(self, batches, *a, **k):  # type: ignore[no-untyped-def]
        def gen():  # type: ignore[no-untyped-def]
            try:
                for k, b in enumerate(batches):
                    if k == 0:
                        marks["first"] = proc_cpu()
                        stamp(f"worker {get_worker_info().id} first batch read")
                    yield b
            finally:
                batches.close()

        return _yield(self, gen(), *a, **k)

    D.StreamingDataset.__iter__ = timed_iter
    D.StreamingDataset._yield = timed_yield
    D.read_batches = timed_read


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--persistent", action="store_true", help="one loader for every epoch")
    args = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs")
    c = time.process_time()
    import shardload.load.batches as B
    import shardload.torch.dataset as D
    from shardload.torch import StreamingDataLoader, StreamingDataset

    print(f"  import shardload.torch: {time.process_time() - c:.2f} CPU s")
    instrument(D, B)
    dl = ds = None
    for epoch in range(args.epochs):
        t0 = os.times()
        T0.value = time.perf_counter()
        print(f"  epoch {epoch}:")
        c = time.process_time()
        if dl is None or not args.persistent:
            ds = StreamingDataset(args.store, batch_size=args.batch_size, seed=0)
            dl = StreamingDataLoader(
                ds, num_workers=args.workers, prefetch_factor=2, persistent_workers=args.persistent
            )
        build = time.process_time() - c
        ds.set_epoch(epoch)
        c = time.process_time()
        it = iter(dl)
        start = time.process_time() - c
        n = 0
        c = time.process_time()
        for _ in it:
            n += 1
            if n == 1:
                stamp("main: first batch")
        loop = time.process_time() - c
        secs = time.perf_counter() - T0.value
        if not args.persistent:
            del dl, it
            dl = None
            gc.collect()  # the workers are shut down and waited for: their CPU counts
        t1 = os.times()
        print(
            f"    {n} batches in {secs:.2f} s; main CPU s: dataset {build:.2f}, iter() {start:.2f}, "
            f"loop {loop:.2f}, in all {t1.user + t1.system - t0.user - t0.system:.2f}"
            + (
                ""
                if args.persistent
                else f"; workers user {t1.children_user - t0.children_user:.2f} "
                f"system {t1.children_system - t0.children_system:.2f}"
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
