"""What checksums cost: hash throughput, and the loader's speed per ``verify`` mode.

1. Hashes a 16 MiB buffer with XXH3-64 (``xxhash``, what stores record), crc32c (the
   ``crc32c`` package, hardware), ``google-crc32c`` (needs ``bytes``: a copy first) and zlib's
   crc32, on one thread; best of ``--hash-repeats``.
2. CPU time of one epoch of ``iter_batches`` (in-process, batch 256), per mode, each in a fresh
   process (user + system seconds of all its threads: what verification adds, and much less
   sensitive to a busy machine than wall time). Cost = CPU(mode) / CPU(never) - 1, median of
   ``--rounds``.
3. Runs cases of ``bench_load.py`` (same data, same subprocess per case, page cache warmed)
   with ``SHARDLOAD_VERIFY`` = never / first-epoch / always, interleaved round by round so
   that a busy machine slows every mode alike; reports each mode's median samples/s and its
   ratio to ``never``.

Usage::

    python benchmarks/bench_verify.py --rows 65536 --rounds 5
    python benchmarks/bench_verify.py --cases shardload-iter:none:w0 --rounds 3
    python benchmarks/bench_verify.py --no-loader --before-src ../main/src   # before/after
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import bench_load  # noqa: E402
import loadbench_data as data  # noqa: E402
import numpy as np  # noqa: E402
from loadbench_cases import case_store, parse_case  # noqa: E402

MODES = ("never", "first-epoch", "always")
CASES = "shardload-iter:none:w0,shardload-sdl:none:w2,shardload-iter:zstd:w0,shardload-dl:zstd:w2"


def hash_rates(nbytes: int = 16 << 20, repeats: int = 20) -> dict[str, float]:
    """GB/s of each hash over ``nbytes`` random bytes (best of ``repeats``)."""
    import zlib

    buf = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    view = buf.data
    fns = {"zlib.crc32": zlib.crc32}
    try:
        import xxhash

        fns["xxh3_64"] = xxhash.xxh3_64_intdigest
        fns["xxh64"] = xxhash.xxh64_intdigest
    except ImportError:
        pass
    try:
        import crc32c

        fns["crc32c (crc32c pkg)"] = crc32c.crc32c
    except ImportError:
        pass
    try:
        import google_crc32c

        fns["crc32c (google-crc32c, bytes copy)"] = lambda m: google_crc32c.value(bytes(m))
    except ImportError:
        pass
    out = {}
    for name, fn in fns.items():
        best = float("inf")
        for _ in range(repeats):
            t = time.perf_counter()
            fn(view)
            best = min(best, time.perf_counter() - t)
        out[name] = nbytes / best / 1e9
    return out


def cpu_epoch(store: str, mode: str, batch_size: int = 256) -> dict[str, float]:
    """One epoch of iter_batches over ``store`` with ``verify=mode``: wall and CPU seconds."""
    import resource

    import shardload

    s = shardload.open_store(store, verify=mode)
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    n = sum(len(b["index"]) for b in shardload.iter_batches(s, batch_size=batch_size, seed=0))
    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return {"samples": n, "wall_s": t1 - t0, "cpu_s": cpu}


def run_cpu_epoch(store: Path, mode: str, src: str | None = None) -> dict[str, float]:
    """``cpu_epoch`` in a fresh process; with ``src``, shardload imported from that source tree
    with its default ``verify`` (``mode`` is then only a label)."""
    import subprocess

    env = dict(os.environ)
    env.pop("SHARDLOAD_VERIFY", None)
    if src is None:
        call = f"bench_verify.cpu_epoch({str(store)!r}, {mode!r})"
        code = f"import sys, json; sys.path.insert(0, {str(HERE)!r}); import bench_verify; "
    else:  # another tree's open_store may not take verify=
        env["PYTHONPATH"] = src
        call = "cpu_default(" + repr(str(store)) + ")"
        code = (
            "import json, resource, time, shardload\n"
            "def cpu_default(store):\n"
            "    s = shardload.open_store(store)\n"
            "    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()\n"
            "    n = sum(len(b['index']) for b in shardload.iter_batches(s, batch_size=256, seed=0))\n"
            "    r1, t1 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()\n"
            "    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime\n"
            "    return {'samples': n, 'wall_s': t1 - t0, 'cpu_s': cpu}\n"
        )
    out = subprocess.run(
        [sys.executable, "-c", code + f"print(json.dumps({call}))"],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=65536)
    ap.add_argument("--features", type=int, default=1550)
    ap.add_argument("--chunk-rows", type=int, default=4096)
    ap.add_argument("--cases", default=CASES)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=60.0)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--out", default="bench-results/bench_verify.json")
    ap.add_argument("--no-loader", action="store_true", help="only hashes and CPU time")
    ap.add_argument(
        "--before-src",
        default=None,
        help="also time, interleaved, shardload from this source tree (e.g. main's "
        "src) and this tree, both with their default verify",
    )
    args = ap.parse_args(argv)
    for name, rate in hash_rates().items():
        print(f"hash {name:36s} {rate:6.1f} GB/s (one thread, 16 MiB)", flush=True)
    load_args = bench_load.parse_args(
        [
            "--rows",
            str(args.rows),
            "--features",
            str(args.features),
            "--chunk-rows",
            str(args.chunk_rows),
            "--max-seconds",
            str(args.max_seconds),
            *(["--workdir", args.workdir] if args.workdir else []),
        ]
    )
    load_args.workdir = Path(
        args.workdir or Path(load_args.workdir).with_name("shardload-bench-verify")
    )
    cases = args.cases.split(",")
    data.build_stores(
        load_args.workdir,
        rows=args.rows,
        features=args.features,
        chunk_rows=args.chunk_rows,
        kinds=["zarr-none", "zarr-zstd"],
        seed=0,
        log=print,
    )
    os.sync()
    cpu: dict[str, dict[str, list[float]]] = {}
    modes = list(MODES)
    if args.before_src:
        modes += ["before (default)", "after (default)"]
    here_src = str(HERE.parent / "src")
    for kind in ("zarr-none", "zarr-zstd"):
        store = load_args.workdir / kind
        cpu[kind] = {m: [] for m in modes}
        for r in range(args.rounds):
            for mode in modes if r % 2 == 0 else modes[::-1]:
                data.warm_page_cache(data.data_files(store))
                src = {"before (default)": args.before_src, "after (default)": here_src}.get(mode)
                rec = run_cpu_epoch(store, mode, src)
                cpu[kind][mode].append(rec["cpu_s"])
                print(
                    f"round {r} iter_batches {kind:10s} verify={mode:12s} CPU {rec['cpu_s']:6.2f} s "
                    f"wall {rec['wall_s']:6.2f} s ({rec['samples'] / rec['wall_s']:,.0f} samples/s)",
                    flush=True,
                )
    print(
        "\n| store | "
        + " | ".join(f"CPU s, {m} (median)" for m in modes)
        + " | first-epoch cost | always cost |"
        + (" after / before |" if args.before_src else "")
    )
    print("|---|" + "---|" * (len(modes) + 2 + bool(args.before_src)))
    for kind, by in cpu.items():
        med = {m: statistics.median(v) for m, v in by.items()}
        extra = (
            f" {med['after (default)'] / med['before (default)'] - 1:+.1%} |"
            if args.before_src
            else ""
        )
        print(
            f"| {kind} | "
            + " | ".join(f"{med[m]:.3f}" for m in modes)
            + f" | {med['first-epoch'] / med['never'] - 1:+.1%} | {med['always'] / med['never'] - 1:+.1%} |"
            + extra,
            flush=True,
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    if args.no_loader:
        Path(args.out).write_text(json.dumps({"cpu_s": cpu}, indent=1))
        return
    rates: dict[str, dict[str, list[float]]] = {c: {m: [] for m in MODES} for c in cases}
    for r in range(args.rounds):
        for c in cases:
            loader, codec, _ = parse_case(c)
            for mode in MODES if r % 2 == 0 else MODES[::-1]:
                data.warm_page_cache(data.data_files(case_store(load_args.workdir, loader, codec)))
                os.environ["SHARDLOAD_VERIFY"] = mode
                rec = bench_load.run_subprocess_case(c, load_args)
                if "error" in rec:
                    raise SystemExit(f"{c} verify={mode}: {rec['error']}\n{rec.get('stderr_tail')}")
                rates[c][mode].append(rec["samples_per_s"])
                print(
                    f"round {r} {c:26s} verify={mode:12s} {rec['samples_per_s']:>12,.0f} samples/s",
                    flush=True,
                )
    os.environ.pop("SHARDLOAD_VERIFY", None)
    print(
        "\n| case | "
        + " | ".join(f"{m} (median samples/s)" for m in MODES)
        + " | first-epoch / never | always / never |"
    )
    print("|---|" + "---|" * (len(MODES) + 2))
    summary = {}
    for c in cases:
        med = {m: statistics.median(v) for m, v in rates[c].items()}
        summary[c] = {"median": med, "runs": rates[c]}
        print(
            f"| {c} | "
            + " | ".join(f"{med[m]:,.0f}" for m in MODES)
            + f" | {med['first-epoch'] / med['never']:.3f} | {med['always'] / med['never']:.3f} |"
        )
    Path(args.out).write_text(
        json.dumps(
            {
                "rows": args.rows,
                "features": args.features,
                "chunk_rows": args.chunk_rows,
                "cases": summary,
                "cpu_s": cpu,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
