"""What a dated store costs prepare: the time axis, the missing-date scan, statistics over the
train split and tendency statistics, against the same file prepared undated (``dates: false``).

A synthetic series of 6-hourly states ``(time 1460, level 4, lat 32, lon 64)`` of two float32
variables (64 KiB a state, 96 MiB in all; two dates missing, one state all NaN) is prepared
three ways, in turn, ``REPEATS`` times each: ``dates: false`` (as before dated stores), dated
without tendencies (``tendencies: []``) and dated with the default ``tendencies: [1]``. Each
run's wall time and CPU time (this process, every thread) are printed; the medians as JSON.

Usage::

    python benchmarks/bench_dated_prepare.py WORKDIR [REPEATS]
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

CASES = {
    "undated": False,
    "dated, no tendencies": {"tendencies": []},
    "dated, tendencies [1]": {"tendencies": [1]},
}


def write_series(path: Path) -> None:
    import pandas as pd
    import xarray as xr

    rng = np.random.default_rng(0)
    n = 1460
    dims = ("time", "level", "lat", "lon")
    data = {v: rng.normal(size=(n, 4, 32, 64)).astype("f4") for v in ("t", "z")}
    data["t"][700] = np.nan
    data["z"][700] = np.nan
    ds = xr.Dataset(
        {v: (dims, a) for v, a in data.items()},
        coords={"time": pd.date_range("2020-01-01", periods=n, freq="6h")},
    )
    ds.drop_isel(time=[100, 101]).to_netcdf(path)


def main() -> None:
    import shardload

    work = Path(sys.argv[1])
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    work.mkdir(parents=True, exist_ok=True)
    src = work / "states.nc"
    if not src.exists():
        write_series(src)
    runs: dict[str, list[tuple[float, float]]] = {k: [] for k in CASES}
    for _ in range(repeats):
        for name, dates in CASES.items():
            c = {
                "source": str(src),
                "sample_dims": ["time"],
                "arrays": {"x": ["t", "z"]},
                "dates": dates,
                "out": str(work / "store"),
                "overwrite": True,
                "execution": {"scheduler": "threads", "num_workers": 2},
            }
            t0, c0 = time.perf_counter(), time.process_time()
            store = shardload.prepare(c, progress=False)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            runs[name].append((wall, cpu))
            print(f"{name}: {len(store)} rows, wall {wall:.2f} s, cpu {cpu:.2f} s", flush=True)
    summary = {
        name: {
            "wall_s_median": round(statistics.median(w for w, _ in r), 2),
            "cpu_s_median": round(statistics.median(c for _, c in r), 2),
        }
        for name, r in runs.items()
    }
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
