"""What writing to S3 costs prepare: one 64 MiB store (2,097,152 rows of 8 float32, uncompressed)
prepared to a local folder and to ``s3://`` on moto's S3 server on 127.0.0.1 (a subprocess);
prints each run's seconds, and for the S3 run the peak bytes of its local folder (under
``$SHARDLOAD_HOME/uploads``, sampled every 20 ms). The S3 run writes its blocks there and
uploads each block's files (checked) as it is recorded, removing the local copies; the
manifest is put last (before 2026-11-28: every block first, then the whole upload).

Usage::

    python benchmarks/bench_s3_prepare.py --workdir /tmp/s3-prepare [--chunk-rows 65536]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import numpy as np
import xarray as xr

import shardload

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_s3_clients import start_moto


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workdir", default="/tmp/s3-prepare")
    ap.add_argument("--rows", type=int, default=2_097_152)
    ap.add_argument("--chunk-rows", type=int, default=None, help="default: prepare's layout")
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
        if args.chunk_rows:
            base["chunk_rows"] = args.chunk_rows
        local = os.path.join(args.workdir, "local")
        for out, extra in [(local, {}), ("s3://bench/store", {"out_storage_options": opts})]:
            shutil.rmtree(local, ignore_errors=True)
            peak = _Peak(Path(os.environ["SHARDLOAD_HOME"]) / "uploads")
            t0 = time.perf_counter()
            with peak:
                store = shardload.prepare(
                    {**base, "out": out, "overwrite": True, **extra}, dataset=ds, progress=False
                )
            print(
                f"{out}: {data.nbytes / 2**20:.0f} MiB, {store.num_chunks} chunks, "
                f"{time.perf_counter() - t0:.1f} s"
                + (f", peak local upload folder {peak.bytes / 2**20:.1f} MiB" if extra else ""),
                flush=True,
            )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


class _Peak:
    """The most bytes seen under ``folder`` while the ``with`` block runs (sampled)."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.bytes = folder, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            total = 0
            for top, _, names in os.walk(self.folder):  # a folder removed meanwhile: skipped
                for name in names:
                    with contextlib.suppress(OSError):  # removed meanwhile
                        total += os.stat(os.path.join(top, name)).st_size
            self.bytes = max(self.bytes, total)

    def __enter__(self) -> _Peak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


if __name__ == "__main__":
    main()
