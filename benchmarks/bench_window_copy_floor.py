"""The floor of serving windows in date order as copies, on raw rows (issue #27).

For batches of ``--batch`` windows of ``--window`` states in date order (``batch + window - 1``
distinct states), times in one thread, median of ``--reps``: the plain read of the distinct
states from an npy store (``read_into`` into one buffer, page cache warm), the same read straight
into the ``(B, K, *row)`` batch plus slice copies of the shared states (what the default window
batches do), and an ``np.take`` of the ``B * K`` states out of the distinct ones. The ratio read /
(read + copies) is the best a copied batch can reach against the read limit.

Usage::

    python benchmarks/bench_window_copy_floor.py STORE   # an npy store of one state per chunk,
                                                        # e.g. bench_dated_windows.py's dated-npy-*
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("store")
    ap.add_argument("--array", default="x")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    import shardload

    st = shardload.open_store(args.store)
    info = st.manifest.arrays[args.array]
    b, k = args.batch, args.window
    n = b + k - 1
    dist = np.empty((n, *info.row_shape), np.dtype(info.dtype))
    out = np.empty((b * k, *info.row_shape), dist.dtype)
    take = np.add.outer(np.arange(b), np.arange(k)).reshape(-1)
    reader = st.reader

    def read(at: int) -> None:
        reader.read_into(args.array, at, at + n, dist)

    def read_and_copy(at: int) -> None:
        # as plan_batch_reads: window 0 in one call, each later state into its first window
        reader.read_into(args.array, at, at + k, out[:k])
        for j in range(k, n):
            w = j - k + 1
            reader.read_into(args.array, at + j, at + j + 1, out[w * k + k - 1 : w * k + k])
        for w in range(1, b):  # window w's first k - 1 states are window w - 1's last
            out[w * k : w * k + k - 1] = out[(w - 1) * k + 1 : w * k]

    def gather(at: int) -> None:
        np.take(dist, take, axis=0, out=out)

    times = {}
    for rep in range(args.reps + 1):
        at = (rep * n) % max(1, len(st) - n)
        for name, fn in (("read", read), ("read_and_copy", read_and_copy), ("take", gather)):
            t = time.perf_counter()
            fn(at)
            if rep:
                times.setdefault(name, []).append(time.perf_counter() - t)
    read_and_copy(0)  # the batch is the windows' states
    want = st.read(args.array, 0, n)[take]
    assert np.array_equal(out, want), "read_and_copy built a wrong batch"
    med = {name: float(np.median(v)) for name, v in times.items()}
    state_mb = dist[0].nbytes / 1e6
    print(
        json.dumps(
            {
                "distinct_states": n,
                "states_served": b * k,
                "read_ms": round(med["read"] * 1e3, 2),
                "read_and_copy_ms": round(med["read_and_copy"] * 1e3, 2),
                "take_ms": round(med["take"] * 1e3, 2),
                "read_MB_per_s": round(n * state_mb / med["read"], 1),
                "take_MB_per_s": round(b * k * state_mb / med["take"], 1),
                "ratio_read_over_read_and_copy": round(med["read"] / med["read_and_copy"], 3),
            }
        )
    )


if __name__ == "__main__":
    main()
