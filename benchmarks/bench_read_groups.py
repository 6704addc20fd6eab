"""Read groups (issue 27): bytes each rank reads per sample, by format and group size.

A store of states (``--rows`` rows of ``(--variables, --cells)`` float32: a smooth field plus
noise, as weather fields compress) is prepared in each format under ``--workdir``; then, for
each read group size G, rank 0 of a world of G ranks (one group: every rank reads every row)
reads one epoch in-process with ``iter_batches(..., read_group_size=G)``. Printed per format
and G: the bytes this process read through read syscalls during the epoch (``rchar`` of
``/proc/self/io``: page cache or disk alike, compressed bytes for compressed chunks), per
sample, as a fraction of a whole row's decoded bytes, and the epoch's seconds. io_uring reads
do not count in ``rchar``, so this script turns it off (``SHARDLOAD_IO_URING=0``: the G=1
reads of raw rows are then ``preadv`` calls, as they are where io_uring is missing).

Usage::

    python benchmarks/bench_read_groups.py --workdir /tmp/brg
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

FORMATS = {
    "npy": {"format": "npy", "compression": "none"},
    "zarr-raw": {"format": "zarr", "compression": "none"},
    "zarr-lz4": {"format": "zarr", "compression": "lz4"},
    "zarr-zstd-shards": {"format": "zarr", "compression": "zstd", "shard_chunks": 4},
}


def rchar() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise RuntimeError("no rchar in /proc/self/io")


def source(work: Path, rows: int, variables: int, cells: int) -> Path:
    import xarray as xr

    path = work / f"states-{rows}x{variables}x{cells}.nc"
    if not path.exists():
        rng = np.random.default_rng(0)
        x = np.linspace(0, 8 * np.pi, cells, dtype="f4")
        base = np.sin(x[None, None, :] + np.arange(rows)[:, None, None] * 0.1)
        noise = rng.normal(scale=0.01, size=(rows, variables, cells)).astype("f4")
        data = (base * np.arange(1, variables + 1)[None, :, None] + noise).astype("f4")
        xr.Dataset({"state": (("time", "variable", "cell"), data)}).to_netcdf(path)
    return path


def prepare(work: Path, src: Path, name: str, options: dict, chunk_rows: int):
    import shardload

    out = work / name
    shutil.rmtree(out, ignore_errors=True)
    run = getattr(shardload.prepare, "prepare", shardload.prepare)
    return run(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "view": {"function": "bench_read_groups:rows"},
            "chunk_rows": chunk_rows,
            "out": str(out),
            "splits": {},
            **options,
        }
    )


def rows(ds):
    """The view: each state as it is, ``(variable, cell)`` per row."""
    return {"state": ds.state}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--variables", type=int, default=8)
    p.add_argument("--cells", type=int, default=65536)
    p.add_argument("--chunk-rows", type=int, default=4)
    p.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args()
    from shardload import iter_batches

    args.workdir.mkdir(parents=True, exist_ok=True)
    src = source(args.workdir, args.rows, args.variables, args.cells)
    row_bytes = args.variables * args.cells * 4
    print(f"rows of {args.variables} x {args.cells} float32 ({row_bytes / 2**20:.2f} MiB)")
    print(f"{'format':>18} {'store MiB':>9} {'G':>2} {'bytes/sample':>13} {'of a row':>8} {'s':>6}")
    for name, options in FORMATS.items():
        st = prepare(args.workdir, src, name, options, args.chunk_rows)
        size = sum(f.stat().st_size for f in (args.workdir / name).rglob("*") if f.is_file())
        for g in args.groups:
            before, t = rchar(), time.perf_counter()
            n = 0
            for batch in iter_batches(
                st, batch_size=4, rank=0, world_size=g, read_group_size=g, seed=1
            ):
                n += len(batch["index"])
            seconds, got = time.perf_counter() - t, rchar() - before
            print(
                f"{name:>18} {size / 2**20:9.1f} {g:>2} {got / n:13,.0f} "
                f"{got / n / row_bytes:8.3f} {seconds:6.2f}"
            )


if __name__ == "__main__":
    import os
    import sys

    os.environ["SHARDLOAD_IO_URING"] = "0"

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
