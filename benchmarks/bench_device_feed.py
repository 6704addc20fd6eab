"""Host -> GPU feed: DevicePrefetcher's copy rate against the pinned-copy limit, and GPU idle time.

Needs a CUDA device (it says so and exits otherwise). Three measurements on one store (a flat
store of ``--rows`` rows of ``--features`` float32 written here, or ``--store``):

1. **pinned-copy limit**: one pinned host tensor of a batch's bytes copied to the device
   ``--repeats`` times (``non_blocking``, timed with CUDA events): GB/s.
2. **feed**: a ``StreamingDataLoader`` (``--workers``) through ``DevicePrefetcher`` (pinned
   buffers, side stream, ``--depth`` ahead) with no compute: bytes moved / wall time, GB/s, and
   the ratio to the limit.
3. **idle**: the same feed with a compute step per batch (``--matmuls`` matmuls of
   ``--dim`` x ``--dim`` on the device); GPU idle = 1 - (compute time of the same steps on
   device-resident data) / (wall time fed by the prefetcher).

Usage::

    python benchmarks/bench_device_feed.py --workdir /tmp/devfeed
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch


def make_store(workdir: Path, rows: int, features: int) -> str:
    import xarray as xr

    from shardload.prep.driver import prepare

    out = workdir / f"flat-{rows}x{features}"
    if (out / "shardload.json").exists():
        return str(out)
    workdir.mkdir(parents=True, exist_ok=True)
    src = workdir / "src.nc"
    rng = np.random.default_rng(0)
    xr.Dataset({"a": (("sample", "f"), rng.normal(size=(rows, features)).astype("f4"))}).to_netcdf(
        src
    )
    return prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a"]},
            "format": "npy",
            "compression": "none",
            "splits": {"train": 1.0},
            "out": str(out),
        }
    ).url


def pinned_limit(nbytes: int, repeats: int) -> float:
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dev.copy_(host, non_blocking=True)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        dev.copy_(host, non_blocking=True)
    end.record()
    end.synchronize()
    return nbytes * repeats / (start.elapsed_time(end) / 1e3) / 1e9


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/shardload-devfeed"))
    p.add_argument("--store")
    p.add_argument("--rows", type=int, default=262_144)
    p.add_argument("--features", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--depth", type=int, default=2)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--matmuls", type=int, default=4)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device here: nothing measured")
        return
    from shardload.torch import DevicePrefetcher, StreamingDataLoader, StreamingDataset

    store = args.store or make_store(args.workdir, args.rows, args.features)
    ds = StreamingDataset(store, batch_size=args.batch_size, split="train")
    loader = StreamingDataLoader(ds, num_workers=args.workers, persistent_workers=True)
    batch_bytes = args.batch_size * args.features * 4
    limit = pinned_limit(batch_bytes, args.repeats)
    print(f"pinned-copy limit ({batch_bytes / 2**20:.1f} MiB copies): {limit:.2f} GB/s")
    w = torch.randn(args.dim, args.dim, device="cuda")

    def compute(x: torch.Tensor) -> None:
        h = x[:, : min(x.shape[1], args.dim)]
        h = torch.nn.functional.pad(h, (0, args.dim - h.shape[1]))
        for _ in range(args.matmuls):
            h = torch.tanh(h @ w)

    for label, work in (("feed (no compute)", False), ("feed + compute", True)):
        pre = DevicePrefetcher(loader, "cuda", depth=args.depth)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        resident = []
        for b in pre:
            if work:
                compute(b["x"])
            if work and len(resident) < 4:
                resident.append(b["x"].clone())
        torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        gbs = pre.stats.bytes / wall / 1e9
        print(
            f"{label}: {pre.stats.batches} batches, {gbs:.2f} GB/s ({gbs / limit:.2f} of the "
            f"pinned limit), {pre.stats.waits} batch(es) not ready when asked, {wall:.2f} s"
        )
        if work:
            torch.cuda.synchronize()
            t1 = time.perf_counter()
            for i in range(pre.stats.batches):
                compute(resident[i % len(resident)])
            torch.cuda.synchronize()
            busy = time.perf_counter() - t1
            print(
                f"GPU idle while fed: {max(0.0, 1 - busy / wall):.1%} (compute alone {busy:.2f} s)"
            )


if __name__ == "__main__":
    main()
