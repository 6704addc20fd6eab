"""Load throughput, side by side: shardload vs naive torch Datasets, xbatcher, zarr-torch-dataset.

One run on the same data (default 262,144 samples x 1,550 float32 = 6.2 KB each, chunks of
4,096 rows, 1.6 GB), written by ``shardload.prepare`` as Zarr v3 uncompressed and zstd, plus
npy-stack and HDF5 copies for the naive npy / h5py loaders. It measures the machine's limits
(memcpy; reading the store's files from the page cache with the fastest plain call; for zstd,
read + decode on all cores), then times one shuffled epoch at batch 256 of every loader with 0
and 2 DataLoader workers, each in a fresh subprocess (``--run-case``) so that peak RSS is per
case. Page caches are warmed (every data file read once) before the limits and before each case.
Slow loaders are timed on the first ``--max-seconds`` of the epoch and their rate extrapolated.

Reports per case: samples/s, MB/s, ratio to its limit, peak RSS (process + workers), the
shuffle quality (``shardload.plan.quality``: chunks per batch against a uniform shuffle's,
VIF_pos, VIF_ar, recurrence of batch-mates in the next epoch, pair excess; docs/loading.md),
whether the epoch was complete; the same figures for a uniform permutation and a tf.data-style
shuffle buffer holding the rows shardload's default holds. Prints a markdown table and the
issue's goal checks, writes JSON (``--out``), a bar chart (PNG next to it) and a plot of batch
composition (``*-composition.png``).

Usage::

    python benchmarks/bench_load.py                       # the full run (~10-15 min, 6.4 GB disk)
    python benchmarks/bench_load.py --quick               # a tiny smoke run (seconds)
    python benchmarks/bench_load.py --rows 50000 --cases shardload-iter:none:w0,naive-h5py:none:w2
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # the helper modules and the prepare view function live here
    sys.path.insert(0, str(HERE))

import loadbench_data as data  # noqa: E402
from loadbench_cases import (  # noqa: E402
    LOADERS,
    OWN_COPY,
    PEER,
    case_store,
    parse_case,
    quality_stats,
    run_case,
    shuffle_stats,
)

DEFAULT_CASES = (
    "shardload-iter:none:w0",
    "shardload-iter-legacy:none:w0",
    "shardload-iter-uniform:none:w0",
    "shardload-dl:none:w0",
    "shardload-dl:none:w2",
    "shardload-sdl:none:w2",
    "shardload-sdl-legacy:none:w2",
    "shardload-sdl-uniform:none:w2",
    "shardload-sdl-r4:none:w2",
    "shardload-sdl-r16:none:w2",
    "naive-zarr:none:w0",
    "naive-zarr:none:w2",
    "naive-h5py:none:w0",
    "naive-h5py:none:w2",
    "naive-npy:none:w0",
    "naive-npy:none:w2",
    "xbatcher:none:w0",
    "xbatcher:none:w2",
    "zarr-torch-dataset:none:w0",
    "zarr-torch-dataset:none:w2",
    "torch-handoff:none:w2",
    "shardload-iter:zstd:w0",
    "shardload-iter-pool8:zstd:w0",
    "shardload-dl:zstd:w2",
    "naive-zarr:zstd:w2",
    "xbatcher:zstd:w2",
    "zarr-torch-dataset:zstd:w0",
    "zarr-torch-dataset:zstd:w2",
)
#: Compressed stores of smaller chunks (issue 14): zstd chunks of R rows (``zstd-cR``), or of R
#: rows inside shards of the base chunk rows (``zstd-sR``), each read with the default settings
#: and with a decoded pool of the zstd default's memory (``-mem``), in-process and through
#: ``StreamingDataLoader`` with 2 workers. ``--cases compressed`` runs these and the baselines.
SMALL_CHUNKS = ("c1024", "c512", "c256", "c64", "c32", "s256", "s32")
COMPRESSED_CASES = (
    "shardload-iter:zstd:w0",
    "shardload-iter-pool8:zstd:w0",
    "shardload-sdl:zstd:w2",
    *(
        f"shardload-{how}:zstd-{k}:w{w}"
        for k in SMALL_CHUNKS
        for how, w in (("iter", 0), ("iter-mem", 0), ("sdl", 2), ("sdl-mem", 2))
    ),
)
DEFAULT_CASES += tuple(c for c in COMPRESSED_CASES if c not in DEFAULT_CASES)
QUICK = {"rows": 8192, "features": 64, "chunk_rows": 512, "max_seconds": 5.0, "repeats": 1}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--rows", type=int, default=None, help="samples (default 262144)")
    size = ap.add_mutually_exclusive_group()
    size.add_argument(
        "--features", type=int, default=None, help="float32 per sample (default 1550)"
    )
    size.add_argument(
        "--row-bytes", type=int, default=None, help="bytes per sample (rounded to float32)"
    )
    ap.add_argument("--chunk-rows", type=int, default=None, help="rows per chunk (default 4096)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--workdir",
        default=None,
        help="where the stores live (reused when the shape matches); default "
        "$TMPDIR/shardload-bench-load",
    )
    ap.add_argument(
        "--cases",
        default=None,
        help="comma-separated subset, LOADER:none|zstd|zstd-cR|zstd-sR:wN (default: "
        "all; see --list), or 'compressed' (the zstd stores of smaller chunks "
        "and their baselines)",
    )
    ap.add_argument("--list", action="store_true", help="list the default cases and exit")
    ap.add_argument(
        "--quick", action="store_true", help=f"tiny smoke run: {QUICK} unless given explicitly"
    )
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="time limit per case; slower loaders are timed on a prefix of the epoch "
        "and their rate extrapolated (default 20)",
    )
    ap.add_argument("--out", default="bench-results/bench_load.json")
    ap.add_argument("--no-plot", action="store_true")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="cases that finish their epoch within --max-seconds run this many times "
        "(fresh processes); the fastest is reported, with every run's rate in "
        "the JSON, and peak memory is the largest of the runs (default 3; --quick: 1)",
    )
    ap.add_argument(
        "--peer-python",
        default=None,
        help="interpreter with mosaicml-streaming and litdata installed (a venv of "
        "its own: they pin other numpy/torch versions); runs the peer cases "
        f"{sorted(PEER)} (docs/benchmarks.md)",
    )
    ap.add_argument("--run-case", default=None, help=argparse.SUPPRESS)  # internal: one subprocess
    args = ap.parse_args(argv)
    defaults = (
        QUICK
        if args.quick
        else {
            "rows": 262144,
            "features": 1550,
            "chunk_rows": 4096,
            "max_seconds": 20.0,
            "repeats": 3,
        }
    )
    for k, v in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    if args.row_bytes is not None:
        args.features = max(1, round(args.row_bytes / 4))
    args.workdir = Path(args.workdir or Path(tempfile.gettempdir()) / "shardload-bench-load")
    return args


def _fits(codec: str, chunk_rows: int) -> bool:
    small = data.small_chunk_kind(f"zarr-{codec}")
    return small is None or (small[0] < chunk_rows and chunk_rows % small[0] == 0)


def run_subprocess_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    loader = parse_case(name)[0]
    if loader in PEER:
        return run_peer_case(name, args)
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--run-case",
        name,
        "--workdir",
        str(args.workdir),
        "--batch-size",
        str(args.batch_size),
        "--max-seconds",
        str(args.max_seconds),
        "--seed",
        str(args.seed),
    ]
    env = dict(os.environ)
    # the time limit is checked between batches; a batch of a very slow loader can overrun it
    timeout_s = 10 * args.max_seconds + 120
    t = time.perf_counter()
    try:
        p = subprocess.run(
            cmd, capture_output=True, text=True, env=env, check=False, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as exc:
        tail = exc.stderr[-3000:] if isinstance(exc.stderr, str) else ""
        return {
            "case": name,
            "error": f"killed after {timeout_s:g} s (no batch in time)",
            "stderr_tail": tail,
            "wall_s": time.perf_counter() - t,
        }
    wall = time.perf_counter() - t
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        err = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {
            "case": name,
            "error": f"exit {p.returncode}: {err}",
            "stderr_tail": p.stderr[-3000:],
            "wall_s": wall,
        }
    rec = json.loads(lines[-1])
    rec["wall_s"] = wall
    return rec


def run_peer_case(name: str, args: argparse.Namespace) -> dict[str, Any]:
    """One peer case in ``--peer-python`` (``loadbench_peers.py``); the quality figures are
    computed here from the sample indices it wrote, as for our own loaders."""
    import numpy as np

    if not args.peer_python:
        return {"case": name, "error": "needs --peer-python (a venv with the peer installed)"}
    ind = Path(tempfile.mkdtemp(prefix="peer-")) / "indices.npz"
    cmd = [
        args.peer_python,
        str(HERE / "loadbench_peers.py"),
        "--case",
        name,
        "--workdir",
        str(args.workdir),
        "--batch-size",
        str(args.batch_size),
        "--max-seconds",
        str(args.max_seconds),
        "--seed",
        str(args.seed),
        "--indices",
        str(ind),
    ]
    t = time.perf_counter()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    try:
        p = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=30 * args.max_seconds + 1800,
        )
    except subprocess.TimeoutExpired:
        return {"case": name, "error": "peer case timed out", "wall_s": time.perf_counter() - t}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        err = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        return {
            "case": name,
            "error": f"exit {p.returncode}: {err}",
            "stderr_tail": p.stderr[-3000:],
            "wall_s": time.perf_counter() - t,
        }
    rec = json.loads(lines[-1])
    rec["wall_s"] = time.perf_counter() - t
    with np.load(ind) as z:
        keys = sorted(z.files, key=lambda k: (k[:2], int(k.split("_")[1])))
        e0 = [z[k] for k in keys if k.startswith("e0_")]
        e1 = [z[k] for k in keys if k.startswith("e1_")]
    rec.update(
        shuffle_stats(
            e0,
            length=args.rows,
            chunk_rows=args.chunk_rows,
            batch_size=args.batch_size,
            truncated=rec["truncated"],
        )
    )
    rec.update(
        quality_stats(
            e0, e1, length=args.rows, chunk_rows=args.chunk_rows, truncated=rec["truncated"]
        )
    )
    rec["sample_batches"] = [i.tolist() for i in e0[:48]]
    return rec


def measure_limits(work: Path, info: dict[str, Any], *, log) -> dict[str, Any]:
    from loadbench_limits import memcpy_rate, page_cache_read_rate

    lim: dict[str, Any] = {}
    lim.update(memcpy_rate())
    log(
        f"  memcpy (np.copyto, 1 thread, {lim['memcpy_bytes'] >> 20} MiB): "
        f"{lim['memcpy_Bps'] / 1e9:.2f} GB/s"
    )
    if "zarr-none" in info:
        files = data.zarr_chunk_files(work / "zarr-none")
        lim.update(page_cache_read_rate(files))
        rates = ", ".join(f"{k} {v / 1e9:.2f}" for k, v in lim["read_rates_Bps"].items())
        log(
            f"  page-cache read of zarr-none's {len(files)} chunk files, 1 thread: {rates} GB/s "
            f"-> limit {lim['read_Bps'] / 1e9:.2f} GB/s ({lim['read_call']}); "
            f"{lim['read_threads']} threads: {lim['read_all_cores_Bps'] / 1e9:.2f} GB/s (info)"
        )
    # every compressed store against its own limit, measured in interleaved rounds (best of
    # each variant over the rounds) so that a busy spell of a shared machine hits them alike
    kinds = [k for k in info if k == "zarr-zstd" or data.small_chunk_kind(k)]
    by: dict[str, dict[str, Any]] = {}
    for _ in range(LIMIT_ROUNDS):
        for kind in kinds:
            got = zstd_store_limit(work / kind, repeats=1)
            old = by.setdefault(kind, got)
            for k, v in got["zstd_rates_Bps"].items():
                old["zstd_rates_Bps"][k] = max(v, old["zstd_rates_Bps"][k])
            old["zstd_one_thread_Bps"] = max(old["zstd_one_thread_Bps"], got["zstd_one_thread_Bps"])
    for kind, r in by.items():
        r["zstd_variant"] = max(r["zstd_rates_Bps"], key=r["zstd_rates_Bps"].__getitem__)
        r["zstd_Bps"] = r["zstd_rates_Bps"][r["zstd_variant"]]
        rates = "; ".join(f"{k}: {v / 1e9:.2f}" for k, v in r["zstd_rates_Bps"].items())
        log(
            f"  {kind} read + decode (decoded GB/s, best of {LIMIT_ROUNDS} interleaved rounds): "
            f"{rates} -> limit {r['zstd_Bps'] / 1e9:.2f} GB/s; one thread "
            f"{r['zstd_one_thread_Bps'] / 1e9:.2f} GB/s"
        )
    if by:
        lim["zstd_by_store"] = by
    if "zarr-zstd" in by:
        lim.update(by["zarr-zstd"])
    return lim


#: Rounds over all compressed stores when measuring their read + decode limits.
LIMIT_ROUNDS = 3


def zstd_store_limit(store: Path, repeats: int = 3) -> dict[str, Any]:
    """The all-core read + decode limit of a zstd store (``zarr-zstd``, ``-cN``, ``-sN``): its
    own chunk files (a file per small chunk costs an open and a read each), or its shards read
    whole and their inner chunks decoded."""
    import numpy as np
    from loadbench_limits import shard_read_decode_rate, zstd_read_decode_rate

    m = json.loads((store / "shardload.json").read_text())
    x = m["arrays"]["x"]
    row_bytes = int(np.prod(x["shape"][1:])) * np.dtype(x["dtype"]).itemsize
    sizes = np.diff(np.asarray(m["chunk_bounds"], dtype=np.int64))
    files = data.zarr_chunk_files(store)
    _, sharded = data.small_chunk_kind(store.name) or (0, False)
    if not sharded:
        return zstd_read_decode_rate(
            files,
            chunk_bytes=(sizes * row_bytes).tolist(),
            zarr_array=str(store / "x"),
            repeats=repeats,
        )
    per_shard = len(sizes) // len(files)
    return shard_read_decode_rate(
        files,
        chunks_per_shard=per_shard,
        decoded_bytes=int(sizes.sum()) * row_bytes,
        zarr_array=str(store / "x"),
        repeats=repeats,
    )


def add_ratios(rec: dict[str, Any], lim: dict[str, Any]) -> None:
    if "error" in rec:
        return
    if rec["codec"].startswith("zstd"):  # each compressed store against its own limit
        own = lim.get("zstd_by_store", {}).get(rec["store"], {})
        rec["limit"] = f"zstd read+decode of {rec['store']}, all cores"
        rec["limit_MBps"] = own["zstd_Bps"] / 1e6 if "zstd_Bps" in own else None
        rec["ratio_to_limit"] = rec["MBps"] / rec["limit_MBps"] if rec["limit_MBps"] else None
        return
    key = "read_Bps"
    rec["limit"] = "page-cache read"
    rec["limit_MBps"] = lim[key] / 1e6 if key in lim else None
    rec["ratio_to_limit"] = rec["MBps"] / rec["limit_MBps"] if rec["limit_MBps"] else None


def _fmt(v: Any, spec: str = ".2f") -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return format(v, spec)
    return str(v)


def table(recs: list[dict[str, Any]]) -> str:
    head = (
        "| case | samples/s | MB/s | ratio to limit | peak RSS MiB (PSS) | chunks/batch | "
        "complete epoch | first batch s | timed samples (s) |"
    )
    rows = [head, "|" + "---|" * 9]
    for r in recs:
        if "error" in r:
            rows.append(f"| {r['case']} | error: {r['error'][:120]} ||||||||")
            continue
        if r.get("reference"):
            continue
        timed = f"{r['samples']:,} ({r['seconds']:.1f} s)"
        if r["truncated"]:
            timed += f", {100 * r['epoch_fraction']:.1f}% of the epoch, extrapolated"
        rows.append(
            f"| {r['case']} | {r['samples_per_s']:,.0f} | {r['MBps']:,.0f} | "
            f"{_fmt(r.get('ratio_to_limit'), '.3f')} | {r['peak_rss_MiB']:,.0f} "
            f"({r['peak_pss_MiB']:,.0f}) | {r['chunks_per_batch']:.1f} | {r['complete_epoch']} | "
            f"{_fmt(r['first_batch_s'])} | {timed} |"
        )
    return "\n".join(rows)


def quality_table(recs: list[dict[str, Any]]) -> str:
    """The five shuffle-quality figures per case (1.0 = a uniform shuffle's)."""
    head = (
        "| case | chunks/batch (÷ uniform) | VIF_pos | VIF_ar | recurrence | pair excess | "
        "samples/s | peak RSS MiB (PSS) |"
    )
    rows = [head, "|" + "---|" * 8]
    for r in recs:
        if "error" in r or "vif_pos" not in r:
            continue
        speed = f"{r['samples_per_s']:,.0f}" if "samples_per_s" in r else "n/a"
        mem = (
            f"{r['peak_rss_MiB']:,.0f} ({r['peak_pss_MiB']:,.0f})" if "peak_rss_MiB" in r else "n/a"
        )
        rows.append(
            f"| {r['case']} | {r['chunks_per_batch']:.1f} ({r['chunks_per_batch_ratio']:.2f}) | "
            f"{r['vif_pos']:.2f} | {r['vif_ar']:.2f} | {_fmt(r.get('recurrence'))} | "
            f"{r['pair_excess']:.2f} | {speed} | {mem} |"
        )
    return "\n".join(rows)


def reference_records(work: Path, *, batch_size: int, seed: int) -> list[dict[str, Any]]:
    """Quality of a uniform permutation and of a tf.data-style shuffle buffer holding the rows
    a default shardload reader holds (its shuffle groups in flight), on the store's chunking."""
    import numpy as np

    import shardload
    from shardload.load.options import DEFAULT_PREFETCH, resolve_shuffle
    from shardload.load.scatter import groups_in_flight
    from shardload.load.select import select_rows
    from shardload.plan.quality import quality, shuffle_buffer_batches, uniform_batches

    store = shardload.open_store(work / "zarr-none")
    bounds = np.asarray(store.manifest.chunk_bounds)
    n, sizes = int(bounds[-1]), np.diff(bounds)
    chunk_of = np.repeat(np.arange(len(sizes)), sizes)
    piece, group = resolve_shuffle(store, select_rows(store), None, None)
    resident = piece * group * groups_in_flight(prefetch=DEFAULT_PREFETCH, shuffle_chunks=group)
    uni = [uniform_batches(np.arange(n), batch_size, seed=seed + e) for e in (0, 1)]
    buf = [
        shuffle_buffer_batches(sizes, batch_size, buffer_rows=resident, seed=seed + e)
        for e in (0, 1)
    ]
    out = []
    for name, epochs, what in (
        ("uniform permutation", uni, "reference: a uniform permutation of all rows"),
        (
            f"tf.data buffer {resident:,} rows",
            buf,
            f"reference: shuffled chunk order, rows through a {resident}-row shuffle buffer "
            "(the rows shardload's default reader holds)",
        ),
    ):
        q = quality(epochs, chunk_of)
        out.append(
            {
                "case": name,
                "loader": "reference",
                "reference": True,
                "what": what,
                "sample_batches": [b.tolist() for b in epochs[0][:48]],
                **q,
            }
        )
    return out


def goal_lines(by: dict[str, dict[str, Any]]) -> list[str]:
    def get(case: str, key: str) -> float | None:
        r = by.get(case)
        return None if r is None or "error" in r else r.get(key)

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    out = [
        f"in-process shardload / read limit = {_fmt(get('shardload-iter:none:w0', 'ratio_to_limit'))} (goal ≥ 0.5)",
    ]
    for case in ("shardload-dl:none:w2", "shardload-sdl:none:w2"):
        out.append(
            f"DataLoader 2 workers / read limit = {_fmt(get(case, 'ratio_to_limit'))} "
            f"(goal ≥ 0.3) [{case}]"
        )
    for ours, theirs in (
        ("shardload-dl:none:w2", "zarr-torch-dataset:none:w2"),
        ("shardload-iter:none:w0", "zarr-torch-dataset:none:w0"),
    ):
        speed = ratio(get(ours, "samples_per_s"), get(theirs, "samples_per_s"))
        rss = ratio(get(ours, "peak_rss_MiB"), get(theirs, "peak_rss_MiB"))
        pss = ratio(get(ours, "peak_pss_MiB"), get(theirs, "peak_pss_MiB"))
        # memory = the PSS sum: the RSS sum counts pages that forked workers share with the
        # main process (torch, libraries, the batch ring) once per process
        out.append(
            f"shardload vs zarr-torch-dataset speed = {_fmt(speed)}× (goal ≥ 4×) at "
            f"memory (PSS) ratio {_fmt(pss)} (goal ≤ 0.25) [{ours} vs {theirs}; RSS-sum "
            f"ratio {_fmt(rss)}]"
        )
    out.append(
        f"zstd shardload / read+decode limit = "
        f"{_fmt(get('shardload-iter:zstd:w0', 'ratio_to_limit'))} (goal ≥ 0.8)"
    )
    for case in (
        "shardload-iter:none:w0",
        "shardload-sdl:none:w2",
        "shardload-sdl-r4:none:w2",
        "shardload-sdl-r16:none:w2",
        "shardload-iter-uniform:none:w0",
        "shardload-iter:zstd:w0",
        "shardload-iter-pool8:zstd:w0",
    ):
        if case in by and "vif_pos" in by[case]:
            r = by[case]
            out.append(
                f"quality {case}: chunks/batch ÷ uniform {_fmt(r['chunks_per_batch_ratio'])} "
                f"(goal ≥ 0.9), VIF_pos {_fmt(r['vif_pos'])} (≤ 1.5), VIF_ar {_fmt(r['vif_ar'])} "
                f"(≤ 2), recurrence {_fmt(r.get('recurrence'))} (≤ 1.5)"
            )
    for new, old in (
        ("shardload-iter:none:w0", "shardload-iter-legacy:none:w0"),
        ("shardload-sdl:none:w2", "shardload-sdl-legacy:none:w2"),
    ):
        speed = ratio(get(new, "samples_per_s"), get(old, "samples_per_s"))
        pss = ratio(get(new, "peak_pss_MiB"), get(old, "peak_pss_MiB"))
        rss = ratio(get(new, "peak_rss_MiB"), get(old, "peak_rss_MiB"))
        out.append(
            f"new default vs the earlier one: speed {_fmt(speed)}× (goal ≥ 0.9) at memory "
            f"PSS {_fmt(pss)}× / RSS {_fmt(rss)}× (goal ≤ 1) [{new} vs {old}]"
        )
    for case, r in by.items():  # compressed stores of small chunks, against the zstd default
        if "error" in r or not r.get("codec", "").startswith("zstd-"):
            continue
        base = "shardload-iter:zstd:w0" if r["workers"] == 0 else "shardload-sdl:zstd:w2"
        rss = ratio(r.get("peak_rss_MiB"), get(base, "peak_rss_MiB"))
        pss = ratio(r.get("peak_pss_MiB"), get(base, "peak_pss_MiB"))
        met = (
            (r.get("ratio_to_limit") or 0) >= 0.8
            and (rss or 9) <= 1.0
            and r["vif_pos"] <= 1.5
            and r["vif_ar"] <= 2
            and (r.get("recurrence") or 9) <= 1.5
        )
        out.append(
            f"compressed {case}: {_fmt(r.get('ratio_to_limit'))} of its read+decode limit (goal "
            f"≥ 0.8), memory RSS {_fmt(rss)}× / PSS {_fmt(pss)}× {base} (goal ≤ 1), VIF_pos "
            f"{_fmt(r['vif_pos'])} (≤ 1.5), VIF_ar {_fmt(r['vif_ar'])} (≤ 2), recurrence "
            f"{_fmt(r.get('recurrence'))} (≤ 1.5): {'all goals met' if met else 'not all met'}"
        )
    out.append(
        f"uniform in-process / read limit = "
        f"{_fmt(get('shardload-iter-uniform:none:w0', 'ratio_to_limit'))} (goal ≥ 0.3)"
    )
    hand = get("torch-handoff:none:w2", "samples_per_s")
    if hand:
        dl = get("shardload-dl:none:w2", "samples_per_s")
        out.append(
            f"DataLoader hand-off alone (no I/O, 2 workers) = {hand:,.0f} samples/s; "
            f"shardload-dl:none:w2 / hand-off = {_fmt(ratio(dl, hand))}"
        )
    return out


def plot(recs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in recs if "error" not in r]
    names = [r["case"] + (" *" if r["truncated"] else "") for r in ok]
    colors = ["tab:blue" if r["loader"].startswith("shardload") else "tab:gray" for r in ok]
    fig, (a, b) = plt.subplots(1, 2, figsize=(13, 0.35 * len(ok) + 1.5), sharey=True)
    a.barh(names, [r.get("ratio_to_limit") or 0 for r in ok], color=colors)
    a.set_xlabel("ratio to limit (page-cache read; zstd: all-core read + decode)")
    for x, style, label in (
        (0.5, "--", "goal in-process"),
        (0.3, ":", "goal 2 workers"),
        (0.8, "-.", "goal zstd"),
    ):
        a.axvline(x, color="k", linestyle=style, linewidth=0.8, label=f"{label} {x:g}")
    a.legend(loc="lower right", fontsize="small")
    b.barh(names, [r["samples_per_s"] for r in ok], color=colors)
    b.set_xscale("log")
    b.set_xlabel("samples/s (log)")
    a.invert_yaxis()
    fig.suptitle(
        "shardload load benchmark, batch 256, one shuffled epoch (* = time-limited prefix)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_composition(recs: list[dict[str, Any]], path: Path, *, length: int) -> None:
    """Batch composition: the storage position (row / N) of every row of the first batches,
    per loader, beside a uniform permutation's (a uniform shuffle fills each column evenly)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [r for r in recs if "error" not in r and r.get("sample_batches")]
    ok.sort(key=lambda r: not r.get("reference"))
    cols = 4
    rows = -(-len(ok) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), sharey=True, squeeze=False)
    for ax, r in zip(axes.flat, ok, strict=False):
        for k, b in enumerate(r["sample_batches"][:32]):
            ax.plot([k] * len(b), [i / length for i in b], ",", color="k", alpha=0.5)
        vif = r.get("vif_pos")
        ax.set_title(
            f"{r['case']}\nVIF_pos {vif:.2f}" if vif is not None else r["case"], fontsize="small"
        )
        ax.set_xlabel("batch")
    for ax in axes.flat[len(ok) :]:
        ax.axis("off")
    for ax in axes[:, 0]:
        ax.set_ylabel("row / N (storage order)")
    fig.suptitle("batch composition: where the rows of the first 32 batches lie in storage")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.run_case:
        rec = run_case(
            args.run_case,
            args.workdir,
            batch_size=args.batch_size,
            max_seconds=args.max_seconds,
            seed=args.seed,
        )
        print(json.dumps(rec))
        return
    if args.cases == "compressed":
        args.cases = ",".join(COMPRESSED_CASES)
    cases = args.cases.split(",") if args.cases else list(DEFAULT_CASES)
    if not args.cases:  # small-chunk stores whose chunks do not divide the base chunk: skipped
        cases = [c for c in cases if _fits(parse_case(c)[1], args.chunk_rows)]
    if args.list:
        print("\n".join(f"{c:32s} {LOADERS[parse_case(c)[0]]}" for c in DEFAULT_CASES))
        return
    for c in cases:
        parse_case(c)

    def log(msg: str) -> None:
        print(msg, flush=True)

    needed = {"zarr-none", "zarr-zstd"}
    needed |= {
        f"zarr-{parse_case(c)[1]}"
        for c in cases
        if data.small_chunk_kind(f"zarr-{parse_case(c)[1]}")
    }
    needed |= {OWN_COPY[parse_case(c)[0]] for c in cases if parse_case(c)[0] in OWN_COPY}
    kinds = [k for k in data.STORE_KINDS if k in needed] + sorted(needed - set(data.STORE_KINDS))
    row_bytes = args.features * 4
    log(
        f"data: {args.rows:,} samples x {args.features} float32 ({row_bytes:,} B), chunks of "
        f"{args.chunk_rows:,} rows, {args.rows * row_bytes / 1e9:.2f} GB per store; "
        f"stores {kinds} in {args.workdir}"
    )
    t = time.perf_counter()
    info = data.build_stores(
        args.workdir,
        rows=args.rows,
        features=args.features,
        chunk_rows=args.chunk_rows,
        kinds=kinds,
        seed=args.seed,
        log=log,
    )
    log(f"  stores ready in {time.perf_counter() - t:.1f} s")
    # freshly written stores leave GBs of dirty pages: flush them now, or their write-back
    # competes with the first cases for CPU and I/O
    t = time.perf_counter()
    os.sync()
    log(f"  os.sync() (write-back of the stores) took {time.perf_counter() - t:.1f} s")
    all_files = list(data.iter_store_files(args.workdir, kinds))
    n = data.warm_page_cache(all_files)
    log(f"page cache warmed: read all {len(all_files)} data files once ({n / 1e9:.2f} GB)")
    log("limits:")
    lim = measure_limits(args.workdir, info, log=log)
    if "zarr-zstd" in info and "zarr-none" in info:
        lim["zstd_ratio"] = info["zarr-none"]["disk_bytes"] / info["zarr-zstd"]["disk_bytes"]
        log(f"  zstd store: {lim['zstd_ratio']:.2f}x smaller than the uncompressed one")
    recs: list[dict[str, Any]] = []
    log(
        f"cases (each in a fresh subprocess; page cache re-warmed first; time limit "
        f"{args.max_seconds:g} s per case, slower loaders extrapolated from a prefix):"
    )
    for c in cases:
        loader, codec, _ = parse_case(c)

        def warm_and_run(c: str = c, loader: str = loader, codec: str = codec) -> dict[str, Any]:
            data.warm_page_cache(data.data_files(case_store(args.workdir, loader, codec)))
            return run_subprocess_case(c, args)

        rec = warm_and_run()
        if args.repeats > 1 and "error" not in rec and not rec["truncated"]:
            # a whole epoch in a few seconds is at the mercy of a shared machine: best of
            # --repeats fresh-process runs, as the limits are the best of several passes
            runs = [rec, *(warm_and_run() for _ in range(args.repeats - 1))]
            ok = [r for r in runs if "error" not in r]
            rec = max(ok, key=lambda r: r["samples_per_s"])
            rec["runs_samples_per_s"] = [round(r["samples_per_s"]) for r in ok]
            rec["peak_rss_MiB"] = max(r["peak_rss_MiB"] for r in ok)
            rec["peak_pss_MiB"] = max(r["peak_pss_MiB"] for r in ok)
        add_ratios(rec, lim)
        recs.append(rec)
        if "error" in rec:
            log(f"  {c}: ERROR {rec['error']}")
            continue
        log(
            f"  {c}: {rec['samples_per_s']:,.0f} samples/s, {rec['MBps']:,.0f} MB/s, ratio "
            f"{_fmt(rec['ratio_to_limit'], '.3f')}, peak RSS {rec['peak_rss_MiB']:,.0f} MiB, "
            f"{rec['chunks_per_batch']:.1f} chunks/batch, VIF_pos {_fmt(rec.get('vif_pos'))}, "
            f"complete: {rec['complete_epoch']}"
            + (f" [runs: {rec['runs_samples_per_s']}]" if "runs_samples_per_s" in rec else "")
            + (
                f" [prefix {100 * rec['epoch_fraction']:.1f}% of the epoch, extrapolated]"
                if rec["truncated"]
                else ""
            )
        )
    log("")
    log(
        f"limits: page-cache read {_fmt(lim.get('read_Bps', 0) / 1e9)} GB/s "
        f"({lim.get('read_call')}); memcpy {lim['memcpy_Bps'] / 1e9:.2f} GB/s; zstd read + decode "
        f"(all cores) {_fmt(lim.get('zstd_Bps', 0) / 1e9)} GB/s ({lim.get('zstd_variant')})"
    )
    log(table(recs))
    log("")
    notes = {r["loader"]: r["note"] for r in recs if r.get("note")}
    for loader, note in notes.items():
        log(f"note {loader}: {note}")
    if any(r.get("truncated") for r in recs):
        log(
            f"rates of cases marked 'extrapolated' come from the first {args.max_seconds:g} s of "
            "the epoch (samples timed / seconds), not from a whole epoch"
        )
    if "zarr-none" in info:
        refs = reference_records(args.workdir, batch_size=args.batch_size, seed=args.seed)
        recs.extend(refs)
    log(
        "shuffle quality (1.0 = a uniform shuffle's; recurrence n/a where no complete second "
        "epoch was read):"
    )
    log(quality_table(recs))
    log("")
    by = {r["case"]: r for r in recs}
    goals = goal_lines(by)
    for g in goals:
        log(g)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    result = {
        "config": {
            "rows": args.rows,
            "features": args.features,
            "row_bytes": row_bytes,
            "chunk_rows": args.chunk_rows,
            "batch_size": args.batch_size,
            "max_seconds": args.max_seconds,
            "seed": args.seed,
            "cpu_count": os.cpu_count(),
            "workdir": str(args.workdir),
        },
        "stores": info,
        "limits": lim,
        "cases": recs,
        "goals": goals,
    }
    out.write_text(json.dumps(result, indent=1, default=str))
    log(f"wrote {out}")
    if not args.no_plot:
        png = out.with_suffix(".png")
        plot([r for r in recs if not r.get("reference")], png)
        log(f"wrote {png}")
        comp = out.with_name(out.stem + "-composition.png")
        plot_composition(recs, comp, length=args.rows)
        log(f"wrote {comp}")


if __name__ == "__main__":
    main()
