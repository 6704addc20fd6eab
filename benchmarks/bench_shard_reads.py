"""Shards of small chunks, read natively (formats/zarr_shards.py) or through zarr-python: A/B.

Runs ``bench_load.py``'s cases (each in a fresh subprocess, the page cache warmed first) on the
sharded zstd stores of a ``bench_load.py`` workdir, in interleaved rounds: each round measures
every store's all-core read + decode limit (``bench_load.zstd_store_limit``), then each case
once with this checkout's ``src`` ("after") and once with ``--before-src`` (a ``src`` folder of
an older shardload whose sharded arrays go through zarr-python, e.g. from
``git archive 12c0310 src | tar -x -C /tmp/before``). Reports per case and side the best
rate over the rounds and its ratio to the store's best limit (as ``bench_load.py`` does).

Usage::

    python benchmarks/bench_load.py --cases shardload-iter:zstd-s32:w0 --workdir W  # builds W
    python benchmarks/bench_shard_reads.py --workdir W --before-src /tmp/before/src \\
        --cases shardload-iter-mem:zstd-s32:w0,shardload-sdl-mem:zstd-s32:w2 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_load  # noqa: E402
import loadbench_data as data  # noqa: E402
from loadbench_cases import case_store, parse_case  # noqa: E402


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--before-src", required=True, help="src folder of the shardload to compare")
    ap.add_argument("--cases", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=30.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--out", default="bench-results/bench_shard_reads.json")
    args = ap.parse_args(argv)
    args.seed = 0
    work = Path(args.workdir)
    cases = args.cases.split(",")
    stores = sorted({parse_case(c)[1] for c in cases})
    after_src = str(HERE.parent / "src")
    sides = {"before": args.before_src, "after": after_src}
    limits: dict[str, float] = {}
    best: dict[tuple[str, str], dict] = {}
    for r in range(args.rounds):
        print(f"round {r + 1}: load average {os.getloadavg()}", flush=True)
        for codec in stores:
            got = bench_load.zstd_store_limit(work / f"zarr-{codec}", repeats=1)
            bps = max(got["zstd_rates_Bps"].values())
            limits[codec] = max(limits.get(codec, 0.0), bps)
            print(f"  limit zarr-{codec}: {bps / 1e9:.3f} GB/s {got['zstd_rates_Bps']}", flush=True)
        for c in cases:
            loader, codec, _ = parse_case(c)
            for side, src in sides.items():
                os.environ["PYTHONPATH"] = src
                data.warm_page_cache(data.data_files(case_store(work, loader, codec)))
                t = time.perf_counter()
                rec = bench_load.run_subprocess_case(c, args)
                if "error" in rec:
                    print(f"  {c} {side}: {rec['error']}", flush=True)
                    continue
                print(
                    f"  {c} {side}: {rec['samples_per_s']:,.0f} samples/s, {rec['MBps']:,.0f} "
                    f"MB/s, truncated={rec['truncated']} ({time.perf_counter() - t:.0f} s)",
                    flush=True,
                )
                old = best.get((c, side))
                if old is None or rec["samples_per_s"] > old["samples_per_s"]:
                    best[(c, side)] = rec
    print(f"\nload average at the end {os.getloadavg()}")
    print("| case | side | samples/s | MB/s | ÷ its limit | limit GB/s | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|")
    out = []
    for (c, side), rec in best.items():
        lim = limits[parse_case(c)[1]]
        ratio = rec["MBps"] * 1e6 / lim
        print(
            f"| {c} | {side} | {rec['samples_per_s']:,.0f} | {rec['MBps']:,.0f} | {ratio:.2f} | "
            f"{lim / 1e9:.2f} | {rec.get('peak_rss_MiB', float('nan')):,.0f} |"
        )
        out.append({"case": c, "side": side, "ratio_to_limit": ratio, "limit_Bps": lim, **rec})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()
