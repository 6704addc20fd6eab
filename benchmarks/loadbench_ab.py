"""Interleaved A/B of shardload shuffle settings on one store: epoch rates on a shared machine.

Runs one epoch per (round, variant), the variants interleaved in every round (A B C A B C ...)
so that a busy neighbour slows all of them alike, and reports per variant the median and every
run of: samples/s (wall), and CPU seconds per epoch (this process and its reaped DataLoader
workers: on a shared machine CPU time is steadier than wall time). Each epoch runs in this
process (``iter``) or through ``StreamingDataLoader`` with 2 workers (``sdl``).

Usage::

    python benchmarks/loadbench_ab.py STORE --rounds 5 --variants legacy,default,p16,uniform --via iter,sdl
"""

from __future__ import annotations

import argparse
import json
import resource
import time
from typing import Any

import numpy as np

VARIANTS: dict[str, dict[str, Any]] = {
    "legacy": {"shuffle_chunks": 4},  # the default before small pieces
    "default": {},
    "p8": {"piece_rows": 8, "shuffle_chunks": 512},  # the default of session 7-9
    "p16": {"piece_rows": 16, "shuffle_chunks": 256},
    "p32": {"piece_rows": 32, "shuffle_chunks": 128},
    "uniform": {"shuffle": "uniform"},
    # the same, with one preadv per run instead of io_uring batches (as where io_uring is refused)
    "default-preadv": {"_io_uring": False},
    "legacy-preadv": {"shuffle_chunks": 4, "_io_uring": False},
    "uniform-preadv": {"shuffle": "uniform", "_io_uring": False},
}


def _cpu() -> float:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def one_epoch(store: str, via: str, opts: dict[str, Any], *, batch_size: int, epoch: int):
    import shardload
    from shardload.load import uring

    opts = dict(opts)
    uring.reset_for_tests(opts.pop("_io_uring", None))
    t, c = time.perf_counter(), _cpu()
    n = 0
    if via == "iter":
        for b in shardload.iter_batches(store, batch_size=batch_size, epoch=epoch, **opts):
            n += len(b["index"])
    else:
        from shardload.torch import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(store, batch_size=batch_size, **opts)
        ds.set_epoch(epoch)
        for b in StreamingDataLoader(ds, batch_size=None, num_workers=2, prefetch_factor=2):
            n += len(b["index"])
    return n / (time.perf_counter() - t), _cpu() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("store")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--variants", default="legacy,default")
    ap.add_argument("--via", default="iter,sdl")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    keys = [(via, v) for via in args.via.split(",") for v in args.variants.split(",")]
    runs: dict[str, list[tuple[float, float]]] = {f"{via}:{v}": [] for via, v in keys}
    for r in range(args.rounds):
        for via, v in keys:
            rate, cpu = one_epoch(args.store, via, VARIANTS[v], batch_size=args.batch_size, epoch=r)
            runs[f"{via}:{v}"].append((rate, cpu))
            print(f"round {r} {via}:{v}: {rate:,.0f} samples/s, {cpu:.2f} CPU-s", flush=True)
    summary = {}
    for k, rs in runs.items():
        rates, cpus = [x[0] for x in rs], [x[1] for x in rs]
        summary[k] = {
            "median_samples_per_s": float(np.median(rates)),
            "median_cpu_s": float(np.median(cpus)),
            "runs_samples_per_s": [round(x) for x in rates],
            "runs_cpu_s": [round(x, 3) for x in cpus],
        }
        print(
            f"{k}: median {np.median(rates):,.0f} samples/s (runs {[round(x) for x in rates]}), "
            f"median {np.median(cpus):.2f} CPU-s per epoch"
        )
    for via in args.via.split(","):
        base = summary.get(f"{via}:legacy")
        for v in args.variants.split(","):
            got = summary.get(f"{via}:{v}")
            if base and got and v != "legacy":
                print(
                    f"{via}:{v} / {via}:legacy: speed "
                    f"{got['median_samples_per_s'] / base['median_samples_per_s']:.2f}x, "
                    f"CPU per epoch {got['median_cpu_s'] / base['median_cpu_s']:.2f}x"
                )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
