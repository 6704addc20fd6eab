"""What a SquashFS image costs: pack time and size, mount time, epoch time against the folder.

    python benchmarks/bench_pack.py --rows 400000 --chunk-rows 1024 --repeats 3 --workdir DIR

One store (npy, uncompressed: x (rows, 64) float32 + y (rows, 1) int64 of random values) is
packed with ``compression="none"`` and ``"zstd"``; then shuffled epochs of ``iter_batches``
(batch 256) are read from the folder and through each image, interleaved, each in a fresh
process. The page cache is warm (nothing is dropped): this measures the software path
(squashfuse, FUSE round trips, decompression), not a slow metadata server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

EPOCH = """
import sys, time, json
t0 = time.perf_counter()
import shardload
st = shardload.open_store(sys.argv[1])
t1 = time.perf_counter()
n = 0
for b in shardload.iter_batches(st, batch_size=256, seed=1):
    n += len(b["index"])
t2 = time.perf_counter()
print(json.dumps({"open_s": t1 - t0, "epoch_s": t2 - t1, "rows": n}))
"""


def make(work: Path, rows: int, chunk_rows: int) -> Path:
    import xarray as xr

    import shardload

    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {
            "a": (("sample", "f"), rng.standard_normal((rows, 64), dtype=np.float32)),
            "c": ("sample", np.arange(rows, dtype=np.int64)),
        }
    )
    src = work / "src.nc"
    ds.to_netcdf(src)
    out = work / "store"
    shardload.prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a"], "y": ["c"]},
            "chunk_rows": chunk_rows,
            "format": "npy",
            "out": str(out),
            "splits": {"train": 1.0},
        }
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--chunk-rows", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", type=Path, default=None)
    args = ap.parse_args()
    from shardload.move.pack import pack

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-pack-"))
    work.mkdir(parents=True, exist_ok=True)
    store = make(work, args.rows, args.chunk_rows)
    files = sum(1 for p in store.rglob("*") if p.is_file())
    nbytes = sum(p.stat().st_size for p in store.rglob("*") if p.is_file())
    targets = {"folder": str(store)}
    report: dict = {"rows": args.rows, "files": files, "store_bytes": nbytes, "pack": {}}
    for comp in ("none", "zstd"):
        t0 = time.perf_counter()
        img = pack(store, work / f"store-{comp}.sqfs", compression=comp, overwrite=True)
        report["pack"][comp] = {"seconds": time.perf_counter() - t0, "bytes": img.stat().st_size}
        targets[f"image-{comp}"] = str(img)
    times: dict[str, list[dict]] = {k: [] for k in targets}
    for _ in range(args.repeats):
        for name, path in targets.items():
            res = subprocess.run(
                [sys.executable, "-c", EPOCH, path], capture_output=True, text=True, check=True
            )
            times[name].append(json.loads(res.stdout.strip().splitlines()[-1]))
            time.sleep(0.5)  # the previous image's watcher unmounts
    print(f"store: {args.rows:,} rows, {files} files, {nbytes / 1e6:.1f} MB")
    for comp, p in report["pack"].items():
        print(f"pack {comp}: {p['seconds']:.2f} s, image {p['bytes'] / 1e6:.1f} MB")
    base = statistics.median(t["epoch_s"] for t in times["folder"])
    print("| read from | open (median) | epoch (median) | MB/s | x folder |\n|---|---|---|---|---|")
    for name, ts in times.items():
        ep = statistics.median(t["epoch_s"] for t in ts)
        op = statistics.median(t["open_s"] for t in ts)
        print(f"| {name} | {op:.3f} s | {ep:.3f} s | {nbytes / 1e6 / ep:,.0f} | {ep / base:.2f} |")
    report["epochs"] = times
    (work / "bench-pack.json").write_text(json.dumps(report, indent=1))
    print(f"wrote {work / 'bench-pack.json'}")


if __name__ == "__main__":
    main()
