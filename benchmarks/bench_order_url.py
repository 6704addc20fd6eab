"""What the same order costs by URL: one epoch of an uncompressed Zarr store, locally and over
loopback HTTP, with the default pieces and the alternatives that keep the same order.

One store (default 200 MB: x (n, 64) float32 and y (n, 4) float32, 8 MB chunks, made by
``shardload.prepare`` from generated data, as ``bench_move.py`` makes it), ``shardload serve``
in a subprocess on 127.0.0.1, one epoch of ``iter_batches(batch_size=256, seed=0)`` in this
process per case, two rounds:

  local, default            the store's folder (warm page cache)
  URL, default              ``open_store(url)``: the default pieces, a range request per piece
                            and array; each chunk fetched whole once to check its checksum
  URL, verify=never         the same pieces, nothing fetched whole
  URL, cache_dir (epoch 1)  ``open_store(url, cache_dir=...)``: each chunk file fetched once
  URL, piece_rows=0         whole chunks (a plan of its own, the same on every copy)

Usage::

    python benchmarks/bench_order_url.py [--size-mb 200] [--rounds 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_move

import shardload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-order-url-"))
    try:
        path = bench_move.make_store(work, args.size_mb, "zarr", "none", 8.0)
        server = bench_move.Server(work / "served")
        try:
            url = server.url + "bench"
            cases = [
                ("local, default", str(path), {}, {}),
                ("URL, default", url, {}, {}),
                ("URL, verify=never", url, {"verify": "never"}, {}),
                ("URL, cache_dir (epoch 1)", url, {"cache_dir": str(work / "cache")}, {}),
                ("URL, piece_rows=0", url, {}, {"piece_rows": 0}),
            ]
            for rnd in range(args.rounds):
                for name, where, open_kw, load_kw in cases:
                    shutil.rmtree(work / "cache", ignore_errors=True)
                    store = shardload.open_store(where, **open_kw)
                    t = time.perf_counter()
                    n, first = 0, None
                    for b in shardload.iter_batches(store, batch_size=256, seed=0, **load_kw):
                        n += len(b["index"])
                        first = first if first is not None else time.perf_counter() - t
                    dt = time.perf_counter() - t
                    print(
                        f"round {rnd} {name:<26} {dt:6.2f} s  first batch {first or 0:5.2f} s  "
                        f"{n / dt:9.0f} samples/s",
                        flush=True,
                    )
        finally:
            server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
