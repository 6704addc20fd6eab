"""Interleaved A/B of shardload *source trees* on compressed stores, against each store's own
read + decode limit measured in the same rounds (a shared machine's busy spells hit all alike).

Every (case, tree) epoch and every limit pass runs in a fresh subprocess; the order of the
cases rotates from round to round. Per (case, tree) it reports the median of: samples/s, the
ratio to the limit of the same round (decoded bytes/s ÷ the store's all-core read + decode
rate), the CPU seconds of the epoch (process and DataLoader workers: steadier than wall time
on a shared machine), the limit's CPU seconds ÷ the epoch's, and the largest peak RSS (sum over
the process and its workers, sampled as ``bench_load.py`` does).

A case is ``VIA:STORE[:OPTION=VALUE,...]``: ``VIA`` ``iter`` (``iter_batches`` in-process) or
``sdl`` (``StreamingDataLoader``, 2 workers); ``STORE`` a folder of ``--workdir``
(``zarr-zstd``, ``zarr-zstd-c32``, ...: ``bench_load.py`` builds them); options go to
``iter_batches`` / ``StreamingDataset`` (integers, or ``None``). A tree is ``LABEL=SRC``, a
folder that holds the ``shardload`` package (a worktree's ``src``, or an exported commit).

Usage::

    git archive main src | tar -x -C /tmp/base   # the code to compare against
    python benchmarks/loadbench_trees_ab.py --workdir /tmp/shufmeasure/bench \\
        --trees base=/tmp/base/src,new=src --rounds 5 \\
        --cases "iter:zarr-zstd;sdl:zarr-zstd;iter:zarr-zstd-c32:shuffle_chunks=512,prefetch=512"
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

_EPOCH = r"""
import json, resource, sys, time
sys.path.insert(0, {here!r})
from loadbench_cases import PeakRSS, _vm_hwm_bytes
import shardload
store, via, opts, epoch, batch, epochs = {store!r}, {via!r}, {opts!r}, {epoch!r}, {batch!r}, {epochs!r}
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
persistent = bool(opts.pop("persistent_workers", 0))
st = shardload.open_store(store)  # opened once, as a training script would
if via == "sdl":
    from shardload.torch import StreamingDataLoader, StreamingDataset
    ds = StreamingDataset(st, batch_size=batch, **opts)
    dl = StreamingDataLoader(ds, batch_size=None, num_workers=2, persistent_workers=persistent)
runs = []
c_all = cpu()
with PeakRSS() as mem:
    for e in range(epochs):
        if via == "iter":
            it = shardload.iter_batches(st, batch_size=batch, epoch=epoch + e, **opts)
        else:
            ds.set_epoch(epoch + e)
            it = dl
        n = n1 = 0
        t, c = time.perf_counter(), cpu()
        t1 = None
        for b in it:
            n += len(b["index"])
            if t1 is None:
                t1, n1 = time.perf_counter(), n
        dt, dc = time.perf_counter() - t, cpu() - c
        runs.append({{"samples": n, "seconds": dt, "cpu_s": dc, "first_batch_s": t1 - t,
                     "after_first": (n - n1) / (t + dt - t1)}})
    mem.peak = max(mem.peak, mem.now(), _vm_hwm_bytes())  # as bench_load.py
if persistent:  # the workers' CPU counts once they are reaped: per epoch, on average
    dl._iterator._shutdown_workers()  # (a private DataLoader call; a benchmark only)
    per_epoch = (cpu() - c_all) / epochs
    for r in runs:
        r["cpu_s"] = per_epoch
print(json.dumps({{**runs[0], "epochs": runs, "peak_rss_MiB": mem.peak / 2**20,
                  "file": shardload.__file__}}))
"""

_LIMIT = r"""
import glob, json, os, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
import numcodecs.blosc as blosc
sys.path.insert(0, {here!r})
import loadbench_data as data
from pathlib import Path
files = data.zarr_chunk_files(Path({store!r}))
def one(p):
    with open(p, "rb", buffering=0) as f:
        return len(blosc.decompress(f.read()))
def cpu():
    a = resource.getrusage(resource.RUSAGE_SELF)
    return a.ru_utime + a.ru_stime
with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
    sum(pool.map(one, files[:4]))  # threads started, first buffers allocated
    t, c = time.perf_counter(), cpu()
    n = sum(pool.map(one, files))
    dt, dc = time.perf_counter() - t, cpu() - c
print(json.dumps({{"bytes": n, "seconds": dt, "cpu_s": dc}}))
"""


def _run(code: str, src: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = os.path.abspath(src)
    p = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=900,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"exit {p.returncode}: {p.stderr[-2000:]}")
    return json.loads(lines[-1])


def parse_case(case: str) -> tuple[str, str, dict[str, Any]]:
    via, store, *rest = case.split(":")
    if via not in ("iter", "sdl"):
        raise ValueError(f"case {case!r}: VIA must be iter or sdl")
    opts: dict[str, Any] = {}
    for kv in ",".join(rest).split(","):
        if kv:
            k, v = kv.split("=")
            opts[k] = None if v == "None" else int(v)
    return via, store, opts


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--trees", required=True, help="LABEL=SRC,LABEL=SRC")
    ap.add_argument("--cases", required=True, help="';'-separated VIA:STORE[:K=V,...]")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--epochs",
        type=int,
        default=1,
        help="epochs per run on one loader (later epochs reuse the process, and with "
        "persistent_workers=1 in a case the DataLoader's workers)",
    )
    ap.add_argument("--out", default=None, help="JSON of every run")
    args = ap.parse_args()
    work = Path(args.workdir)
    trees = dict(t.split("=", 1) for t in args.trees.split(","))
    cases = [c for c in args.cases.split(";") if c]
    import numpy as np

    stores = sorted({parse_case(c)[1] for c in cases})
    sizes, samples = {}, {}
    for s in stores:
        m = json.loads((work / s / "shardload.json").read_text())
        samples[s] = int(m["length"])
        sizes[s] = sum(
            int(m["length"]) * int(np.prod(a["shape"][1:])) * np.dtype(a["dtype"]).itemsize
            for a in m["arrays"].values()
        )
    jobs = [(c, t) for c in cases for t in trees]
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {j: [] for j in jobs}
    limits: dict[str, list[dict[str, Any]]] = {s: [] for s in stores}
    print(f"load average at start: {os.getloadavg()}", flush=True)
    for r in range(args.rounds):
        lim = {}
        for s in stores:
            got = _run(_LIMIT.format(here=str(HERE), store=str(work / s)), None)
            got["Bps"] = got["bytes"] / got["seconds"]
            limits[s].append(got)
            lim[s] = got
            print(
                f"round {r} limit {s}: {got['Bps'] / 1e9:.2f} GB/s, {got['cpu_s']:.2f} CPU-s",
                flush=True,
            )
        k = r % len(jobs)
        for case, tree in jobs[k:] + jobs[:k]:
            via, store, opts = parse_case(case)
            code = _EPOCH.format(
                here=str(HERE),
                store=str(work / store),
                via=via,
                opts=opts,
                epoch=r,
                batch=args.batch_size,
                epochs=args.epochs,
            )
            got = _run(code, trees[tree])
            got["samples_per_s"] = got["samples"] / got["seconds"]
            got["ratio"] = sizes[store] / got["seconds"] / lim[store]["Bps"]
            # the rate once the first batch is out (workers started, first group decoded),
            # as the limit's rate is taken once its threads run
            got["steady_ratio"] = (
                got["after_first"] * sizes[store] / samples[store] / lim[store]["Bps"]
            )
            got["cpu_ratio"] = lim[store]["cpu_s"] / got["cpu_s"]
            last = got["epochs"][-1]  # a later epoch of the same loader (--epochs)
            got["last_ratio"] = sizes[store] / last["seconds"] / lim[store]["Bps"]
            got["round"], got["load"] = r, os.getloadavg()[0]
            runs[(case, tree)].append(got)
            print(
                f"round {r} {case} [{tree}]: {got['samples_per_s']:,.0f} samples/s, ratio "
                f"{got['ratio']:.2f} (after the first batch {got['steady_ratio']:.2f}, first "
                f"batch {got['first_batch_s']:.2f} s; last epoch {got['last_ratio']:.2f}), "
                f"{got['cpu_s']:.2f} CPU-s (limit/this {got['cpu_ratio']:.2f}), "
                f"peak RSS {got['peak_rss_MiB']:.0f} MiB",
                flush=True,
            )
    print(f"load average at end: {os.getloadavg()}")
    print(
        "| case | tree | samples/s (median) | ÷ limit (median of rounds) | ÷ limit after the "
        "first batch | first batch s | last epoch ÷ limit | CPU-s | limit CPU ÷ CPU | peak RSS MiB "
        "(max) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    keys = (
        "samples_per_s",
        "ratio",
        "steady_ratio",
        "first_batch_s",
        "last_ratio",
        "cpu_s",
        "cpu_ratio",
    )
    for (case, tree), rs in runs.items():
        med = {k: statistics.median(x[k] for x in rs) for k in keys}
        print(
            f"| {case} | {tree} | {med['samples_per_s']:,.0f} | {med['ratio']:.2f} "
            f"[{', '.join(format(x['ratio'], '.2f') for x in rs)}] | {med['steady_ratio']:.2f} "
            f"[{', '.join(format(x['steady_ratio'], '.2f') for x in rs)}] | "
            f"{med['first_batch_s']:.2f} | {med['last_ratio']:.2f} | {med['cpu_s']:.2f} | "
            f"{med['cpu_ratio']:.2f} | "
            f"{max(x['peak_rss_MiB'] for x in rs):.0f} |"
        )
    for s, ls in limits.items():
        print(
            f"limit {s}: median {statistics.median(x['Bps'] for x in ls) / 1e9:.2f} GB/s "
            f"[{', '.join(format(x['Bps'] / 1e9, '.2f') for x in ls)}], median "
            f"{statistics.median(x['cpu_s'] for x in ls):.2f} CPU-s"
        )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"runs": {f"{c} [{t}]": v for (c, t), v in runs.items()}, "limits": limits},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
