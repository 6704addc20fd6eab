"""The N320 check of issue #27: how many accelerators one node keeps >= 95% busy on N320 states.

anemoi measured its loader at N320 (542,080 cells, about 60 channels, float32: 130 MB a state)
on one GH200: 1.00 it/s, against 1.75 it/s with faked loading (anemoi-core PR #1387), so the
step without loading is 1 / 1.75 = 0.571 s and the accelerator was busy 57% of the time.
This benchmark emulates that accelerator on this machine's CPUs with ``shardload bench
loaders`` (sleep 0.571 s a batch; batch size 1; each sample a window of 3 consecutive states:
2 inputs + 1 rollout target, as anemoi trains) over two stores of the same generated states:

- ``anemoi``: ``shardload sample states --lat 440 --lon 1232 --levels 20`` (a regular
  440 x 1232 latitude/longitude grid: 542,080 cells, as many as N320's reduced Gaussian grid
  has, but not that grid; t, q, z on 20 levels: 60 channels) made into a store by
  ``anemoi-datasets create`` (the venv of ``make anemoi-venv``, or ``--anemoi-python``; its
  default layout: Zarr v2, Blosc lz4, 2 chunks a date), read as it is by shardload; skipped,
  saying why, when that venv is absent;
- ``shardload``: the same states in prepare's default layout (Zarr v3, lz4, one date a chunk
  and a shard), written by ``shardload copy`` of the anemoi store (``--own copy``, the
  default: statistics carried). ``--own prepare`` prepares the netCDF instead (no tendency
  statistics, one task at a time; before 2026-11-28 that ran out of memory on the 24 GB VM,
  since then such a prepare peaks near 7 GB, docs/benchmarks.md "Prepare: memory of wide
  dated rows"), so the figures of 2026-11-28 on the VM use the copy;
- ``shardload-raw`` (``--raw``): the same layout uncompressed (``shardload copy --compression
  none``): reading is then a copy out of the page cache, no decoding.

Before each store's runs it measures the page-cache read limit of the day: every file of the
store read once to warm the cache, then again with 64 MiB ``readinto`` calls by 1 and by 2
threads (MB/s). Then ``bench loaders --emulate-compute 0.571 --batch-size 1 --window 3
--goal 0.95`` for each worker count, accelerators 1, 2, 4, ... until the first that fails;
counts whose batches in flight (an estimate: 3 windows a reader, 4 a DataLoader worker)
would not fit in half the memory available are left out and named. The table gives, per
store, workers and accelerators: the least busy accelerator's AU, the mean AU, MB/s of states
served to all accelerators, the loader's CPU seconds a batch (workers and start-up included)
and how many accelerators one core could feed at that cost (0.571 s / CPU s a batch: what the
node would give with its cores free), and the read limit.

Usage::

    python benchmarks/bench_n320.py --workdir /tmp/n320 --dates 32     # the docs' figures
    python benchmarks/bench_n320.py --workdir /tmp/n320-small --lat 44 --lon 123 --levels 2

The work folder holds the netCDF (deleted once both stores exist, unless ``--keep-source``)
and both stores: about 2 x dates x 130 MB; delete it when done.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
STEP_S = 0.571  # anemoi's step at N320 without loading: 1 / 1.75 it/s
READ_BYTES = 64 << 20


def run_shardload(*args: str, **kw) -> subprocess.CompletedProcess:
    path = [str(REPO / "src"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    cmd = [sys.executable, "-m", "shardload", *args]
    print("$", " ".join(["shardload", *args]), flush=True)
    return subprocess.run(cmd, check=True, env=env, **kw)


def make_source(work: Path, args: argparse.Namespace) -> Path:
    src = work / "source" / "states-6h.nc"
    if not src.exists():
        run_shardload(
            "sample", "states", "--out", str(src.parent), "--dates", str(args.dates),
            "--lat", str(args.lat), "--lon", str(args.lon), "--levels", str(args.levels),
        )  # fmt: skip
    return src


def prepare_own(work: Path, src: Path, args: argparse.Namespace) -> Path:
    """prepare's default layout of the states (format, chunks, compression): one row a date,
    every channel; no tendency statistics and one task at a time, to fit in memory."""
    from shardload.samples.states import level_names

    out = work / "shardload-store"
    if out.exists():
        return out
    config = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["time"],
        "arrays": {"state": level_names(args.levels)},
        "dtype": "float32",
        # prepare keeps statistics per feature (32.5 M features of N320 x 60 channels): no
        # tendencies and one task at a time keep its memory lowest. Neither changes the
        # layout the loader reads.
        "dates": {"frequency": "6h", "tendencies": []},
        "execution": {"scheduler": "sync"},
        "out": str(out),
    }
    path = work / "n320.yaml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    run_shardload("prepare", str(path), "--no-progress")
    return out


def copy_own(work: Path, anemoi: Path, *, name: str = "shardload-store", raw: bool = False) -> Path:
    """prepare's default layout of the same states, by ``shardload copy`` of the anemoi store
    (statistics carried, not recomputed); ``raw``: the same uncompressed."""
    out = work / name
    if not out.exists():
        extra = ["--compression", "none"] if raw else []
        run_shardload("copy", str(anemoi), str(out), *extra, "--no-progress", "-q")
    return out


def anemoi_problem(python: Path) -> str | None:
    if not python.exists():
        return f"no anemoi venv: {python} is absent (make anemoi-venv, or --anemoi-python)"
    res = subprocess.run([str(python), "-c", "import anemoi.datasets"], capture_output=True)
    if res.returncode != 0:
        return f"{python} cannot import anemoi.datasets: {res.stderr.decode()[-300:]}"
    return None


def create_anemoi(work: Path, src: Path, python: Path, args: argparse.Namespace) -> Path:
    """``anemoi-datasets create`` over the same netCDF (its default layout: a chunk a date)."""
    out = work / "anemoi.zarr"
    if out.exists():
        return out
    import numpy as np

    start = np.datetime64("2020-01-01T00:00:00")  # write_states_sample's default start
    end = start + np.timedelta64(6 * (args.dates - 1), "h")
    recipe = {
        "dates": {"start": str(start), "end": str(end), "frequency": "6h"},
        "input": {"netcdf": {"path": str(src)}},
        "build": {"group_by": 4},  # 4 dates in memory at a time, not all of them
    }
    path = work / "anemoi-recipe.yaml"
    path.write_text(json.dumps(recipe, indent=1))
    cmd = [str(python.parent / "anemoi-datasets"), "create", str(path), str(out)]
    print("$", " ".join(cmd[-4:]), flush=True)
    t = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=work)
    if res.returncode != 0:
        raise SystemExit(f"anemoi-datasets create failed:\n{res.stderr[-3000:]}")
    print(f"  anemoi-datasets create took {time.perf_counter() - t:.0f} s", flush=True)
    return out


def store_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def read_limit(root: Path, threads: int) -> float:
    """MB/s of reading every file of ``root`` with 64 MiB ``readinto`` calls, ``threads`` at
    once (the files shared out among them); the cache warmed by a first read."""
    files = store_files(root)
    bufs = [bytearray(READ_BYTES) for _ in range(threads)]

    def read(i: int) -> int:
        n, view = 0, memoryview(bufs[i])
        for f in files[i::threads]:
            with open(f, "rb", buffering=0) as fh:
                while got := fh.readinto(view):
                    n += got
        return n

    with ThreadPoolExecutor(threads) as pool:
        t = time.perf_counter()
        total = sum(pool.map(read, range(threads)))
        return total / (time.perf_counter() - t) / 1e6


def fits(accelerators: int, workers: int, window_bytes: int) -> bool:
    """Whether the batches in flight of ``accelerators`` consumers fit in half the memory
    available now (an estimate: 3 windows a reader without workers, 4 a DataLoader worker)."""
    info = Path("/proc/meminfo").read_text().split()
    available = int(info[info.index("MemAvailable:") + 1]) * 1024
    in_flight = accelerators * (3 if workers == 0 else 4 * workers) * window_bytes
    return in_flight <= available / 2


def bench(store: Path, name: str, work: Path, args: argparse.Namespace) -> list[dict]:
    for f in store_files(store):  # warm the page cache
        with open(f, "rb") as fh:
            while fh.read(READ_BYTES):
                pass
    limits = {t: read_limit(store, t) for t in (1, 2)}
    print(f"  read limit of {name}: {limits[1]:,.0f} MB/s (1 thread), {limits[2]:,.0f} (2)")
    rows = []
    for w in args.workers:
        import shardload

        window_bytes = 3 * _row_bytes(shardload.open_store(store))
        counts = [n for n in args.accelerators if fits(n, w, window_bytes)]
        left = [n for n in args.accelerators if n not in counts]
        if left:
            print(f"  {name}, {w} workers: {left} accelerators left out: would not fit in memory")
        if not counts:
            continue
        out = work / f"bench-{name}-w{w}"
        run_shardload(
            "-q", "bench", "loaders", str(store), "--emulate-compute", str(STEP_S),
            "--batch-size", "1", "--window", "3", "--goal", "0.95", "--workers", str(w),
            "--epochs", str(args.epochs), "--max-batches", str(args.batches),
            "--accelerators", ",".join(map(str, counts)), "--out", str(out),
        )  # fmt: skip
        doc = json.loads((out / "results.json").read_text())
        for r in doc["rows"]:
            rows.append(
                dict(layout=name, limits=limits, load=doc["machine"].get("load_average"), **r)
            )
    return rows


def _row_bytes(store) -> int:
    import numpy as np

    return sum(
        int(np.dtype(a.dtype).itemsize * np.prod(a.shape[1:], dtype=np.int64))
        for a in store.manifest.arrays.values()
    )


def print_table(rows: list[dict]) -> None:
    print(
        "\n| layout | workers | accelerators | AU min | AU mean | MB/s of states served "
        "| batches each | loader CPU s a batch | accelerators a free core feeds "
        "| read limit MB/s (1 / 2 threads) | load average |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        lim = f"{r['limits'][1]:,.0f} / {r['limits'][2]:,.0f}"
        if r["error"]:
            print(f"| {r['layout']} | {r['workers']} | {r['accelerators']} | error: "
                  f"{r['error'][:120]} ||||||| {lim} | {r['load']} |")  # fmt: skip
            continue
        print(
            f"| {r['layout']} | {r['workers']} | {r['accelerators']} | {r['au_min']:.1%} | "
            f"{r['au_mean']:.1%} | {r['bytes_per_s'] / 1e6:,.0f} | "
            f"{r['batches_per_accelerator']} | {r['cpu_s_per_batch']:.3f} | "
            f"{STEP_S / r['cpu_s_per_batch']:.1f} | {lim} | {r['load']} |"
        )
    from shardload.bench.loaders_report import summarize

    for layout in dict.fromkeys(r["layout"] for r in rows):
        for sm in summarize([r for r in rows if r["layout"] == layout], 0.95):
            print(
                f"{layout}, {sm['workers']} workers: {sm['max_accelerators']} accelerators "
                f"kept >= 95% busy {sm['bound']}"
            )


def main() -> None:
    from anemoi_helpers import anemoi_python

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--dates", type=int, default=32, help="6-hourly dates (default 32: 4.2 GB)")
    p.add_argument("--lat", type=int, default=440)
    p.add_argument("--lon", type=int, default=1232)
    p.add_argument("--levels", type=int, default=20, help="3 x levels channels (default 60)")
    p.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=[0, 2])
    p.add_argument(
        "--accelerators", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8]
    )
    p.add_argument(
        "--batches",
        type=int,
        default=12,
        help="batches each accelerator takes, over as many epochs of its shard as it needs "
        "(at most --epochs; default 12)",
    )
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--anemoi-python", type=Path, default=None)
    p.add_argument("--skip-anemoi", action="store_true")
    p.add_argument("--keep-source", action="store_true")
    p.add_argument(
        "--raw",
        action="store_true",
        help="also the shardload layout uncompressed (shardload copy --compression none)",
    )
    p.add_argument("--only", default="", help="comma list of the layouts to bench (default all)")
    p.add_argument(
        "--own",
        choices=("copy", "prepare"),
        default="copy",
        help="shardload's layout by 'shardload copy' of the anemoi store (default; statistics "
        "carried) or by 'prepare' of the netCDF (statistics of 32.5 M features: over 14 GB)",
    )
    args = p.parse_args()
    work = args.workdir
    work.mkdir(parents=True, exist_ok=True)
    stores = {}
    python = args.anemoi_python or anemoi_python()
    problem = "--skip-anemoi" if args.skip_anemoi else anemoi_problem(python)
    own = work / "shardload-store"
    if problem is None:
        if not (work / "anemoi.zarr").exists():
            stores["anemoi"] = create_anemoi(work, make_source(work, args), python, args)
        stores["anemoi"] = work / "anemoi.zarr"
    else:
        print(f"anemoi-built store skipped: {problem}")
    if own.exists():
        stores["shardload"] = own
    elif args.own == "copy" and "anemoi" in stores:
        stores["shardload"] = copy_own(work, stores["anemoi"])
    else:
        stores["shardload"] = prepare_own(work, make_source(work, args), args)
    if args.raw and "anemoi" in stores:
        stores["shardload-raw"] = copy_own(work, stores["anemoi"], name="raw-store", raw=True)
    if args.only:
        stores = {k: v for k, v in stores.items() if k in args.only.split(",")}
    if not args.keep_source and (work / "source").exists():
        shutil.rmtree(work / "source")  # frees the page cache and disk for the stores
    rows = []
    for name, store in stores.items():
        rows += bench(store, name, work, args)
    print_table(rows)


if __name__ == "__main__":
    main()
