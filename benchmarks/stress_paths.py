"""Randomized equivalence stress over every read path (tests/_paths.py), for hours.

Draws a case per seed (store: rows, shapes, dtypes, format, compression, chunks; reads:
batch size, shuffle, drop_last, mode, world, epoch), prepares it and reads it in-process with
0-2 simulated workers, by URL (``shardload serve`` on loopback), through a node cache, through
``StreamingDataLoader`` (0, 1, 2 workers, fork; spawn every ``--spawn-every`` cases) over two
epochs with persistent workers, ``MapDataset``, resumed mid-epoch, and an epoch left early
followed by a full one on the same loader; every epoch's rows,
values, order and held batches are checked. Failures are written (case, traceback) to
``--log`` and the run goes on. Optional CPU pressure: ``--busy N`` busy-loop processes.

    PYTHONPATH=src:tests python benchmarks/stress_paths.py --seeds 0:200 --log /tmp/stress.log
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

import _paths as P
import _paths_groups as G
import _paths_more as M
import _paths_run as R


def _busy() -> None:  # pragma: no cover - a CPU hog
    while True:
        pass


def one(seed: int, root: Path, url: str, *, spawn: bool, max_rows: int) -> P.Report:
    case = P.random_case(seed, max_rows=max_rows)
    torch_workers: list[tuple[int, str | None, bool]] = [
        (0, None, True),
        (1, "fork", False),  # new workers each epoch: they reclaim dead workers' ring slots
        (2, "fork", True),
    ]
    if seed % 3 == 0:
        torch_workers.append((4, "fork", seed % 2 == 0))  # more workers than the ring is sized for
    if spawn:
        torch_workers.append((2, "spawn", True))
    folder = root / f"s{seed}"
    report = R.run_case(
        case,
        folder,
        url=url + f"s{seed}/",
        cache_dir=folder / "cache",
        cache_bytes=case.rows * 16,  # a fraction of the store: the cache evicts
        torch_workers=torch_workers,
        map_dataset=case.rows <= 2000,
        torch_epochs=2,
    )
    n = R.check_torch_resume(case, folder, 2, "fork", k=3)
    # an epoch left early, the next one on the same loader (new workers half the time)
    n += R.check_torch_break(case, folder, 2, "fork", k=1 + seed % 4, persistent=seed % 2 == 0)
    report.batches += n
    return report


def more(seed: int, root: Path, url: str, *, spawn: bool) -> P.Report:
    """The cases beyond plain arrays (tests/_paths_more.py): a dated store read by windows
    (missing dates, ``window_views``), a ragged store, read groups, and an elastic resume
    chained over three world shapes."""
    import numpy as np

    report = P.Report()
    folder = root / f"m{seed}"
    ctx = ("fork", "spawn") if spawn else ("fork",)
    report.epochs += M.check_dated(
        M.random_dated(seed), folder / "d", url=f"{url}m{seed}/d/", contexts=ctx
    )
    report.epochs += M.check_ragged(seed, folder / "g", url=f"{url}m{seed}/g/", contexts=ctx)
    report.epochs += G.check_read_groups(seed, folder / "rg", url=f"{url}m{seed}/rg/")
    rng = np.random.default_rng(seed + 10**6)
    case = P.random_case(seed, max_rows=2000)
    then = (int(rng.choice([1, 2, 3])), int(rng.choice([0, 2])), float(rng.choice([0.3, 0.7])))
    report.epochs += G.check_elastic(
        case,
        folder / "e",
        int(rng.choice([1, 2, 3, 4])),
        int(rng.choice([0, 1, 2])),
        float(rng.choice([0.1, 0.5, 0.9])),
        then=then,
        url=f"{url}m{seed}/e/",
    )
    report.batches = M.COUNT["batches"]
    report.held_checked = M.COUNT["held"]
    M.COUNT["batches"] = M.COUNT["held"] = 0
    return report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", default="0:100", help="START:STOP")
    ap.add_argument("--log", default="stress_paths.log")
    ap.add_argument("--busy", type=int, default=0, help="busy-loop processes meanwhile")
    ap.add_argument("--spawn-every", type=int, default=10)
    ap.add_argument("--max-rows", type=int, default=5000)
    ap.add_argument("--more", action="store_true", help="dated, ragged, groups, elastic only")
    ap.add_argument("--until", type=float, default=0, help="stop starting cases after (epoch s)")
    args = ap.parse_args()
    start, stop = (int(v) for v in args.seeds.split(":"))
    hogs = [mp.get_context("fork").Process(target=_busy, daemon=True) for _ in range(args.busy)]
    for h in hogs:
        h.start()
    totals = {"cases": 0, "failed": 0, "epochs": 0, "batches": 0, "held_checked": 0}
    try:
        with tempfile.TemporaryDirectory(prefix="stress-paths-") as tmp, R.served(Path(tmp)) as url:
            for seed in range(start, stop):
                if args.until and time.time() > args.until:
                    break
                spawn = args.spawn_every > 0 and seed % args.spawn_every == 0
                try:
                    if args.more:
                        r = more(seed, Path(tmp), url, spawn=spawn)
                    else:
                        r = one(seed, Path(tmp), url, spawn=spawn, max_rows=args.max_rows)
                    totals["epochs"] += r.epochs
                    totals["batches"] += r.batches
                    totals["held_checked"] += r.held_checked
                    status = "ok"
                except Exception:
                    totals["failed"] += 1
                    status = "FAIL"
                    with open(args.log, "a") as f:
                        case = asdict(P.random_case(seed, max_rows=args.max_rows))
                        if args.more:
                            case = {"more": True, "dated": asdict(M.random_dated(seed))}
                        f.write(f"FAIL seed={seed} busy={args.busy} {json.dumps(case)}\n")
                        f.write(traceback.format_exc() + "\n")
                totals["cases"] += 1
                print(f"seed {seed} {status} {json.dumps(totals)}", flush=True)
                shutil.rmtree(Path(tmp) / f"s{seed}", ignore_errors=True)
                shutil.rmtree(Path(tmp) / f"m{seed}", ignore_errors=True)
    finally:
        for h in hogs:
            h.terminate()
            h.join()
    print("TOTAL", json.dumps(totals), flush=True)
    if args.more:
        print("KINDS", json.dumps(dict(M.COUNT)), flush=True)


if __name__ == "__main__":
    main()
