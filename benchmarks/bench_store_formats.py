"""Store size and read rate of each output format (``format:`` x ``compression:``), one case.

A float32 array of ``--rows`` x ``--features`` (default 400,000 x 32, 49 MiB) prepared with
4 MiB-ish chunks (8,192 rows) in every registered format and compression it takes, then read
twice (the second read is reported: warm page cache) as ``Store.read`` of the whole array and
as one ``iter_batches`` epoch (batches of 1,024). A run on a loaded machine is noisy: compare
formats within one run.

Usage: python benchmarks/bench_store_formats.py [--rows N] [--features F] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np


def tree_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    import xarray as xr

    import shardload
    from shardload.formats.registry import REGISTRY

    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--features", type=int, default=32)
    ap.add_argument("--workdir", default=None)
    args = ap.parse_args()
    work = args.workdir or tempfile.mkdtemp(prefix="bench-store-formats-")
    rng = np.random.default_rng(0)
    data = rng.normal(size=(args.rows, args.features)).astype("f4")
    ds = xr.Dataset({"a": (("sample", "feat"), data)})
    mib = data.nbytes / 2**20
    for entry in REGISTRY.values():
        for comp in entry.compressions:
            root = f"{work}/{entry.name}-{comp}"
            t0 = time.perf_counter()
            shardload.prepare(
                {
                    "sample_dims": ["sample"],
                    "view": "flat",
                    "arrays": {"x": ["a"]},
                    "chunk_rows": 8192,
                    "out": root,
                    "format": entry.name,
                    "compression": comp,
                    "overwrite": True,
                    "execution": {"scheduler": "threads", "num_workers": 2},
                },
                dataset=ds,
                progress=False,
            )
            write_s = time.perf_counter() - t0
            for _ in range(2):
                store = shardload.open_store(root)
                t0 = time.perf_counter()
                store.read("x")
                read_s = time.perf_counter() - t0
                t0 = time.perf_counter()
                rows = sum(len(b["index"]) for b in shardload.iter_batches(root, batch_size=1024))
                epoch_s = time.perf_counter() - t0
            assert rows == args.rows
            print(
                f"{entry.name:8s} {comp:5s} size {tree_bytes(root) / 2**20:6.1f} MiB  "
                f"write {mib / write_s:5.0f} MiB/s  Store.read {mib / read_s:5.0f} MiB/s  "
                f"iter_batches {mib / epoch_s:5.0f} MiB/s",
                flush=True,
            )


if __name__ == "__main__":
    main()
