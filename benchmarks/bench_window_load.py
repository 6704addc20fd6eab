"""Windows cut at load time against the flat view: loader bytes/s (goal: windows >= 0.7x flat).

One synthetic series ``(time, lat, lon)`` of ``--vars`` float32 variables (each with
``--levels`` levels) is prepared three ways, all npy, uncompressed:

- ``flat``: every (time, lat, lon) point a sample, ``x`` = all variables (what an MLP reads);
- ``at_load``: ``view: {name: window, lookback: L, horizon: 1, at_load: true}``, ``x`` (B, L, F)
  and the next step's first variable as ``y``, the series stored once;
- ``written`` (``--written``): the same windows written out (L times the bytes on disk).

Each is read for ``--epochs`` passes of its ``train`` split with the default shuffle, in this
process (``iter_batches``) and, with ``--workers W``, through a ``StreamingDataLoader`` of W
workers; the cases alternate round by round (``--rounds``), page cache warm. Bytes/s counts
the batch arrays handed to the caller (``x`` and ``y``; ``index`` left out). Reported per
case: median bytes/s and samples/s, and the ratio at_load / flat per round.

Usage::

    python benchmarks/bench_window_load.py --workdir /tmp/winbench
    python benchmarks/bench_window_load.py --workdir /tmp/winbench --lookback 24 --workers 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np


def make_source(workdir: Path, steps: int, lat: int, lon: int, nvars: int, levels: int) -> Path:
    import xarray as xr

    path = workdir / f"series-{steps}x{lat}x{lon}x{nvars}x{levels}.nc"
    if path.exists():
        return path
    rng = np.random.default_rng(0)
    data = {
        f"v{i}": (
            ("time", "lat", "lon", "lev"),
            rng.normal(size=(steps, lat, lon, levels)).astype("f4"),
        )
        for i in range(nvars)
    }
    xr.Dataset(data).to_netcdf(path)
    return path


def prepare_all(workdir: Path, src: Path, nvars: int, lookback: int, written: bool) -> dict:
    from shardload.prep.driver import prepare

    names = [f"v{i}" for i in range(nvars)]
    base = {
        "source": {"paths": [str(src)]},
        "format": "npy",
        "compression": "none",
        "splits": {"train": 0.8, "val": 0.1, "test": 0.1},
    }
    window = {
        "name": "window",
        "time_dim": "time",
        "lookback": lookback,
        "horizon": 1,
        "targets": {"y": [names[0]]},
    }
    cfgs = {
        "flat": {
            **base,
            "sample_dims": ["time", "lat", "lon"],
            "view": "flat",
            "arrays": {"x": names},
            "out": str(workdir / "flat"),
        },
        "at_load": {
            **base,
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": names},
            "view": {**window, "at_load": True},
            "out": str(workdir / f"at_load-{lookback}"),
        },
    }
    if written:
        cfgs["written"] = {
            **base,
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": names},
            "view": {**window, "at_load": False},  # at_load is the default
            "out": str(workdir / f"written-{lookback}"),
        }
    out = {}
    for k, cfg in cfgs.items():
        if not (Path(cfg["out"]) / "shardload.json").exists():
            prepare(cfg)
        out[k] = cfg["out"]
    return out


def du(path: str) -> int:
    return int(subprocess.check_output(["du", "-sb", path]).split()[0])


def read_in_process(store: str, batch_size: int, epoch: int) -> tuple[float, int, int]:
    """(seconds, bytes, samples) of one pass over the train split in this process."""
    import shardload

    t0 = time.perf_counter()
    nbytes = rows = 0
    for b in shardload.iter_batches(store, batch_size=batch_size, split="train", epoch=epoch):
        nbytes += sum(v.nbytes for k, v in b.items() if k != "index")
        rows += len(b["index"])
    return time.perf_counter() - t0, nbytes, rows


def read_workers(store: str, batch_size: int, epoch: int, workers: int) -> tuple[float, int, int]:
    from shardload.torch import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(store, batch_size=batch_size, split="train")
    ds.set_epoch(epoch)
    loader = StreamingDataLoader(ds, num_workers=workers)
    t0 = time.perf_counter()
    nbytes = rows = 0
    for b in loader:
        nbytes += sum(v.numel() * v.element_size() for k, v in b.items() if k != "index")
        rows += len(b["index"])
    return time.perf_counter() - t0, nbytes, rows


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--steps", type=int, default=720, help="time steps of the series")
    p.add_argument("--lat", type=int, default=32)
    p.add_argument("--lon", type=int, default=64)
    p.add_argument("--vars", type=int, default=4)
    p.add_argument("--levels", type=int, default=4)
    p.add_argument("--lookback", type=int, default=12)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=0, help="also through a StreamingDataLoader")
    p.add_argument("--written", action="store_true", help="also the written windows")
    p.add_argument("--json", type=Path, help="write the results here")
    args = p.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    src = make_source(args.workdir, args.steps, args.lat, args.lon, args.vars, args.levels)
    stores = prepare_all(args.workdir, src, args.vars, args.lookback, args.written)
    import xarray as xr

    with xr.open_dataset(src) as ds:
        source_bytes = sum(v.nbytes for v in ds.data_vars.values())
    sizes = {k: du(v) for k, v in stores.items()}
    print(
        f"source variables: {source_bytes / 2**20:.1f} MiB; on disk: "
        + ", ".join(f"{k} {v / 2**20:.1f} MiB ({v / source_bytes:.2f}x)" for k, v in sizes.items())
    )
    paths = [("in-process", 0)] + (
        [(f"StreamingDataLoader w{args.workers}", args.workers)] if args.workers else []
    )
    results: dict = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "sizes": sizes,
        "source_bytes": source_bytes,
        "cases": {},
    }
    for label, workers in paths:
        for s in stores.values():  # warm the page cache
            read_in_process(s, args.batch_size, 99)
        per: dict[str, list[tuple[float, float]]] = {k: [] for k in stores}
        for r in range(args.rounds):
            for k, s in stores.items():
                if workers:
                    dt, nb, rows = read_workers(s, args.batch_size, r, workers)
                else:
                    dt, nb, rows = read_in_process(s, args.batch_size, r)
                per[k].append((nb / dt, rows / dt))
            ratio = per["at_load"][-1][0] / per["flat"][-1][0]
            print(
                f"{label} round {r}: "
                + ", ".join(
                    f"{k} {v[-1][0] / 2**20:.0f} MiB/s ({v[-1][1]:,.0f} samples/s)"
                    for k, v in per.items()
                )
                + f"; at_load/flat bytes/s {ratio:.2f}",
                flush=True,
            )
        med = {k: statistics.median(b for b, _ in v) for k, v in per.items()}
        ratios = [a[0] / f[0] for a, f in zip(per["at_load"], per["flat"], strict=True)]
        print(
            f"{label} median: "
            + ", ".join(f"{k} {v / 2**20:.0f} MiB/s" for k, v in med.items())
            + f"; at_load/flat per round {[round(x, 2) for x in ratios]}"
        )
        results["cases"][label] = {"per_round": per, "ratios": ratios}
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
