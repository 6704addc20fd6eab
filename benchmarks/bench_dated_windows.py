"""Windows of dates (rollout) against the read limit of the same bytes (issue #27).

A dated store of ``--states`` states of ``--state-mib`` MiB each (two smooth float32 fields on
a lat x lon grid, every 6 h, a few dates missing) is prepared as npy (raw rows) and as Zarr
zstd (decoded on read), one state a chunk, and with ``--formats ...,default`` in prepare's
default layout (Zarr, one state per inner chunk, inner chunks in shard files); with
``--in-order`` the windows come in date order (``shuffle=False``), so a batch's windows share
most of their states. Each is loaded for an epoch with ``iter_batches(window=I+O)`` (the
default shuffle, ``--batch`` windows a batch, in this process): a batch's distinct states are
read once each, straight into the batch, and copied to the windows that share them.

The *read limit* is a plain read of the same rows: for every batch of the windowed epoch,
its distinct rows (runs of consecutive rows, each one ``read_into`` call of the store's
reader into a buffer, the same reader threads), and nothing else. Both are timed with a warm
page cache, alternating, best of ``--rounds``. Reported per store: windows/s, MB/s of distinct
states read by each, the ratio windows / limit of the best times (goal in issue #27: >= 0.7),
the median of the rounds' own ratios (each round's epoch against its plain read), and the
CPU seconds of each (process time, least of the rounds: steadier than wall time on a shared
machine). ``--views`` also times each round's epoch with ``window_views=True`` (read-only
arrays; a batch of windows in date order is a strided view of its distinct states, no copies),
reported as ``views_*``.

Usage::

    python benchmarks/bench_dated_windows.py --workdir /tmp/dated-bench
    python benchmarks/bench_dated_windows.py --workdir /tmp/dated-bench --inputs 3 --outputs 2
    python benchmarks/bench_dated_windows.py --workdir /tmp/dated-bench --in-order --views
"""

from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor, wait
from pathlib import Path

import numpy as np


def make_store(workdir: Path, fmt: str, states: int, state_mib: float, missing: list[int]):
    import dataclasses

    import xarray as xr

    import shardload
    from shardload.layout import MANIFEST_NAME
    from shardload.manifest.core import Manifest
    from shardload.manifest.time import TimeAxis

    out = workdir / f"dated-{fmt}-{states}x{state_mib}"
    if not (out / MANIFEST_NAME).exists():
        lon = 512
        lat = max(1, int(state_mib * 2**20 / 4 / 2 / lon))
        src = workdir / f"dated-{states}x{lat}x{lon}.nc"
        if not src.exists():
            t = np.arange(states, dtype="f4")[:, None, None]
            y = np.linspace(0, np.pi, lat, dtype="f4")[None, :, None]
            x = np.linspace(0, 2 * np.pi, lon, dtype="f4")[None, None, :]
            u = np.sin(x - 0.05 * t) * np.cos(y)  # an advected wave: compressible, not constant
            xr.Dataset(
                {"t2m": (("time", "lat", "lon"), 280 + 10 * u), "z": (("time", "lat", "lon"), u)}
            ).to_netcdf(src)
        prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
        config = {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "view": "flat",
            "arrays": {"x": ["t2m", "z"]},
            "out": str(out),
            "splits": {"train": 1.0},
        }
        if fmt == "npy":
            config.update(format="npy", compression="none", chunk_rows=1)
        elif fmt == "zarr":
            config.update(format="zarr", compression="zstd", chunk_rows=1)
        # "default": prepare's default layout (Zarr, one state per inner chunk, in shards)
        prepare(config)
        read = lambda rel: (out / rel).read_bytes()  # noqa: E731
        m = Manifest.from_json((out / MANIFEST_NAME).read_bytes(), read=read)
        axis = TimeAxis(np.datetime64("2020-01-01"), np.timedelta64(6, "h"), m.length, missing)
        for rel, data in dataclasses.replace(m, time=axis.to_dict()).to_files().items():
            (out / rel).write_bytes(data)
    return shardload.open_store(out)


def run_windows(
    store, *, window: int, batch: int, threads: int, epoch: int, shuffle: bool, views: bool = False
):
    """One epoch of windows: (seconds, windows, distinct rows read per batch)."""
    import shardload

    t0 = time.perf_counter()
    n, distinct = 0, []
    extra = {"window_views": True} if views else {}
    for b in shardload.iter_batches(
        store,
        batch_size=batch,
        window=window,
        threads=threads,
        epoch=epoch,
        seed=1,
        shuffle=shuffle,
        **extra,
    ):
        n += len(b["index"])
        distinct.append(np.unique(b["index"][:, None] + np.arange(window)))
    return time.perf_counter() - t0, n, distinct


def run_limit(store, distinct: list[np.ndarray], *, threads: int) -> float:
    """A plain read of every batch's distinct rows (runs of consecutive rows, one
    ``read_into`` each) by ``threads`` threads, all submitted at once (no wait between
    batches), into a few rotating buffers whose contents are thrown away: seconds."""
    reader = store.reader
    info = store.manifest.arrays["x"]
    shape = (max(len(d) for d in distinct), *info.row_shape)
    bufs = [np.empty(shape, np.dtype(info.dtype)) for _ in range(threads + 2)]
    into = getattr(reader, "read_into", None)

    def read(a: int, b: int, out: np.ndarray) -> None:
        if into is not None:
            into("x", a, b, out)
        else:
            out[...] = reader.read("x", a, b)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        futs = []
        for i, rows in enumerate(distinct):
            buf = bufs[i % len(bufs)]
            cut = np.flatnonzero(np.diff(rows) != 1) + 1
            starts = np.concatenate(([0], cut)).tolist()
            stops = np.concatenate((cut, [len(rows)])).tolist()
            for a, b in zip(starts, stops, strict=True):
                futs.append(pool.submit(read, int(rows[a]), int(rows[b - 1]) + 1, buf[a:b]))
        for f in wait(futs).done:
            f.result()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--states", type=int, default=240)
    ap.add_argument("--state-mib", type=float, default=1.0)
    ap.add_argument("--inputs", type=int, default=3)
    ap.add_argument("--outputs", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--formats", default="npy,zarr")
    ap.add_argument(
        "--in-order",
        action="store_true",
        help="windows in date order (shuffle=False): a batch's windows share most states",
    )
    ap.add_argument(
        "--views",
        action="store_true",
        help="also time each epoch with window_views=True (read-only views, no copies)",
    )
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    window = args.inputs + args.outputs
    missing = [args.states // 3, args.states // 3 + 1, 2 * args.states // 3]
    results = {}
    for fmt in args.formats.split(","):
        store = make_store(args.workdir, fmt, args.states, args.state_mib, missing)
        row_bytes = store.manifest.arrays["x"].row_bytes
        best_w = best_l = float("inf")
        ratios = []
        cpu_w = cpu_l = cpu_v = best_v = float("inf")
        ratios_v = []
        for r in range(args.rounds + 1):  # round 0 warms the page cache
            epoch = dict(
                window=window,
                batch=args.batch,
                threads=args.threads,
                epoch=r,
                shuffle=not args.in_order,
            )
            c0 = time.process_time()
            tw, n, distinct = run_windows(store, **epoch)
            c1 = time.process_time()
            tl = run_limit(store, distinct, threads=args.threads)
            c2 = time.process_time()
            if args.views:
                tv, nv, dv = run_windows(store, **epoch, views=True)
                assert nv == n and all(
                    np.array_equal(a, b) for a, b in zip(dv, distinct, strict=True)
                )
                if r:
                    best_v, cpu_v = min(best_v, tv), min(cpu_v, time.process_time() - c2)
                    ratios_v.append(tl / tv)
            if r:
                best_w, best_l = min(best_w, tw), min(best_l, tl)
                ratios.append(tl / tw)
                cpu_w, cpu_l = min(cpu_w, c1 - c0), min(cpu_l, c2 - c1)
        nbytes = sum(len(d) for d in distinct) * row_bytes
        results[fmt] = {
            "window": f"{args.inputs}+{args.outputs}",
            "windows": n,
            "states_served_MB": round(n * window * row_bytes / 1e6, 1),
            "distinct_states_MB": round(nbytes / 1e6, 1),
            "windows_per_s": round(n / best_w, 1),
            "windows_MB_per_s": round(nbytes / best_w / 1e6, 1),
            "served_MB_per_s": round(n * window * row_bytes / best_w / 1e6, 1),
            "limit_MB_per_s": round(nbytes / best_l / 1e6, 1),
            "ratio": round(best_l / best_w, 3),
            "ratio_per_round_median": round(float(np.median(ratios)), 3),
            "cpu_s_windows": round(cpu_w, 3),
            "cpu_s_limit": round(cpu_l, 3),
            "threads": args.threads,
        }
        if args.views:
            results[fmt].update(
                views_windows_per_s=round(n / best_v, 1),
                views_windows_MB_per_s=round(nbytes / best_v / 1e6, 1),
                views_ratio=round(best_l / best_v, 3),
                views_ratio_per_round_median=round(float(np.median(ratios_v)), 3),
                cpu_s_views=round(cpu_v, 3),
            )
        print(json.dumps({fmt: results[fmt]}), flush=True)


if __name__ == "__main__":
    main()
