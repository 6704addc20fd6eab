"""Load speed of combined dated stores against the same data prepared as one store (issue #27).

One netCDF of ``--states`` six-hourly states (two float32 fields ``t2m`` and ``z`` on a lat x
lon grid, ``--state-mib`` MiB a state in all) is prepared as:

- *single*: one store, arrays ``a`` (t2m) and ``b`` (z), every date;
- *join*: two stores of every date, one holding ``a``, the other ``b``: ``shardload.join``;
- *concat*: two stores of the first and the second half of the dates, both arrays:
  ``shardload.concat``.

Every store has the same layout (``--format``: ``npy`` raw rows, ``zarr`` zstd, or
``default``, prepare's default layout), one state a chunk. Each is loaded for an epoch by
``iter_batches`` (the default shuffle, ``--batch`` a batch, ``--threads`` reader threads, this
process) without windows and with ``window=--window``, the three stores alternating in each
round after a warm-up round (warm page cache), best of ``--rounds``. Printed per case: states
(or windows) per second of each store and the ratio combined / single (the issue's bar: a
combination should load at >= 0.7 of the single store), and the CPU seconds (process time,
least of the rounds) with their ratio single / combined (steadier than wall time on a
shared machine). Every batch of a combination is checked equal to the single store's.

Usage::

    python benchmarks/bench_combined.py --workdir /tmp/combined-bench
    python benchmarks/bench_combined.py --workdir /tmp/combined-bench --format zarr --window 5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np


def make_source(workdir: Path, states: int, state_mib: float) -> Path:
    import pandas as pd
    import xarray as xr

    lon = 512
    lat = max(1, int(state_mib * 2**20 / 4 / 2 / lon))
    src = workdir / f"combined-{states}x{lat}x{lon}.nc"
    if not src.exists():
        t = np.arange(states, dtype="f4")[:, None, None]
        y = np.linspace(0, np.pi, lat, dtype="f4")[None, :, None]
        x = np.linspace(0, 2 * np.pi, lon, dtype="f4")[None, None, :]
        u = np.sin(x - 0.05 * t) * np.cos(y)  # an advected wave: compressible, not constant
        dates = pd.date_range("2020-01-01", periods=states, freq="6h")
        xr.Dataset(
            {"t2m": (("time", "lat", "lon"), 280 + 10 * u), "z": (("time", "lat", "lon"), u)},
            coords={"time": dates},
        ).to_netcdf(src)
    return src


def make_stores(workdir: Path, src: Path, fmt: str, states: int) -> dict[str, object]:
    import xarray as xr

    import shardload
    from shardload.layout import MANIFEST_NAME

    half = states // 2
    files = {"all": src}
    for when, part in (("early", slice(0, half)), ("late", slice(half, states))):
        files[when] = src.with_name(f"{src.stem}-{when}.nc")
        if not files[when].exists():
            with xr.open_dataset(src) as ds:
                ds.isel(time=part).to_netcdf(files[when])
    layout = {"npy": dict(format="npy", compression="none"), "zarr": dict(format="zarr")}
    built = {}
    for name, arrays, when in (
        ("single", {"a": ["t2m"], "b": ["z"]}, "all"),
        ("only_a", {"a": ["t2m"]}, "all"),
        ("only_b", {"b": ["z"]}, "all"),
        ("early", {"a": ["t2m"], "b": ["z"]}, "early"),
        ("late", {"a": ["t2m"], "b": ["z"]}, "late"),
    ):
        out = workdir / f"{fmt}-{name}-{states}"
        if not (out / MANIFEST_NAME).exists():
            shardload.prepare(
                {
                    "source": {"paths": [str(files[when])]},
                    "sample_dims": ["time"],
                    "arrays": arrays,
                    "dates": {"tendencies": []},
                    "splits": {"train": 1.0},
                    "chunk_rows": 1,
                    "out": str(out),
                    "overwrite": True,
                    **layout.get(fmt, {}),
                }
            )
        built[name] = shardload.open_store(out)
    return {
        "single": built["single"],
        "join": shardload.join(built["only_a"], built["only_b"]),
        "concat": shardload.concat(built["early"], built["late"]),
    }


def epoch(store, *, window: int | None, batch: int, threads: int, seed: int) -> tuple[float, int]:
    """One epoch: (seconds, samples); the batches' ``index`` and values kept for the check."""
    import shardload

    t0 = time.perf_counter()
    n = 0
    for b in shardload.iter_batches(
        store, batch_size=batch, window=window, threads=threads, seed=seed
    ):
        n += len(b["index"])
    return time.perf_counter() - t0, n


def check_equal(stores, *, window: int | None, batch: int, threads: int) -> None:
    """Every batch of each combination equals the single store's (same order, same values)."""
    import shardload

    runs = {
        k: shardload.iter_batches(s, batch_size=batch, window=window, threads=threads, seed=7)
        for k, s in stores.items()
    }
    for ref in runs["single"]:
        for k in ("join", "concat"):
            got = next(runs[k])
            for key in ("index", "a", "b"):
                np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{k} {key}")
    for k in ("join", "concat"):
        assert next(runs[k], None) is None, f"{k} has more batches"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--states", type=int, default=240)
    ap.add_argument("--state-mib", type=float, default=1.0)
    ap.add_argument("--format", default="npy", choices=["npy", "zarr", "default"])
    ap.add_argument("--window", type=int, default=5)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    src = make_source(args.workdir, args.states, args.state_mib)
    stores = make_stores(args.workdir, src, args.format, args.states)
    row_mb = sum(stores["single"].manifest.arrays[k].row_bytes for k in ("a", "b")) / 1e6
    for window in (None, args.window):
        opts = dict(window=window, batch=args.batch, threads=args.threads)
        check_equal(stores, **opts)
        best = {k: float("inf") for k in stores}
        cpu = dict(best)
        count = {}
        for r in range(args.rounds + 1):  # round 0 warms the page cache
            for k, s in stores.items():
                c0 = time.process_time()
                t, count[k] = epoch(s, seed=r, **opts)
                if r:
                    best[k], cpu[k] = min(best[k], t), min(cpu[k], time.process_time() - c0)
        n = count["single"]
        assert all(c == n for c in count.values()), count
        per_s = {k: n / best[k] for k in stores}
        print(
            json.dumps(
                {
                    "format": args.format,
                    "window": window,
                    "samples": n,
                    "MB_per_sample": round(row_mb * (window or 1), 2),
                    **{f"{k}_per_s": round(v, 1) for k, v in per_s.items()},
                    **{f"{k}_ratio": round(per_s[k] / per_s["single"], 3) for k in stores},
                    **{f"{k}_cpu_s": round(cpu[k], 3) for k in stores},
                    # CPU per sample against the single store's: steadier than wall time
                    # on a shared machine
                    **{f"{k}_cpu_ratio": round(cpu["single"] / cpu[k], 3) for k in stores},
                    "threads": args.threads,
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
