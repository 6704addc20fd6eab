"""Chunk files by URL read ahead across shuffle groups (issue 28): epochs of a store of many
small groups (1,024 rows, compressed Zarr chunk files of 16 rows, ``shuffle_chunks=4``: 16
groups) through ``shardload serve`` and ``shardload.testing.latency`` at ``--rtt-ms``, on a
store opened once (so the epochs read data, not metadata).

Printed per run: the first epoch (opening, checksums, connections), the second, and the second
read one group at a time (``prefetch=0``), with the most requests in flight at the proxy.

Usage::

    python benchmarks/bench_url_read_ahead.py --workdir /tmp/bura --rtt-ms 100
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
KW = {"batch_size": 64, "seed": 2, "split": None, "shuffle_chunks": 4}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--rtt-ms", type=float, default=100.0)
    a = ap.parse_args(argv)
    sys.path.insert(0, str(HERE.parent / "tests"))
    warnings.simplefilter("ignore")
    import shardload
    from _stores import make_store
    from shardload.move.serve import serving
    from shardload.testing.latency import latency_proxy

    work = Path(a.workdir)
    if not (work / "store" / "shardload.json").exists():
        make_store(work, fmt="zarr", compression="lz4", n=1024, chunk_rows=16)
    with serving(work) as base:
        t = urlparse(base)
        with latency_proxy(t.hostname, t.port, rtt_s=a.rtt_ms / 1000) as (proxy, port):
            store = shardload.open_store(f"http://127.0.0.1:{port}/store")
            for what, prefetch in (("first", None), ("second", None), ("prefetch=0", 0)):
                proxy.reset_counts()
                t0 = time.perf_counter()
                n = sum(1 for _ in shardload.iter_batches(store, **KW, prefetch=prefetch))
                s = time.perf_counter() - t0
                print(f"{what}: {s:.3f} s, {n} batches, at most {proxy.max_waiting} in flight")


if __name__ == "__main__":
    main()
