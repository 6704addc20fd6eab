"""Sparse reads of checked files by URL (issue 28): what tying each range request to the
version checked (``If-Match``, ``move/pinned.py``) costs in requests, bytes and time.

The store is one of ``bench_default_layout``'s (``--store``: ``default``, Zarr v3 shards of
small inner chunks; ``npy``), built under ``--workdir`` unless an equal one is there, served by
``shardload serve`` on 127.0.0.1 behind ``testing/latency.py``'s proxy (``--rtt-ms``). One
store is opened, an epoch read (every file fetched whole and checked), then ``--reads`` reads
of 2 rows at random places (``Store.read``: range requests of checked files). Printed for
those reads: wall seconds, the requests the proxy saw and the bytes the client fetched.

Usage::

    PYTHONPATH=src:benchmarks python benchmarks/bench_url_pinned.py --workdir /tmp/bul \\
        --rows 16384 --store default --rtt-ms 0,10 --reads 200
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from urllib.parse import urlparse

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))


def sparse_reads(url: str, proxy: object, reads: int, batch_size: int, seed: int) -> str:
    """The line for ``reads`` 2-row reads of one opened store after its first epoch."""
    from bench_url_latency import bytes_fetched

    import shardload

    with bytes_fetched() as fetched:
        store = shardload.open_store(url)
        for _ in shardload.iter_batches(store, batch_size=batch_size, seed=seed, epoch=0):
            pass  # every file checked
        name = sorted(store.arrays)[0]
        starts = np.random.default_rng(seed).integers(0, len(store) - 2, reads).tolist()
        proxy.reset_counts()  # type: ignore[attr-defined]
        fetched[0] = 0
        t = time.perf_counter()
        for r in starts:
            store.read(name, r, r + 2)
        wall = time.perf_counter() - t
        return (
            f"{reads} reads of 2 rows of {name!r}: {wall:.2f} s wall, "
            f"{proxy.requests} requests, "  # type: ignore[attr-defined]
            f"{fetched[0] / 2**20:.2f} MiB fetched"
        )


def main(argv: list[str] | None = None) -> None:
    from bench_default_layout import STORES, build, store_arguments

    ap = store_arguments(__doc__)
    ap.add_argument("--store", default="default", choices=sorted(STORES))
    ap.add_argument("--rtt-ms", default="0,10", help="round-trip times to add (ms)")
    ap.add_argument("--reads", type=int, default=200)
    a = ap.parse_args(argv)

    from shardload.move.serve import serving
    from shardload.testing.latency import latency_proxy

    store = build(Path(a.workdir), a.store, rows=a.rows, features=a.features)
    with serving(store.parent, max_client_connections=512) as base:
        target = urlparse(base)
        for rtt_ms in [float(x) for x in a.rtt_ms.split(",")]:
            with latency_proxy(target.hostname, target.port, rtt_s=rtt_ms / 1000) as (proxy, port):
                url = f"http://127.0.0.1:{port}/{store.name}"
                line = sparse_reads(url, proxy, a.reads, a.batch_size, a.seed)
                print(f"RTT {rtt_ms:4.0f} ms: {line}", flush=True)


if __name__ == "__main__":
    main()
