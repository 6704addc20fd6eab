"""The node cache (issue 28): its goals measured in one run, on one store served over loopback.

One store made by ``shardload.prepare`` from generated data (default 200 MB, 2 MB chunks; npy,
uncompressed, or ``--format zarr`` and ``--compression``: the default Zarr store is ``lz4``),
served by ``shardload serve`` in a subprocess on 127.0.0.1; every epoch is one full shuffled
epoch of ``iter_batches`` (batch 256, groups of ``--shuffle-chunks`` chunks), in this process:

  direct         ``open_store(url)``, no cache: the remote reading the fill is compared with
  fill (e1)      ``open_store(url, cache_dir=fresh)``, epoch 1 (downloads, checks, fills)
  cached (e2)    the same folder, epoch 2, a fresh handle (as a new DataLoader worker)
  local          the store opened from its folder: the local read limit of this loader
  50% x 3        ``cache_bytes`` = half the store, epochs 1-3, evictions from the plan (Belady)
                 and, the same again, least recently used (the plan hook switched off)

``--warm-pairs N`` measures only epoch 2 against the local folder: the cache filled once, then
N pairs (cached, local), each epoch with a fresh handle and the order alternating pair by pair;
it prints each pair's ratios (rows/s and CPU) and their medians. ``--fresh-processes`` runs each
of those epochs in a new Python process (as a DataLoader worker without ``persistent_workers``,
which starts with nothing its predecessors trusted or mapped), timing the store's opening and
its epoch (a local store imports its codecs when opened, one by URL at its first batch).

Goals: fill >= 0.9 x direct; cached >= 0.9 x local, with no download (the cache's counters: every
read of a store opened with ``cache_dir`` goes through it); at 50%, hits >= 1.5 x LRU's, where
hits = file reads the plan makes (segments x arrays) - downloads. The page cache is warm (the
store, and the cache, were just written): this measures the software path, not the disk.

Usage::

    python benchmarks/bench_cache.py                   # 200 MB, cache under the work folder
    python benchmarks/bench_cache.py --size-mb 400 --cache-root /dev/shm
    python benchmarks/bench_cache.py --format zarr --compression lz4 --cache-root /dev/shm
    python benchmarks/bench_cache.py --format zarr --compression lz4 --warm-pairs 12
    python benchmarks/bench_cache.py --format zarr --compression lz4 --warm-pairs 8 --fresh-processes
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_move import Server, make_store, store_bytes

import shardload
import shardload.load.batches as batches
from shardload.load.spec import LoadSpec
from shardload.plan.cache_plan import plan_node_reads


def minor_faults() -> int:
    """This process's minor page faults so far (a mapping's, a new buffer's)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def epoch(store, *, epoch_no: int, args: argparse.Namespace) -> dict[str, float]:
    t0, c0, f0 = time.perf_counter(), time.process_time(), minor_faults()
    rows = nbytes = 0
    for b in shardload.iter_batches(
        store,
        batch_size=args.batch_size,
        seed=0,
        epoch=epoch_no,
        shuffle_chunks=args.shuffle_chunks,
    ):
        rows += len(b["index"])
        nbytes += sum(v.nbytes for k, v in b.items() if k != "index")
    s, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "seconds": s,
        "cpu_s": cpu,  # this process's CPU, all threads: steadier than wall time under load
        "minor_faults": minor_faults() - f0,
        "rows": rows,
        "MB_per_s": nbytes / s / 1e6,
        "rows_per_s": rows / s,
    }


def downloads(store) -> int:
    stats = store.fs.node_cache.stats
    return int(stats["fills"] + stats["bypassed"])


def file_reads(path: Path, args: argparse.Namespace, epochs: int) -> int:
    """File reads the plan makes over ``epochs`` (one file per chunk and array: npy, Zarr
    without shards)."""
    spec = LoadSpec.build(path, batch_size=args.batch_size, shuffle_chunks=args.shuffle_chunks)
    plans = [spec.plan(world_size=1, num_workers=1, epoch=e) for e in range(epochs)]
    return len(plan_node_reads(plans, [0]).chunk) * len(spec.selection.arrays)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--size-mb", type=int, default=200)
    ap.add_argument("--chunk-mb", type=float, default=2.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--shuffle-chunks", type=int, default=4)
    ap.add_argument("--format", default="npy", choices=["npy", "zarr"])
    ap.add_argument("--compression", default="none", help="none, lz4, zstd (Zarr only)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the timed epochs (median)")
    ap.add_argument("--cache-root", default=None, help="where the cache folders go (/dev/shm...)")
    ap.add_argument("--out", default="bench-results")
    ap.add_argument("--warm-pairs", type=int, default=0, help="only epoch 2 against local")
    ap.add_argument("--fresh-processes", action="store_true", help="each warm pair's epoch alone")
    ap.add_argument("--run-epoch", nargs=3, help=argparse.SUPPRESS)  # WHERE CACHE_DIR EPOCH
    args = ap.parse_args()
    if args.run_epoch:  # the store's opening counted too: a local store imports its codecs
        where, cache_dir, no = args.run_epoch  # there, one by URL at its first batch
        t0, c0, f0 = time.perf_counter(), time.process_time(), minor_faults()
        st = shardload.open_store(where, **({"cache_dir": cache_dir} if cache_dir else {}))
        r = epoch(st, epoch_no=int(no), args=args)
        s, cpu = time.perf_counter() - t0, time.process_time() - c0
        r.update(seconds=s, cpu_s=cpu, rows_per_s=r["rows"] / s, minor_faults=minor_faults() - f0)
        if cache_dir:
            assert downloads(st) == 0, "epoch 2 fetched data"
        print(json.dumps(r))
        return
    work = Path(tempfile.mkdtemp(prefix="bench-cache-"))
    croot = Path(tempfile.mkdtemp(prefix="bench-cache-", dir=args.cache_root))
    try:
        (warm_pairs if args.warm_pairs else measure)(args, work, croot)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(croot, ignore_errors=True)


def warm_pairs(args: argparse.Namespace, work: Path, croot: Path) -> None:
    """Epoch 2 from a full cache against the local folder, in alternating pairs."""
    path = make_store(work, args.size_mb, args.format, args.compression, args.chunk_mb)
    print(f"store: {store_bytes(path) / 1e6:.0f} MB, {args.format} ({args.compression}); {croot}")
    epoch(shardload.open_store(path), epoch_no=5, args=args)  # first-use costs, page cache
    server = Server(work / "served")
    url = server.url + "bench"
    try:
        epoch(shardload.open_store(url, cache_dir=croot / "full"), epoch_no=0, args=args)
        speed, cpu, faults = [], [], []
        for i in range(args.warm_pairs):
            got = {}
            for kind in ("cached", "local")[:: 1 if i % 2 == 0 else -1]:
                if args.fresh_processes:
                    got[kind] = epoch_alone(args, kind, url, path, croot / "full", 1 + i % 3)
                    continue
                st = (
                    shardload.open_store(url, cache_dir=croot / "full")
                    if kind == "cached"
                    else None
                )
                r = epoch(st or shardload.open_store(path), epoch_no=1 + i % 3, args=args)
                if st is not None:
                    assert downloads(st) == 0, "epoch 2 fetched data"
                got[kind] = r
            speed.append(got["cached"]["rows_per_s"] / got["local"]["rows_per_s"])
            cpu.append(got["cached"]["cpu_s"] / got["local"]["cpu_s"])
            faults.append((got["cached"]["minor_faults"], got["local"]["minor_faults"]))
            print(
                f"  pair {i + 1}: cached {got['cached']['cpu_s']:.3f} CPU s, local "
                f"{got['local']['cpu_s']:.3f}; rows/s cached/local {speed[-1]:.2f}; minor page "
                f"faults cached {faults[-1][0]}, local {faults[-1][1]}",
                flush=True,
            )
    finally:
        server.stop()
    med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
    print(f"cached/local rows/s, median of {len(speed)} pairs: {med(speed):.2f}")
    print(f"cached/local CPU s, median: {med(cpu):.2f} (local/cached: {1 / med(cpu):.2f})")
    print(
        f"minor page faults per epoch, medians: cached {med([f[0] for f in faults])}, "
        f"local {med([f[1] for f in faults])}"
    )


def epoch_alone(
    args: argparse.Namespace, kind: str, url: str, path: Path, cache_dir: Path, no: int
) -> dict[str, float]:
    """One epoch in a new Python process (its figures: opening the store and the epoch)."""
    where, cdir = (url, str(cache_dir)) if kind == "cached" else (str(path), "")
    cmd = [sys.executable, __file__, "--run-epoch", where, cdir, str(no)]
    cmd += ["--batch-size", str(args.batch_size), "--shuffle-chunks", str(args.shuffle_chunks)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.splitlines()[-1]))


def measure(args: argparse.Namespace, work: Path, croot: Path) -> None:
    path = make_store(work, args.size_mb, args.format, args.compression, args.chunk_mb)
    size = store_bytes(path)
    print(
        f"store: {size / 1e6:.0f} MB, {args.format} ({args.compression}), {args.chunk_mb} MB "
        f"chunks; cache in {croot}"
    )
    res: dict[str, dict] = {}

    def show(name: str, r: dict) -> dict:
        extra = f"  downloads {r['downloads']}" if "downloads" in r else ""
        print(
            f"  {name:<14} {r['seconds']:7.2f} s {r['MB_per_s']:8.1f} MB/s "
            f"{r['cpu_s']:6.2f} CPU s{extra}",
            flush=True,
        )
        return r

    warm = shardload.open_store(path)
    epoch(warm, epoch_no=5, args=args)  # imports, first-use costs and the page cache
    server = Server(work / "served")
    url = server.url + "bench"
    try:
        shardload.open_store(url).read("x", 0, 1000)  # the HTTP client's first-use costs
        rounds: dict[str, list[dict]] = {}
        for i in range(args.rounds):  # interleaved: a load spike hits every measurement alike
            print(f" round {i + 1}/{args.rounds}")
            rounds.setdefault("direct", []).append(
                show("direct", epoch(shardload.open_store(url), epoch_no=0, args=args))
            )
            shutil.rmtree(croot / "full", ignore_errors=True)
            filled = shardload.open_store(url, cache_dir=croot / "full")
            r = epoch(filled, epoch_no=0, args=args)
            rounds.setdefault("fill (e1)", []).append(
                show("fill (e1)", {**r, "downloads": downloads(filled)})
            )
            again = shardload.open_store(url, cache_dir=croot / "full")
            r = epoch(again, epoch_no=1, args=args)
            rounds.setdefault("cached (e2)", []).append(
                show("cached (e2)", {**r, "downloads": downloads(again)})
            )
            local = epoch(shardload.open_store(path), epoch_no=1, args=args)
            rounds.setdefault("local", []).append(show("local", local))
        for name, rs in rounds.items():  # the median round of each
            res[name] = sorted(rs, key=lambda r: r["rows_per_s"])[len(rs) // 2]
            res[name]["rounds_rows_per_s"] = [round(r["rows_per_s"]) for r in rs]
            res[name]["median_cpu_s"] = sorted(r["cpu_s"] for r in rs)[len(rs) // 2]
            res[name]["downloads"] = max(r.get("downloads", 0) for r in rs)
        half = size // 2
        reads = file_reads(path, args, 3)
        for policy in ("belady", "lru"):
            if policy == "lru":
                batches.plan_node_cache = lambda *a, **k: None  # type: ignore[assignment]
            got, t0 = 0, time.perf_counter()
            for e in range(3):
                st = shardload.open_store(url, cache_dir=croot / policy, cache_bytes=half)
                epoch(st, epoch_no=e, args=args)
                got += downloads(st)
            res[f"50% {policy}"] = {
                "seconds": time.perf_counter() - t0,
                "downloads": got,
                "reads": reads,
                "hits": reads - got,
            }
            print(f"  50% x 3 {policy:<6} {reads} file reads, {got} downloads, {reads - got} hits")
    finally:
        server.stop()

    fill = res["fill (e1)"]["rows_per_s"] / res["direct"]["rows_per_s"]
    cached = res["cached (e2)"]["rows_per_s"] / res["local"]["rows_per_s"]
    lru_hits = max(1, res["50% lru"]["hits"])
    hits = res["50% belady"]["hits"] / lru_hits
    goals = {
        "fill_vs_direct": fill,
        "cached_vs_local": cached,
        "cached_downloads": res["cached (e2)"]["downloads"],
        "hits_vs_lru": hits,
    }
    print("\nmedians of the rounds:")
    print(f"fill (e1) / direct:      {fill:.2f}  (goal >= 0.9)")
    print(
        f"cached (e2) / local:     {cached:.2f}  (goal >= 0.9), downloads in e2: "
        f"{goals['cached_downloads']} (goal 0)"
    )
    per_round = [
        round(f["rows_per_s"] / d["rows_per_s"], 2)
        for f, d in zip(rounds["fill (e1)"], rounds["direct"], strict=True)
    ]
    print(f"  fill / direct per round: {per_round}")
    per_round = [
        round(c["rows_per_s"] / d["rows_per_s"], 2)
        for c, d in zip(rounds["cached (e2)"], rounds["local"], strict=True)
    ]
    print(f"  cached / local per round: {per_round}")
    cpu = {k: round(res[k]["median_cpu_s"], 2) for k in rounds}
    print(f"CPU s per epoch (medians): {cpu}")
    print(f"hits at 50%, plan / LRU: {hits:.2f}  (goal >= 1.5)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dest = out / f"cache-{time.strftime('%Y%m%d-%H%M%S')}.json"
    report = {
        "benchmark": "bench_cache",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "cpus": os.cpu_count(),
        "store_bytes": size,
        "args": vars(args),
        "results": res,
        "goals": goals,
    }
    dest.write_text(json.dumps(report, indent=2))
    print(f"results: {dest}")


if __name__ == "__main__":
    main()
