"""Window views by default (series once, windows cut at load) against written windows, on the
default format and codec (Zarr, lz4): prepare time and size on disk, and one loader epoch.

A synthetic series ``(time 720, lat 32, lon 64, lev 4)`` of three float32 variables is prepared
with ``view: {name: window, lookback: 12, horizon: 1}`` twice: as is (``at_load`` is the
default) and with ``at_load: false``; xarray's own full read of the variables is the yardstick.
Each store is then read for one epoch of its ``train`` split (``iter_batches``, batch 256,
default shuffle) in a fresh process per case, so that a checkout given by ``PYTHONPATH`` (e.g.
an older one) can read the same stores.

Usage::

    python benchmarks/bench_window_default.py WORKDIR prepare
    python benchmarks/bench_window_default.py WORKDIR load-cut [MAX_BATCHES]
    python benchmarks/bench_window_default.py WORKDIR load-written
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

VIEW = {"name": "window", "lookback": 12, "horizon": 1, "targets": {"y": ["v0"]}}


def config(work: Path, out: str, at_load: bool) -> dict:
    return {
        "source": str(work / "series.nc"),
        "sample_dims": ["lat", "lon"],
        "view": {**VIEW, "at_load": at_load},
        "arrays": {"x": ["v0", "v1", "v2"]},
        "splits": {"train": 0.8, "val": 0.2},
        "out": str(work / out),
        "overwrite": True,
        "execution": {"scheduler": "threads", "num_workers": 2},
    }


def prepare_both(work: Path) -> dict:
    import xarray as xr

    import shardload

    src = work / "series.nc"
    if not src.exists():
        rng = np.random.default_rng(0)
        shape = (720, 32, 64, 4)
        dims = ("time", "lat", "lon", "lev")
        data = {f"v{i}": (dims, rng.normal(size=shape).astype("f4")) for i in range(3)}
        xr.Dataset(data).to_netcdf(src)
    t = time.perf_counter()
    xr.open_dataset(src)[["v0", "v1", "v2"]].load()
    out = {"xarray_load_s": time.perf_counter() - t, "source_MiB": src.stat().st_size / 2**20}
    for name, at_load in (("cut", True), ("written", False)):
        t = time.perf_counter()
        shardload.prepare(config(work, name, at_load))
        out[f"prepare_{name}_s"] = time.perf_counter() - t
        du = subprocess.check_output(["du", "-sb", str(work / name)]).split()[0]
        out[f"du_{name}_MiB"] = int(du) / 2**20
    return out


def load_epoch(work: Path, name: str, limit: int | None) -> dict:
    import shardload

    store = shardload.open_store(str(work / name))
    n, t = 0, time.perf_counter()
    batches = shardload.iter_batches(store, batch_size=256, split="train", seed=0)
    for k, b in enumerate(batches):
        n += len(b["index"])
        if limit and k + 1 >= limit:
            break
    dt = time.perf_counter() - t
    return {name: {"samples": n, "s": dt, "samples_per_s": n / dt}}


def main() -> None:
    work, mode = Path(sys.argv[1]), sys.argv[2]
    work.mkdir(parents=True, exist_ok=True)
    if mode == "prepare":
        print(json.dumps(prepare_both(work)))
    else:
        limit = int(sys.argv[3]) if len(sys.argv) > 3 else None
        print(json.dumps(load_epoch(work, mode.split("-", 1)[1], limit)))


if __name__ == "__main__":
    main()
