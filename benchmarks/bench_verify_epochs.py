"""What the default ``verify="auto"`` costs over a training run: interleaved A/B against
``verify="never"``, same store, ``--epochs`` epochs, ``--rounds`` rounds alternating the order.

Two ways a run reads its epochs:

- ``one-process``: one process reads every epoch (``iter_batches``, a new seed each epoch), as a
  single-process loop or persistent DataLoader workers do;
- ``process-per-epoch``: each epoch in a fresh process, as DataLoader workers that are not
  persistent (PyTorch's default) or a job restarted every epoch: only the node's ledger of
  verified chunks (shardload/formats/ledger.py) saves re-hashing.

Each ``auto`` run starts with an empty ledger (a fresh ``SHARDLOAD_VERIFY_LEDGER`` folder), so
its first epoch hashes every chunk. Measured: CPU seconds (user + system, all threads) of the
epochs' loops, summed over the run; the page cache is warmed before each run. Reports the
median per arm and the cost ``auto / never - 1``, and the median first-epoch cost.

Usage::

    python benchmarks/bench_verify_epochs.py --rows 65536 --epochs 10 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import loadbench_data as data  # noqa: E402

ARMS = ("never", "auto")  # first: the baseline every other arm is compared with
SCENARIOS = ("one-process", "process-per-epoch")

CHILD = """
import json, resource, sys, time
import shardload
store, mode, first, epochs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
s = shardload.open_store(store, verify=mode)
out = []
for e in range(first, first + epochs):
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    n = sum(len(b["index"]) for b in shardload.iter_batches(s, batch_size=256, seed=e))
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    out.append(r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime)
print(json.dumps(out))
"""


def run(store: Path, mode: str, scenario: str, epochs: int, src: str) -> list[float]:
    """CPU seconds of each epoch of one run (``auto``: with a fresh, empty ledger)."""
    with tempfile.TemporaryDirectory(prefix="ledger-") as ledger:
        env = {**os.environ, "PYTHONPATH": src, "SHARDLOAD_VERIFY_LEDGER": ledger}
        env.pop("SHARDLOAD_VERIFY", None)
        calls = [(0, epochs)] if scenario == "one-process" else [(e, 1) for e in range(epochs)]
        cpu: list[float] = []
        for first, n in calls:
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(store), mode, str(first), str(n)],
                capture_output=True,
                text=True,
                env=env,
                check=True,
            )
            cpu += json.loads(out.stdout.strip().splitlines()[-1])
        return cpu


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--features", type=int, default=1550)
    ap.add_argument("--chunk-rows", type=int, default=4096)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--kinds", default="zarr-none,npy")
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument(
        "--arms",
        default=",".join(ARMS),
        help="verify modes, the first the baseline (e.g. never,auto,first-epoch: the latter "
        "is what checking raw rows cost before the ledger)",
    )
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "shardload-bench-vep"))
    ap.add_argument("--src", default=str(HERE.parent / "src"), help="shardload source tree")
    ap.add_argument("--out", default="bench-results/bench_verify_epochs.json")
    args = ap.parse_args(argv)
    work = Path(args.workdir)
    kinds = args.kinds.split(",")
    data.build_stores(
        work,
        rows=args.rows,
        features=args.features,
        chunk_rows=args.chunk_rows,
        kinds=kinds,
        seed=0,
        log=print,
    )
    arms = args.arms.split(",")
    base = arms[0]
    results: dict[str, dict[str, dict[str, list[list[float]]]]] = {}
    for kind in kinds:
        store = data.store_path(work, kind)
        for scenario in args.scenarios.split(","):
            by = results.setdefault(kind, {}).setdefault(scenario, {m: [] for m in arms})
            for r in range(args.rounds):
                for mode in arms if r % 2 == 0 else arms[::-1]:
                    data.warm_page_cache(data.data_files(store))
                    cpu = run(store, mode, scenario, args.epochs, args.src)
                    by[mode].append(cpu)
                    print(
                        f"round {r} {kind:9s} {scenario:17s} verify={mode:11s} "
                        f"CPU {sum(cpu):6.2f} s (epoch 1 {cpu[0]:.2f} s, later "
                        f"{statistics.median(cpu[1:]) if len(cpu) > 1 else 0:.2f} s median)",
                        flush=True,
                    )
    print(
        f"\n| store | epochs read | verify | CPU s over {args.epochs} epochs (median) | cost vs "
        f"{base} | epoch 1 cost (median) | cost per round |"
    )
    print("|---|---|---|---|---|---|---|")
    for kind, scen in results.items():
        for scenario, by in scen.items():
            tot = {m: statistics.median(sum(c) for c in runs) for m, runs in by.items()}
            e1 = {m: statistics.median(c[0] for c in runs) for m, runs in by.items()}
            for m in arms:
                per = [sum(a) / sum(n) - 1 for a, n in zip(by[m], by[base], strict=True)]
                print(
                    f"| {kind} | {scenario} | {m} | {tot[m]:.2f} | {tot[m] / tot[base] - 1:+.1%} "
                    f"| {e1[m] / e1[base] - 1:+.1%} | "
                    + ", ".join(f"{p:+.0%}" for p in per)
                    + " |",
                    flush=True,
                )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "cpu_s": results}, indent=1))


if __name__ == "__main__":
    main()
