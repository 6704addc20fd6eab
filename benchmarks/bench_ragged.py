"""Padding waste and speed of batches of a variable-length array, with and without buckets.

Prepares a store of ``--rows`` samples whose lengths are long-tailed (lognormal, median
``--median`` values, like token counts; float32 values) beside a fixed ``y``, then runs one
epoch of ``iter_batches`` per setting (batch ``--batch``, one reader, in-process) and prints
the padding waste (share of padded cells that are zeros), samples/s and values/s.

Usage::

    python benchmarks/bench_ragged.py --rows 20000 --format npy
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import xarray as xr

import shardload
from shardload.load.batches import iter_batches
from shardload.load.ragged import PaddingStats


def lognormal_rows(ds: xr.Dataset, median: float = 64.0, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n = ds.sizes["s"]
    lengths = np.maximum(1, rng.lognormal(np.log(median), 0.8, size=n)).astype(np.int64)
    return {
        "tok": [rng.normal(size=k).astype(np.float32) for k in lengths],
        "y": ds.y,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--median", type=float, default=64.0)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--chunk-rows", type=int, default=1000)
    ap.add_argument("--format", default="npy", choices=["npy", "zarr", "hdf5"])
    ap.add_argument("--out", default=None, help="folder for the store (default: a temp dir)")
    args = ap.parse_args(argv)
    sys.modules.setdefault("bench_ragged", sys.modules[__name__])
    tmp = Path(args.out or tempfile.mkdtemp(prefix="bench-ragged-"))
    ds = xr.Dataset({"y": (("s",), np.arange(args.rows, dtype=np.float64))})
    cfg = {
        "view": {
            "name": "function",
            "function": "bench_ragged:lognormal_rows",
            "kwargs": {"median": args.median},
        },
        "sample_dims": ["s"],
        "format": args.format,
        "compression": "none" if args.format == "npy" else "lz4",
        "chunk_rows": args.chunk_rows,
        "out": str(tmp / "store"),
        "overwrite": True,
    }
    t0 = time.perf_counter()
    st = shardload.prepare(cfg, dataset=ds, progress=False)
    info = st.manifest.arrays["tok"].ragged
    print(f"prepared {args.rows} rows ({args.format}) in {time.perf_counter() - t0:.1f} s: {info}")
    print(f"{'bucket':>6} {'shuffle_chunks':>14} {'waste':>6} {'samples/s':>10} {'Mvalues/s':>9}")
    for shuffle_chunks in (4, 16):
        for bucket in (False, True):
            stats = PaddingStats()
            t0 = time.perf_counter()
            n = 0
            for b in iter_batches(
                st,
                batch_size=args.batch,
                bucket=bucket,
                shuffle_chunks=shuffle_chunks,
                padding_stats=stats,
                epoch=1,
            ):
                n += len(b["index"])
            dt = time.perf_counter() - t0
            print(
                f"{bucket!s:>6} {shuffle_chunks:>14} {stats.waste:6.3f} {n / dt:10.0f} "
                f"{stats.values / dt / 1e6:9.2f}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
