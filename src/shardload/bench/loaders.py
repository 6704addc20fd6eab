"""``shardload bench loaders STORE``: how many emulated accelerators can a loader keep busy?

MLPerf Storage's method, on one machine: an *accelerator* is a consumer process with its own
loader over its own rank's disjoint shard of the store (rank ``r`` of ``N``), which "computes"
each batch by sleeping ``--emulate-compute`` seconds. Its utilisation (AU) is compute time
over wall time, measured from its first batch to the end (start-up reported apart). For each
loader and worker count the benchmark runs 1, 2, 4, ... accelerators at once and reports the
largest number that all stay at least ``--goal`` busy (default 90%). ``--window K`` makes each
sample a window of K consecutive states of a dated store, as a forecast model trains. Peers are compared where they are installed
(import probe); the others are named as missing, never estimated.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from shardload.bench.loaders_report import (
    THRESHOLD,
    command_line,
    machine,
    summarize,
    write_report,
)
from shardload.errors import ConfigError

#: peers: name -> (module to probe, pip package, supported here)
PEERS: dict[str, tuple[str, str, bool]] = {
    "zarr-torch-dataset": ("zarrdataset", "zarr-torch-dataset", True),
    "mosaicml-streaming": ("streaming", "mosaicml-streaming", False),
    "litdata": ("litdata", "litdata", False),
}
_CONSUMER = "shardload.bench.loaders_consumer"

HELP = """\
Emulate training on N accelerators the MLPerf-Storage way: N consumer processes,
each with its own loader over a disjoint rank shard of STORE, each sleeping
--emulate-compute seconds per batch. Reports accelerator utilisation (AU = compute
time / wall time, after start-up) and the largest N kept at least --goal busy
(every accelerator; default 0.9), for shardload (StreamingDataset + StreamingDataLoader) and for the
installed peers (zarr-torch-dataset on Zarr stores; MosaicML streaming and litdata
are probed and reported as not covered). Writes DIR/results.json, DIR/report.md
and DIR/au.png.

Sleep costs no CPU, so on a machine with few cores the limit is the loaders' own
CPU and I/O: the answer is "how many accelerators of this speed can this node
feed". Set --emulate-compute to your model's step time per batch.

With --window K on a dated store each sample is a window of K consecutive states
(e.g. 2 input states + 1 rollout target: --window 3); peers have no windows and are
not measured then.

examples:
  shardload bench loaders ~/.shardload/data/processed/era5 --emulate-compute 0.05 \\
      --batch-size 256 --workers 0,2 --accelerators 1,2,4,8 --out bench-loaders
  shardload bench loaders STATES_STORE --emulate-compute 0.571 --batch-size 1 \\
      --window 3 --goal 0.95 --workers 0,2 --accelerators 1,2,4,8
"""


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``shardload bench loaders``."""
    p = kinds.add_parser(
        "loaders",
        help="accelerators kept busy by each loader (MLPerf-Storage style)",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", help="a store (folder, URL or .sqfs image)")
    p.add_argument(
        "--emulate-compute",
        type=float,
        default=0.02,
        metavar="SECONDS",
        help="compute time per batch of one accelerator (default 0.02)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="rows per batch (default 256)")
    p.add_argument(
        "--workers",
        type=_ints,
        default=(0, 2),
        metavar="LIST",
        help="DataLoader workers per accelerator, e.g. 0,2 (default 0,2)",
    )
    p.add_argument(
        "--accelerators",
        type=_ints,
        default=(1, 2, 4, 8),
        metavar="LIST",
        help="accelerator counts to try, ascending; stops after the first that "
        "fails the goal (default 1,2,4,8)",
    )
    p.add_argument(
        "--goal",
        type=float,
        default=THRESHOLD,
        metavar="AU",
        help=f"utilisation every accelerator must reach to count as kept busy, in (0, 1] "
        f"(default {THRESHOLD})",
    )
    p.add_argument(
        "--window",
        type=int,
        default=None,
        metavar="K",
        help="each sample a window of K consecutive states of a dated store (shardload "
        "only; default: one row a sample)",
    )
    p.add_argument(
        "--loaders",
        default="all",
        metavar="LIST",
        help=f"comma list of shardload,{','.join(PEERS)} or 'all' (default: "
        "shardload and every installed peer that can read STORE)",
    )
    p.add_argument("--split", default=None, help="read only this split (default: all rows)")
    p.add_argument(
        "--max-batches",
        type=int,
        default=None,
        metavar="N",
        help="stop each accelerator after N batches (default: one epoch of its shard)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=1,
        metavar="E",
        help="epochs of its shard each accelerator takes (default 1; a small store over many "
        "accelerators gives each too few batches in one)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="output folder (default bench-results/loaders-TIMESTAMP)",
    )
    p.set_defaults(func=run_cli)


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma list of integers: {text!r}") from None
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError(f"need non-negative integers: {text!r}")
    return values


def probe_peers(store_format: str) -> dict[str, str]:
    """Each peer's status: ``"ok"`` or why it is not measured."""
    status = {}
    for name, (module, package, supported) in PEERS.items():
        if importlib.util.find_spec(module) is None:
            status[name] = f"not installed (pip install {package})"
        elif not supported:
            status[name] = "installed; this benchmark has no adapter for it yet"
        elif name == "zarr-torch-dataset" and store_format != "zarr":
            status[name] = f"reads Zarr arrays only; this store is {store_format}"
        else:
            status[name] = "ok"
    return status


# -- running ---------------------------------------------------------------------------------------
def run_point(
    spec: dict[str, Any], accelerators: int, *, timeout_s: float = 3600
) -> dict[str, Any]:
    """Run ``accelerators`` consumers at once; their timings merged into one result row."""
    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    for rank in range(accelerators):
        one = json.dumps({**spec, "rank": rank, "world": accelerators})
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", _CONSUMER, one],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
    row: dict[str, Any] = {k: spec[k] for k in ("loader", "workers", "batch_size", "compute_s")}
    row["accelerators"] = accelerators
    try:
        for p in procs:  # every loader built before any starts
            seen = ""
            while p.stdout is not None:
                line = p.stdout.readline()
                if not line or line.strip() == "ready":
                    break
                seen += line  # something the loader's libraries printed
            if not line:
                return {**row, "error": _failure(p, seen)}
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = []
        deadline = time.monotonic() + timeout_s
        for p in procs:
            out, err = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            lines = [ln for ln in out.splitlines() if ln.startswith("result ")]
            if p.returncode != 0 or not lines:
                return {**row, "error": f"exit {p.returncode}: {err.strip()[-800:]}"}
            results.append(json.loads(lines[-1][len("result ") :]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    aus = [r["au"] for r in results]
    wall = max(r["wall_s"] for r in results)
    total_rows = sum(r["rows"] for r in results)
    return {
        **row,
        "error": None,
        "au_mean": sum(aus) / len(aus),
        "au_min": min(aus),
        "batches_per_accelerator": min(r["batches"] for r in results),
        "samples_per_s": total_rows / wall if wall > 0 else 0.0,
        "first_batch_s_max": max(r["first_batch_s"] for r in results),
        "wait_s_max": max(r["wait_s"] for r in results),
        "wall_s": wall,
        "cpu_s_per_batch": sum(r["cpu_s"] for r in results)
        / max(1, sum(r["batches"] for r in results)),
        "per_accelerator": results,
    }


def _failure(p: subprocess.Popen, line: str) -> str:
    p.kill()
    _, err = p.communicate()
    return f"the consumer did not start: {(line + err).strip()[-800:]}"


def sweep(
    store: str,
    *,
    loaders: Sequence[str],
    workers: Sequence[int],
    accelerators: Sequence[int],
    compute_s: float,
    batch_size: int,
    split: str | None,
    seed: int,
    max_batches: int | None,
    array: str,
    epochs: int = 1,
    goal: float = THRESHOLD,
    window: int | None = None,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Every loader x workers, accelerator counts ascending until the first one whose least
    busy accelerator is under ``goal``."""
    from tqdm import tqdm

    rows: list[dict[str, Any]] = []
    bar = tqdm(
        total=len(loaders) * len(workers) * len(accelerators),
        disable=not progress,
        desc="bench loaders",
        unit="run",
    )
    for loader in loaders:
        for w in workers:
            spec = dict(
                loader=loader,
                workers=w,
                store=store,
                batch_size=batch_size,
                compute_s=compute_s,
                split=split,
                seed=seed,
                max_batches=max_batches,
                array=array,
                window=window,
                epochs=epochs,
            )
            for i, n in enumerate(sorted(accelerators)):
                bar.set_postfix_str(f"{loader} w{w} x{n}")
                row = run_point(spec, n)
                rows.append(row)
                bar.update(1)
                if row["error"] is not None or row["au_min"] < goal:
                    bar.update(len(accelerators) - i - 1)
                    break
    bar.close()
    return rows


def check_args(args: argparse.Namespace) -> None:
    """A ``ConfigError`` naming the first option out of range."""
    if args.emulate_compute < 0 or args.batch_size < 1:
        raise ConfigError("--emulate-compute must be >= 0 and --batch-size >= 1")
    if not args.accelerators or min(args.accelerators) < 1:
        raise ConfigError("--accelerators: counts must be >= 1")
    if not 0 < args.goal <= 1:
        raise ConfigError(f"--goal {args.goal}: a utilisation in (0, 1], e.g. 0.95")
    if args.epochs < 1:
        raise ConfigError(f"--epochs {args.epochs}: need at least 1")
    if args.window is not None and args.window < 1:
        raise ConfigError(f"--window {args.window}: need K >= 1 states a window")


def run_cli(args: argparse.Namespace) -> int:
    from shardload.move.staging import exit_on_sigterm
    from shardload.store.core import open_store

    check_args(args)
    exit_on_sigterm()  # SIGTERM unwinds: run_point's ``finally`` stops the consumers
    store = open_store(args.store)
    fmt = store.manifest.format
    peers = probe_peers(fmt)
    wanted = (
        ["shardload", *PEERS]
        if args.loaders == "all"
        else [s.strip() for s in args.loaders.split(",")]
    )
    unknown = [w for w in wanted if w != "shardload" and w not in PEERS]
    if unknown:
        raise ConfigError(
            f"--loaders: unknown {unknown}; choose from shardload, {', '.join(PEERS)}"
        )
    if args.window is not None:
        peers = {k: v if v != "ok" else "has no windows of dates" for k, v in peers.items()}
    loaders = [w for w in wanted if w == "shardload" or peers[w] == "ok"]
    for w in wanted:
        if w != "shardload" and peers[w] != "ok":
            print(f"not measured: {w}: {peers[w]}", file=sys.stderr)
    first = next(iter(store.manifest.arrays.values()))
    array = f"{store.root}/{first.path}" if store.is_local else ""
    if "zarr-torch-dataset" in loaders and not array:
        loaders.remove("zarr-torch-dataset")
        peers["zarr-torch-dataset"] = "reads local Zarr arrays only; this store is remote"
    row_bytes = sum(_row_bytes(a) for a in store.manifest.arrays.values())
    out = args.out or Path("bench-results") / time.strftime("loaders-%Y%m%d-%H%M%S")
    doc: dict[str, Any] = {
        "command": command_line(args),
        "store": str(args.store),
        "store_format": fmt,
        "store_rows": len(store),
        "row_bytes": row_bytes,
        "batch_size": args.batch_size,
        "compute_s": args.emulate_compute,
        "goal": args.goal,
        "window": args.window,
        "machine": machine(),
        "peers": peers,
    }
    rows = sweep(
        str(args.store),
        loaders=loaders,
        workers=args.workers,
        accelerators=args.accelerators,
        compute_s=args.emulate_compute,
        batch_size=args.batch_size,
        split=args.split,
        seed=args.seed,
        max_batches=args.max_batches,
        array=array,
        epochs=args.epochs,
        goal=args.goal,
        window=args.window,
    )
    for r in rows:  # bytes of the states delivered (a window of K states: K rows each)
        if r["error"] is None:
            r["bytes_per_s"] = r["samples_per_s"] * row_bytes * (args.window or 1)
    doc["load_after"] = (
        [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None
    )
    doc["rows"] = rows
    doc["summary"] = summarize(rows, args.goal)
    write_report(out, doc)
    for s in doc["summary"]:
        print(
            f"{s['loader']:>20} workers={s['workers']}: {s['max_accelerators']} accelerators "
            f">= {args.goal:.0%} busy {s['bound']}"
        )
    print(f"wrote {out}/results.json, report.md, au.png")
    return 0


def _row_bytes(info: Any) -> int:
    import numpy as np

    return int(np.dtype(info.dtype).itemsize * int(np.prod(info.shape[1:], dtype=np.int64)))
