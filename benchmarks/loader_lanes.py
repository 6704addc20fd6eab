"""Where an in-process epoch's CPU goes, thread lane by thread lane (issue 25).

Measures, in one process: the store's all-core read + decode limit
(``bench_default_layout.read_decode_limit``: every stored chunk read and Blosc-decoded on a
thread per core, best of 3), then ``--epochs`` epochs of the default load
(``iter_batches(store, batch_size=B, epoch=e)``), each with its wall time, its ratio to the
limit, the process's CPU seconds and those of the main thread and of each lane of the loader's
``ReadPool`` (``read``: reading and decoding chunks into group buffers; ``take``: gathering
batches out of them). The first epoch also pays shardload's imports and opening the store.

Usage::

    PYTHONPATH=src:benchmarks python benchmarks/loader_lanes.py /tmp/bdl/default --epochs 4

``STORE`` is a store ``bench_default_layout.py`` wrote (its ``default``: 65,536 rows of 6.2 KB).
Prints one JSON line per run (``--json``) or a short table.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from bench_default_layout import read_decode_limit


def lane_cpu() -> Counter[str]:
    """Patch the loader's pool so that each lane's threads add their CPU seconds here."""
    from shardload.load import pool

    spent: Counter[str] = Counter()
    lock = threading.Lock()
    work = pool.ReadPool._work

    def timed(self: Any, lane: str) -> None:
        t = time.thread_time()
        try:
            work(self, lane)
        finally:
            with lock:
                spent[lane] += time.thread_time() - t

    pool.ReadPool._work = timed  # type: ignore[method-assign]
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    limit = read_decode_limit(Path(args.store))
    spent = lane_cpu()
    import shardload

    rec: dict[str, Any] = {
        "limit_GBps": limit["limit_Bps"] / 1e9,
        "limit_cpu_s": limit["limit_cpu_s"],
    }
    rec["epochs"] = []
    for e in range(args.epochs):
        spent.clear()
        t, c, m = time.perf_counter(), time.process_time(), time.thread_time()
        nbytes = 0
        for b in shardload.iter_batches(args.store, batch_size=args.batch_size, epoch=e):
            nbytes += sum(v.nbytes for k, v in b.items() if k != "index")
            np.asarray(b["index"]).copy()
        wall = time.perf_counter() - t
        cpu, main_cpu = time.process_time() - c, time.thread_time() - m
        time.sleep(0.1)  # the detached read threads end and add their share
        rec["epochs"].append(
            {
                "wall_s": wall,
                "ratio": nbytes / wall / limit["limit_Bps"],
                "cpu_s": cpu,
                "main_cpu_s": main_cpu,
                **{f"{k}_cpu_s": v for k, v in sorted(spent.items())},
            }
        )
    if args.json:
        print(json.dumps(rec))
        return
    print(f"limit {rec['limit_GBps']:.2f} GB/s ({rec['limit_cpu_s']:.2f} CPU s)")
    for e, r in enumerate(rec["epochs"]):
        lanes = ", ".join(f"{k[:-6]} {v:.2f}" for k, v in r.items() if k.endswith("_cpu_s"))
        print(
            f"epoch {e}: {r['wall_s']:.2f} s = {r['ratio']:.2f} of the limit; "
            f"CPU s {r['cpu_s']:.2f}: {lanes}"
        )


if __name__ == "__main__":
    main()
