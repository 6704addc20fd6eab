"""Opening a store by URL (issue 28): the time to the first batch, and the round trips waited
for one after another, at several round-trip times.

The stores are ``bench_default_layout``'s (``--stores``: ``default``, compressed Zarr v3 shards
of small inner chunks; ``npy``; ``chunks16``) or ``zarr1m`` / ``npy1m`` (chunks of about
1 MiB), built under ``--workdir`` (small by default: what is measured is the opening, not the
transfer). Each is served with ``shardload.move.serve.serving`` on 127.0.0.1 and reached through
``shardload.testing.latency.latency_proxy``, both threads of this process. For each store and
RTT, ``--repeats`` times (the median printed):

- *open*: ``open_store(url)`` (a new connection: its handshake, then the manifest);
- *first batch*: from the open's start to the first batch of ``iter_batches(store,
  batch_size=B, shuffle=True)``, and the round trips the proxy saw waited for in turn meanwhile
  (``LatencyProxy.round_trips``) and its requests;
- *worker*: the opened store pickled and unpickled (what a DataLoader worker gets), its first
  batch: time and round trips.

Usage::

    python benchmarks/bench_url_open.py --workdir /tmp/buo --rtt-ms 20,100
"""

from __future__ import annotations

import pickle
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def first_batch(store: object, batch_size: int, seed: int) -> None:
    import shardload

    it = shardload.iter_batches(store, batch_size=batch_size, seed=seed, shuffle=True)
    next(iter(it))
    it.close()


def measure(url: str, proxy: object, a: object) -> dict[str, float]:
    """One opening of ``url``: seconds and round trips (module docstring)."""
    import shardload

    proxy.reset_counts()
    t0, m0 = time.perf_counter(), time.monotonic()
    store = shardload.open_store(url)
    opened = time.perf_counter() - t0
    first_batch(store, a.batch_size, a.seed)
    first = time.perf_counter() - t0
    trips, requests = proxy.round_trips(since=m0), proxy.requests
    worker = pickle.loads(pickle.dumps(store))  # what a DataLoader worker gets
    t1, m1 = time.perf_counter(), time.monotonic()
    first_batch(worker, a.batch_size, a.seed)
    in_worker = time.perf_counter() - t1
    return {
        "open": opened,
        "first": first,
        "trips": trips,
        "requests": requests,
        "worker": in_worker,
        "worker_trips": proxy.round_trips(since=m1),
    }


def main(argv: list[str] | None = None) -> None:
    from bench_default_layout import STORES, build, store_arguments
    from bench_url_latency import EXTRA_STORES

    ap = store_arguments(__doc__)
    ap.set_defaults(workdir="bench-results/url-open", rows=4096, features=64)
    ap.add_argument("--stores", default="default,npy")
    ap.add_argument("--rtt-ms", default="20,100", help="round-trip times to add (ms)")
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)

    import shardload
    from shardload.move.serve import serving
    from shardload.testing.latency import latency_proxy

    STORES.update(EXTRA_STORES)
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    names = a.stores.split(",")
    stores = {n: build(work, n, rows=a.rows, features=a.features) for n in names}
    with serving(work, max_client_connections=512) as base:
        for store in stores.values():  # warm: imports, page cache
            first_batch(shardload.open_store(f"{base}{store.name}"), a.batch_size, a.seed)
        target = urlparse(base)
        for rtt_ms in [float(x) for x in a.rtt_ms.split(",")]:
            with latency_proxy(target.hostname, target.port, rtt_s=rtt_ms / 1000) as (proxy, port):
                for name, store in stores.items():
                    url = f"http://127.0.0.1:{port}/{store.name}"
                    runs = [measure(url, proxy, a) for _ in range(a.repeats)]
                    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
                    print(
                        f"{name:>8} RTT {rtt_ms:4.0f} ms: open {med['open'] * 1000:6.0f} ms, "
                        f"first batch {med['first'] * 1000:6.0f} ms "
                        f"({med['first'] * 1000 / rtt_ms:4.1f} RTT; {med['trips']:.0f} round "
                        f"trips in turn, {med['requests']:.0f} requests); worker's first batch "
                        f"{med['worker'] * 1000:6.0f} ms ({med['worker_trips']:.0f} round trips)"
                        f"  [median of {a.repeats}]",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
