"""Issue 25's "speed that follows the hardware": the in-process default load of a raw
(uncompressed) store against the day's page-cache read limit, measured in the same process.

- ``limit``: every data file of the store read with 64 MiB ``readinto`` calls into a reused
  buffer per thread, by 1 and by all cores' threads (files shared out; in the page cache
  after a warm-up pass; as ``bench_n320.py``'s limit), best of ``--repeats``: GB/s;
- ``epoch``: one default epoch (``iter_batches(batch_size=B)``, every array), each of
  ``--epochs`` after a warm-up epoch: decoded GB/s of the epoch (best and median), its CPU
  seconds, and the ratio to the limit (the best epoch's and the median's).

Usage::

    PYTHONPATH=src:benchmarks python benchmarks/raw_goal.py /tmp/bdl/npy
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import shardload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    files = [
        p
        for p in glob.glob(os.path.join(args.store, "**", "*"), recursive=True)
        if os.path.isfile(p) and os.path.getsize(p) > 1 << 20
    ]
    total = sum(os.path.getsize(p) for p in files)
    best, best_cpu = 0.0, 0.0
    for threads in [1, os.cpu_count() or 1] * args.repeats:
        bufs = [bytearray(64 << 20) for _ in range(threads)]

        def read(i: int, bufs: list[bytearray] = bufs, threads: int = threads) -> int:
            n, view = 0, memoryview(bufs[i])
            for f in files[i::threads]:
                with open(f, "rb", buffering=0) as fh:
                    while got := fh.readinto(view):
                        n += got
            return n

        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(read, range(threads)))  # warm-up: into the page cache, buffers touched
            t, c = time.perf_counter(), time.process_time()
            got = sum(pool.map(read, range(threads)))
            rate = got / (time.perf_counter() - t) / 1e9
            if rate > best:
                best, best_cpu = rate, time.process_time() - c
    store = shardload.open_store(args.store)
    rates, cpus = [], []
    for e in range(args.epochs + 1):
        t, c, nbytes = time.perf_counter(), time.process_time(), 0
        for b in shardload.iter_batches(store, batch_size=args.batch_size, epoch=e):
            nbytes += sum(v.nbytes for k, v in b.items() if k != "index")
        if e:
            rates.append(nbytes / (time.perf_counter() - t) / 1e9)
            cpus.append(time.process_time() - c)
    med = statistics.median(rates)
    print(
        f"{len(files)} files, {total / 1e6:.0f} MB; page-cache read limit {best:.2f} GB/s "
        f"({best_cpu:.3f} CPU s); "
        f"epoch {max(rates):.2f} GB/s best, {med:.2f} median ({statistics.median(cpus):.3f} CPU s)"
        f" = {max(rates) / best:.2f} / {med / best:.2f} of the limit; load average "
        f"{os.getloadavg()[0]:.1f}"
    )


if __name__ == "__main__":
    main()
