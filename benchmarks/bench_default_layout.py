"""The default store layout, measured: files, shuffle quality and epoch speed of a store that
``prepare`` writes with no layout option (issue 25), against today's default before it.

Stores (under ``--workdir``, kept for a later run; ``--stores`` picks): ``default`` (no layout
key: Zarr v3 shards of small inner chunks, ``plan.default_layout.plan_default_layout``, stored
raw or lz4 as ``compression: auto`` decides: raw for these values, which lz4 shrinks by less than
10%), ``lz4`` (the same layout, ``compression: lz4``: what real fields, which lz4 shrinks by 19% or
more, get by default),
``chunks16`` (``target_chunk_bytes: 16MiB``, one lz4 file per chunk: the Zarr default before),
``npy`` and ``hdf5`` (``format`` only: their defaults). All hold the same values
(``loadbench_data:make``, rows x features float32, rounded so that lz4 has something to
compress).

For each store: its data files and MiB per file on disk; for Zarr the all-core read + decode
limit (every stored chunk read and Blosc-decoded on a pool of one thread per core, the faster
of files read whole or chunk by chunk, best of 3, files in the page cache, and the CPU seconds
it took); then one epoch of the *default* load (``iter_batches(batch_size=B)``, and
``StreamingDataLoader`` with 2 workers), each in a fresh subprocess: decoded GB/s, its ratio to
the limit, CPU seconds (process and workers), peak RSS (process + workers), and the shuffle
quality of its ``"index"`` (``plan.quality``: chunks per batch against a uniform shuffle's,
VIF_pos, VIF_ar, and the recurrence against epoch 1). The epoch's time includes opening the
store, planning and the first group's read (``first batch at``), and for workers starting them,
but not importing torch (done first, as any training program does: about 2 s here); the same
process's second epoch is timed too (the first pays shardload's own imports).

Usage::

    python benchmarks/bench_default_layout.py --workdir /tmp/bdl            # 65,536 x 6.2 KB
    python benchmarks/bench_default_layout.py --workdir /tmp/bdl --stores default,npy,hdf5
    python benchmarks/bench_default_layout.py --workdir /tmp/bdl --stores default --workers 2 \
        --epochs 4     # 4 epochs of one loader (persistent workers): each epoch's fraction
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

GOALS = {"cpb_ratio": 0.9, "vif_pos": 1.5, "vif_ar": 2.0, "recurrence": 1.5}
SPEC = "bench-spec.json"
STORES: dict[str, dict[str, Any]] = {
    "default": {},
    "lz4": {"compression": "lz4"},
    "chunks16": {"target_chunk_bytes": "16MiB"},
    "npy": {"format": "npy"},
    "hdf5": {"format": "hdf5"},
}


def build(work: Path, name: str, *, rows: int, features: int) -> Path:
    """Prepare store ``name`` (options ``STORES[name]``) unless an equal one is there."""
    from loadbench_data import _placeholder_source

    import shardload

    out = work / name
    spec = {"rows": rows, "features": features, **STORES[name]}
    if (out / SPEC).exists() and json.loads((out / SPEC).read_text()) == spec:
        return out
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    t = time.perf_counter()
    view = {"rows": rows, "features": features, "chunk_rows": 4096}
    prepare(
        {
            "source": {"paths": [str(_placeholder_source(work))]},
            "view": {"name": "function", "function": "loadbench_data:make", "kwargs": view},
            "out": str(out),
            "overwrite": True,
            **STORES[name],
        }
    )
    print(f"prepared {out} in {time.perf_counter() - t:.1f} s", flush=True)
    (out / SPEC).write_text(json.dumps(spec))
    return out


def data_files(store: Path) -> list[Path]:
    """The stored objects of array ``x``: Zarr shard or chunk files, npy chunk files, or the
    one HDF5 file."""
    if (store / "data.h5").exists():
        return [store / "data.h5"]
    if (store / "x" / "c").is_dir():
        return sorted(p for p in (store / "x" / "c").rglob("*") if p.is_file())
    return sorted((store / "x").glob("*.npy"))


def _index(path: Path, per_shard: int | None, size: int) -> list[tuple[int, int]]:
    """(offset, nbytes) of each stored chunk of a file: itself, or a shard's inner chunks
    (index at the end: ``per_shard`` uint64 pairs and a crc32c; empty entries skipped)."""
    if not per_shard:
        return [(0, size)]
    with open(path, "rb", buffering=0) as f:
        f.seek(size - 16 * per_shard - 4)
        raw = f.read(16 * per_shard)
    pairs = np.frombuffer(raw, "<u8").reshape(-1, 2).tolist()
    return [(o, n) for o, n in pairs if o != 2**64 - 1]


def read_decode_limit(store: Path, *, repeats: int = 3) -> dict[str, Any]:
    """Decoded bytes/s of reading and Blosc-decoding every stored chunk of the store on a pool of
    one thread per core, each thread a file at a time, the faster of two ways: each file read
    whole, then its chunks decoded; or each chunk read on its own (``os.pread`` into a reused
    buffer, offsets from the shard index) and decoded. Best of ``repeats``; also the CPU
    seconds the winner spent (all threads)."""
    import numcodecs.blosc as blosc

    m = json.loads((store / "shardload.json").read_text())
    per_shard = m["options"].get("shard_chunks")
    from shardload.formats.base import array_compression

    raw = array_compression(m["options"], "x") == "none"  # read, not decoded
    x = m["arrays"]["x"]
    row_bytes = int(np.prod(x["shape"][1:])) * np.dtype(x["dtype"]).itemsize
    chunk_bytes = int(x["chunk_rows"]) * row_bytes
    files = data_files(store)
    where = {p: _index(p, per_shard, p.stat().st_size) for p in files}
    threads = os.cpu_count() or 1
    local = threading.local()

    def out() -> np.ndarray:
        if getattr(local, "out", None) is None:
            local.out = np.empty(chunk_bytes, np.uint8)
            local.raw = np.empty(max(n for parts in where.values() for _, n in parts), np.uint8)
        return local.out

    def whole(p: Path) -> None:
        o = out()
        with open(p, "rb", buffering=0) as f:
            blob = memoryview(f.read())
        for off, n in where[p]:
            if not raw:
                blosc.decompress(blob[off : off + n], o)

    def each(p: Path) -> None:
        o = out()
        fd = os.open(p, os.O_RDONLY)
        try:
            for off, n in where[p]:
                buf = local.raw[:n]
                os.preadv(fd, [buf], off)
                if not raw:
                    blosc.decompress(buf, o)
        finally:
            os.close(fd)

    rates: dict[str, tuple[float, float]] = {}
    with ThreadPoolExecutor(threads) as pool:
        for label, fn in (("files read whole", whole), ("chunks read one by one", each)):
            best, cpu = float("inf"), 0.0
            for _ in range(repeats):
                t, c = time.perf_counter(), time.process_time()
                list(pool.map(fn, files))
                if time.perf_counter() - t < best:
                    best, cpu = time.perf_counter() - t, time.process_time() - c
            rates[label] = (best, cpu)
    decoded = int(m["chunk_bounds"][-1]) * row_bytes
    label = min(rates, key=lambda k: rates[k][0])
    return {
        "limit_Bps": decoded / rates[label][0],
        "limit_way": label,
        "limit_cpu_s": rates[label][1],
        "limit_threads": threads,
    }


def _cpu_s() -> float:
    """CPU seconds of this process and its waited-for children (DataLoader workers, once shut
    down)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def run_case(store: Path, workers: int, batch_size: int, seed: int) -> dict[str, Any]:
    """Epoch 0 of the default load timed with its CPU and memory, epoch 1 timed: rates,
    memory, quality."""
    from loadbench_cases import PeakRSS, _vm_hwm_bytes, build_shardload

    from shardload.plan.quality import quality

    loader = "shardload-sdl" if workers else "shardload-iter"
    m = json.loads((store / "shardload.json").read_text())
    bounds = np.asarray(m["chunk_bounds"], np.int64)
    x = m["arrays"]["x"]
    row_bytes = int(np.prod(x["shape"][1:])) * np.dtype(x["dtype"]).itemsize
    epochs: list[list[np.ndarray]] = []
    torch_s = 0.0
    if workers:  # a training program imports torch before its first epoch: not the loader's
        torch_s = time.perf_counter()
        import torch  # noqa: F401

        torch_s = time.perf_counter() - torch_s
    firsts: list[float] = []

    def one_epoch(epoch: int) -> float:
        t = time.perf_counter()
        batches, index_of, _ = build_shardload(store, loader, workers, batch_size, seed, epoch)
        got = []
        for b in batches:
            got.append(np.asarray(index_of(b), np.int64).copy())
            if len(got) == 1:
                firsts.append(time.perf_counter() - t)
        epochs.append(got)
        return time.perf_counter() - t

    with PeakRSS() as mem:
        c = _cpu_s()
        seconds = one_epoch(0)
        mem.peak = max(mem.peak, mem.now())
        gc.collect()  # the workers shut down and are waited for: their CPU time counts
        cpu = _cpu_s() - c
    rows = sum(len(i) for i in epochs[0])
    seconds2 = one_epoch(1)  # the same process's second epoch (timed; RSS and CPU not counted)
    chunk_of = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    q = quality(epochs, chunk_of)
    return {
        "workers": workers,
        "rows": rows,
        "complete": bool(np.array_equal(np.sort(np.concatenate(epochs[0])), np.arange(rows))),
        "seconds": seconds,
        "cpu_s": cpu,
        "Bps": rows * row_bytes / seconds,
        "first_batch_s": firsts[0],
        "epoch2_Bps": rows * row_bytes / seconds2,
        "epoch2_first_batch_s": firsts[1],
        "torch_import_s": torch_s,
        "peak_rss_MiB": max(mem.peak, _vm_hwm_bytes()) / 2**20,
        **{k: float(v) for k, v in q.items()},
    }


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of live process ``pid`` so far (``/proc/PID/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_epochs(store: Path, workers: int, batch_size: int, seed: int, epochs: int) -> dict:
    """``epochs`` epochs of ONE default load (``StreamingDataLoader`` with its defaults:
    persistent workers, so epoch 1 on is the steady state a training run spends its time in;
    or ``iter_batches`` in the process), each timed with its CPU seconds (this process, and the
    live workers read from ``/proc``); peak RSS (process + workers) over all of them."""
    from loadbench_cases import PeakRSS, _vm_hwm_bytes, build_shardload

    from shardload.plan.quality import quality

    loader = "shardload-sdl" if workers else "shardload-iter"
    m = json.loads((store / "shardload.json").read_text())
    bounds = np.asarray(m["chunk_bounds"], np.int64)
    x = m["arrays"]["x"]
    row_bytes = int(np.prod(x["shape"][1:])) * np.dtype(x["dtype"]).itemsize
    if workers:  # a training program imports torch before its first epoch: not the loader's
        import torch  # noqa: F401
    got_epochs: list[list[np.ndarray]] = []
    per: list[dict[str, float]] = []
    dl: Any = None
    with PeakRSS() as mem:
        for e in range(epochs):
            t, own = time.perf_counter(), time.process_time()
            if dl is None or not workers:
                dl, index_of, _ = build_shardload(store, loader, workers, batch_size, seed, e)
            else:
                dl.dataset.set_epoch(e)
            pids = pids_of(dl) if workers and e else []  # persistent: the same workers
            wcpu0 = sum(_proc_cpu_s(p) for p in pids)
            got, first = [], 0.0
            for b in dl:
                got.append(np.asarray(index_of(b), np.int64).copy())
                if len(got) == 1:
                    first = time.perf_counter() - t
                    pids = pids or pids_of(dl)
            seconds = time.perf_counter() - t
            main_cpu = time.process_time() - own
            wcpu = sum(_proc_cpu_s(p) for p in pids) - wcpu0 if workers else 0.0
            got_epochs.append(got)
            rows = sum(len(i) for i in got)
            per.append(
                {
                    "seconds": seconds,
                    "Bps": rows * row_bytes / seconds,
                    "first_batch_s": first,
                    "main_cpu_s": main_cpu,
                    "workers_cpu_s": wcpu,
                    "rows": rows,
                }
            )
        mem.peak = max(mem.peak, mem.now())
    del dl
    gc.collect()
    chunk_of = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    q = quality(got_epochs, chunk_of)
    rows = per[0]["rows"]
    return {
        "workers": workers,
        "rows": rows,
        "complete": bool(np.array_equal(np.sort(np.concatenate(got_epochs[0])), np.arange(rows))),
        "epochs": per,
        "peak_rss_MiB": max(mem.peak, _vm_hwm_bytes()) / 2**20,
        **{k: float(v) for k, v in q.items()},
    }


def pids_of(dl: Any) -> list[int]:
    """The process ids of a DataLoader's live workers (none in the process)."""
    it = getattr(dl, "_iterator", None)
    return [w.pid for w in getattr(it, "_workers", [])]


def describe(store: Path) -> dict[str, Any]:
    from shardload.formats.base import array_compression

    m = json.loads((store / "shardload.json").read_text())
    files = data_files(store)
    nbytes = sum(p.stat().st_size for p in files)
    return {
        "files": len(files),
        "MiB_per_file": nbytes / len(files) / 2**20,
        "inner_chunks": len(m["chunk_bounds"]) - 1,
        "chunk_rows": m["arrays"]["x"]["chunk_rows"],
        "shard_chunks": m["options"].get("shard_chunks"),
        "compression": array_compression(m["options"], "x"),
    }


def _ok(q: dict[str, Any]) -> str:
    bad = [
        k
        for k, ok in (
            ("chunks/batch", q["chunks_per_batch_ratio"] >= GOALS["cpb_ratio"]),
            ("VIF_pos", q["vif_pos"] <= GOALS["vif_pos"]),
            ("VIF_ar", q["vif_ar"] <= GOALS["vif_ar"]),
            ("recurrence", q["recurrence"] <= GOALS["recurrence"]),
        )
        if not ok
    ]
    return "meets the quality goals" if not bad else "misses: " + ", ".join(bad)


def store_arguments(doc: str | None) -> argparse.ArgumentParser:
    """The options of the store and the load, shared with bench_default_url.py."""
    ap = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", default="bench-results/default-layout")
    ap.add_argument("--rows", type=int, default=65_536)
    ap.add_argument("--features", type=int, default=1550, help="float32 per row (6.2 KB)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    return ap


def print_epochs(what: str, rec: dict[str, Any] | None, case: dict[str, Any]) -> None:
    """One line per epoch of one loader: GB/s, fraction of the limit, CPU s."""
    print(
        f"  {what}, one loader, {len(case['epochs'])} epochs: peak RSS "
        f"{case['peak_rss_MiB']:.0f} MiB; chunks per batch ratio "
        f"{case['chunks_per_batch_ratio']:.2f}x uniform, recurrence {case['recurrence']:.2f}: "
        f"{_ok(case)}; complete epoch: {case['complete']}",
        flush=True,
    )
    for i, ep in enumerate(case["epochs"]):
        frac = f" = {ep['Bps'] / rec['limit_Bps']:.2f} of the limit" if rec else ""
        print(
            f"    epoch {i}: {ep['seconds']:.2f} s, {ep['Bps'] / 1e9:.2f} GB/s{frac}; CPU s: "
            f"main {ep['main_cpu_s']:.2f}, workers {ep['workers_cpu_s']:.2f}; first batch at "
            f"{ep['first_batch_s']:.2f} s",
            flush=True,
        )


def main(argv: list[str] | None = None) -> None:
    ap = store_arguments(__doc__)
    ap.add_argument("--workers", default="0,2", help="DataLoader workers per case (0: in-process)")
    ap.add_argument(
        "--stores",
        default="default,chunks16",
        help=f"which stores, of {list(STORES)} (chunks16: the Zarr default before)",
    )
    ap.add_argument(
        "--epochs",
        type=int,
        default=0,
        help="N >= 1: N epochs of one loader per case (workers: persistent, the default), "
        "each epoch's fraction of the limit and CPU s; 0: a fresh loader's epoch (and another)",
    )
    ap.add_argument("--out", default=None, help="also write the records here (JSON)")
    ap.add_argument("--case", nargs=2, metavar=("STORE", "WORKERS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:  # a subprocess: one case, one JSON line
        store, w = Path(args.case[0]), int(args.case[1])
        rec = (
            run_epochs(store, w, args.batch_size, args.seed, args.epochs)
            if args.epochs
            else run_case(store, w, args.batch_size, args.seed)
        )
        print(json.dumps(rec))
        return
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    names = args.stores.split(",")
    print(
        f"{args.rows:,} rows x {args.features} float32 ({args.features * 4:,} B), batch "
        f"{args.batch_size}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    records = []
    for name in names:
        store = build(work, name, rows=args.rows, features=args.features)
        for p in data_files(store):  # into the page cache
            p.read_bytes()
        zarr = (store / "x" / "c").is_dir()
        rec = {"store": name, **describe(store), **(read_decode_limit(store) if zarr else {})}
        limit = (
            f"read + decode limit {rec['limit_Bps'] / 1e9:.2f} GB/s ({rec['limit_threads']} "
            f"threads, {rec['limit_way']}, {rec['limit_cpu_s']:.2f} CPU s)"
            if zarr
            else "no read + decode limit measured (not Zarr)"
        )
        print(
            f"\n{name}: {rec['files']} files, {rec['MiB_per_file']:.1f} MiB per file, "
            f"{rec['inner_chunks']} chunks of {rec['chunk_rows']} rows"
            + (f" ({rec['shard_chunks']} to a shard)" if rec["shard_chunks"] else "")
            + f", {rec['compression']}; {limit}",
            flush=True,
        )
        for w in [int(v) for v in args.workers.split(",")]:
            cmd = [sys.executable, __file__, "--case", str(store), str(w)]
            cmd += ["--batch-size", str(args.batch_size), "--seed", str(args.seed)]
            cmd += ["--epochs", str(args.epochs)]
            got = subprocess.run(cmd, check=True, capture_output=True, text=True)
            case = json.loads(got.stdout.strip().splitlines()[-1])
            records.append({**rec, **case})
            what = "in-process" if w == 0 else f"StreamingDataLoader, {w} workers"
            if args.epochs:
                print_epochs(what, rec if zarr else None, case)
                continue
            ratio = (
                f" = {case['Bps'] / rec['limit_Bps']:.2f} of the limit ({case['cpu_s']:.2f} CPU "
                f"s: {case['cpu_s'] / rec['limit_cpu_s']:.1f}x the limit's)"
                if zarr
                else f" ({case['cpu_s']:.2f} CPU s)"
            )
            print(
                f"  {what}: {case['Bps'] / 1e9:.2f} GB/s{ratio}, peak RSS "
                f"{case['peak_rss_MiB']:.0f} MiB; chunks per batch "
                f"{case['chunks_per_batch']:.1f} (uniform {case['chunks_per_batch_uniform']:.1f}"
                f", {case['chunks_per_batch_ratio']:.2f}x), VIF_pos {case['vif_pos']:.2f}, "
                f"VIF_ar {case['vif_ar']:.2f}, recurrence {case['recurrence']:.2f}: "
                f"{_ok(case)}; complete epoch: {case['complete']}",
                flush=True,
            )
            torch_s = f"; torch imported first in {case['torch_import_s']:.2f} s" if w else ""
            print(
                f"    first batch at {case['first_batch_s']:.2f} s; the same process's second "
                f"epoch {case['epoch2_Bps'] / 1e9:.2f} GB/s"
                + (f" = {case['epoch2_Bps'] / rec['limit_Bps']:.2f} of the limit" if zarr else "")
                + f" (first batch at {case['epoch2_first_batch_s']:.2f} s){torch_s}",
                flush=True,
            )
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
