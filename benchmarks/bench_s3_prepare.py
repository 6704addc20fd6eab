"""What writing to S3 costs prepare: one 64 MiB store (2,097,152 rows of 8 float32, uncompressed)
prepared to a local folder and to ``s3://`` on moto's S3 server on 127.0.0.1 (a subprocess);
prints each run's seconds. The S3 run writes the same local folder first (under
``$SHARDLOAD_HOME/uploads``), then uploads and checks every object, the manifest last.

Usage::

    python benchmarks/bench_s3_prepare.py --workdir /tmp/s3-prepare
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

import numpy as np
import xarray as xr

import shardload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_s3_clients import start_moto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/s3-prepare")
    ap.add_argument("--rows", type=int, default=2_097_152)
    args = ap.parse_args()
    proc, endpoint = start_moto()  # waits until it answers (exits if it never does)
    try:
        os.environ["SHARDLOAD_HOME"] = os.path.join(args.workdir, "home")
        opts = {"key": "bench", "secret": "bench", "endpoint_url": endpoint}
        import s3fs

        s3fs.S3FileSystem(**opts).mkdir("bench")
        n = args.rows
        data = np.random.default_rng(0).normal(size=(n, 8)).astype("float32")
        ds = xr.Dataset({"v": (("sample", "f"), data)})
        base = {"sample_dims": ["sample"], "arrays": {"x": ["v"]}, "compression": "none"}
        local = os.path.join(args.workdir, "local")
        for out, extra in [(local, {}), ("s3://bench/store", {"out_storage_options": opts})]:
            shutil.rmtree(local, ignore_errors=True)
            t0 = time.perf_counter()
            store = shardload.prepare({**base, "out": out, **extra}, dataset=ds, progress=False)
            print(
                f"{out}: {data.nbytes / 2**20:.0f} MiB, {store.num_chunks} chunks, "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
