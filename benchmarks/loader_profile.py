"""Profiling aid for the loader (not the published benchmark; see ``bench_load.py`` for that).

Builds, once, small Zarr v3 stores in a work folder (uncompressed and zstd; ~6.2 KB rows:
x float32 (1536,) + y float32 (14,); 4,096-row chunks) and prints, in one run so the ratios are
comparable on a shared machine:

  read    page-cache read limit: ``np.fromfile`` over every chunk file (after a warm-up pass);
          for compressed stores also read + Blosc decode with one thread per core (the limit
          the ratios of that store refer to)
  iter    ``shardload.iter_batches`` in-process, one shuffled epoch
  dl2     ``StreamingDataset`` through ``DataLoader(batch_size=None, num_workers=2)``
  dl2warm the same with persistent workers, second epoch (no worker start-up)
  dl2stock  dl2warm with ``ring_slots=0`` (the stock shared-memory hand-off)
  handoff the DataLoader with 2 workers yielding pre-made batches (no I/O): the hand-off cost

Usage::

    PYTHONPATH=src python benchmarks/loader_profile.py --workdir /tmp/lp [--rows 49152]
        [--only iter,dl2] [--compression none,zstd] [--profile iter]   # cProfile one case
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import os
import pstats
import time
from pathlib import Path

import numpy as np

ROW_X, ROW_Y, CHUNK_ROWS, BATCH = 1536, 14, 4096, 256


def build(work: Path, rows: int, compression: str) -> Path:
    """A prepared store (via ``shardload.prepare`` from a Zarr source) unless it exists."""
    import xarray as xr

    import shardload

    out = work / f"store-{compression}"
    if (out / "shardload.json").exists():
        return out
    src = work / "source.zarr"
    if not src.exists():
        t = np.arange(rows, dtype=np.float32)[:, None]
        x = (np.sin(t * 1e-3 + np.arange(ROW_X, dtype=np.float32) * 1e-2) * 100).round(2)
        y = (t % 97 + np.arange(ROW_Y, dtype=np.float32)).astype(np.float32)
        ds = xr.Dataset(
            {"a": (("sample", "f"), x.astype(np.float32)), "b": (("sample", "g"), y)}
        ).chunk({"sample": CHUNK_ROWS})
        ds.to_zarr(src, mode="w")
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(src)], "engine": "zarr"},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a"], "y": ["b"]},
            "chunk_rows": CHUNK_ROWS,
            "format": "zarr",
            "compression": compression,
            "out": str(out),
        }
    )
    return out


def chunk_files(store: Path) -> list[str]:
    return [
        p for p in glob.glob(str(store / "*" / "c" / "**"), recursive=True) if os.path.isfile(p)
    ]


def read_limit(store: Path) -> float:
    """GB/s of np.fromfile over the chunk files (page cache, warm, one thread)."""
    files = chunk_files(store)
    for f in files:
        np.fromfile(f, np.uint8)
    t = time.perf_counter()
    n = sum(np.fromfile(f, np.uint8).nbytes for f in files)
    return n / (time.perf_counter() - t) / 1e9


def decode_limit(store: Path) -> float:
    """GB/s (decoded) of reading + Blosc-decoding every chunk file, one thread per core."""
    from concurrent.futures import ThreadPoolExecutor

    from numcodecs import blosc

    files = chunk_files(store)

    def one(f: str) -> int:
        with open(f, "rb") as fh:
            raw = fh.read()
        return len(blosc.decompress(raw))

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(one, files))
        t = time.perf_counter()
        n = sum(pool.map(one, files))
    return n / (time.perf_counter() - t) / 1e9


def run_iter(store: Path) -> tuple[int, float]:
    import shardload

    t, n = time.perf_counter(), 0
    for b in shardload.iter_batches(str(store), batch_size=BATCH, seed=1):
        n += len(b["index"])
    return n, time.perf_counter() - t


def run_dl(store: Path, workers: int = 2, ring_slots: int | None = None) -> tuple[int, float]:
    from torch.utils.data import DataLoader

    from shardload.torch import StreamingDataset

    kw = {} if ring_slots is None else {"ring_slots": ring_slots}
    ds = StreamingDataset(str(store), batch_size=BATCH, seed=1, **kw)
    t, n = time.perf_counter(), 0
    for b in DataLoader(ds, batch_size=None, num_workers=workers):
        n += len(b["index"])
    return n, time.perf_counter() - t


def run_dl_warm(store: Path, workers: int = 2, ring_slots: int | None = None) -> tuple[int, float]:
    """Persistent workers, second epoch timed (no worker start-up in the figure)."""
    from torch.utils.data import DataLoader

    from shardload.torch import StreamingDataset

    kw = {} if ring_slots is None else {"ring_slots": ring_slots}
    ds = StreamingDataset(str(store), batch_size=BATCH, seed=1, **kw)
    loader = DataLoader(ds, batch_size=None, num_workers=workers, persistent_workers=True)
    for _ in loader:
        pass
    ds.set_epoch(1)
    t, n = time.perf_counter(), 0
    for b in loader:
        n += len(b["index"])
    return n, time.perf_counter() - t


class _Premade:
    def __init__(self, rows: int) -> None:
        self.rows = rows

    def __iter__(self):  # type: ignore[no-untyped-def]
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        w, nw = (0, 1) if info is None else (info.id, info.num_workers)
        x, y = np.ones((BATCH, ROW_X), np.float32), np.ones((BATCH, ROW_Y), np.float32)
        for i in range(w, self.rows // BATCH, nw):
            yield {
                "x": torch.from_numpy(x.copy()),
                "y": torch.from_numpy(y.copy()),
                "index": torch.arange(i * BATCH, (i + 1) * BATCH),
            }


def run_handoff(rows: int) -> tuple[int, float]:
    from torch.utils.data import DataLoader, IterableDataset

    ds = type("Premade", (_Premade, IterableDataset), {})(rows)
    t, n = time.perf_counter(), 0
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        n += len(b["index"])
    return n, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--workdir", default="/tmp/shardload-loader-profile")
    ap.add_argument("--rows", type=int, default=12 * CHUNK_ROWS)
    ap.add_argument("--compression", default="none,zstd")
    ap.add_argument("--only", default="iter,dl2,dl2warm,dl2stock,handoff")
    ap.add_argument("--profile", default=None, help="cProfile this case (e.g. iter)")
    ap.add_argument("--repeat", type=int, default=3, help="runs per case (best reported)")
    args = ap.parse_args()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    only = args.only.split(",")
    row_bytes = (ROW_X + ROW_Y) * 4
    for comp in args.compression.split(","):
        store = build(work, args.rows, comp)
        limit = read_limit(store)
        print(f"[{comp}] read limit (np.fromfile, warm): {limit:.2f} GB/s (of stored bytes)")
        if comp != "none":
            limit = decode_limit(store)
            print(f"[{comp}] read + Blosc decode, all cores: {limit:.2f} GB/s (decoded bytes)")
        cases = {
            "iter": lambda s=store: run_iter(s),
            "dl2": lambda s=store: run_dl(s),
            "dl2warm": lambda s=store: run_dl_warm(s),
            "dl2stock": lambda s=store: run_dl_warm(s, ring_slots=0),
        }
        if comp == "none":
            cases["handoff"] = lambda: run_handoff(args.rows)
        for name, fn in cases.items():
            if name not in only:
                continue
            if args.profile == name:
                prof = cProfile.Profile()
                n, dt = prof.runcall(fn)
                pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
            else:
                fn()  # warm-up (imports, page cache, allocator); report the best of the rest
                n, dt = min((fn() for _ in range(args.repeat)), key=lambda r: r[1])
            gbs = n * row_bytes / dt / 1e9
            print(
                f"[{comp}] {name:9s} {n / dt / 1e3:8.1f} k samples/s  {gbs:6.2f} GB/s  "
                f"{gbs / limit:5.2f} of {'read' if comp == 'none' else 'read + decode'} limit"
            )


if __name__ == "__main__":
    main()
