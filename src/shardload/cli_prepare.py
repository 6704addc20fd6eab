"""``shardload prepare`` and ``shardload inspect``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

log = logging.getLogger("shardload")

PREPARE_HELP = """\
Prepare raw files into a sharded store, as described by CONFIG.yaml.

Minimal config (all keys: docs/config.md):
  source: {paths: [era5-levels-members.nc]}   # files, globs, folders or URLs
  sample_dims: [number, time]                 # stacked into one sample axis
  view: flat                                  # flat | graph | window | pkg.mod:function
  arrays: {x: [t, z]}                         # flattened after the sample axis, concatenated
  chunk_rows: 8                               # or target_chunk_bytes: 16MiB
  format: zarr                                # zarr | npy | hdf5
  compression: lz4                            # none | zstd | lz4
  out: era5-store

An interrupted run leaves OUT.partial and resumes when run again with the same config.
"""


def register(sub: Any) -> None:
    p = sub.add_parser("prepare", help="raw files -> sharded store (from a YAML config)",
                       description=PREPARE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("config", help="YAML config file")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config key (dotted for nested keys, value parsed as YAML), e.g. "
                   "--set chunk_rows=4096 --set execution.scheduler=processes; repeatable")  # fmt: skip
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at 'out'")
    p.add_argument("--scheduler", choices=["threads", "processes", "distributed", "jobqueue", "sync"],
                   help="shortcut for --set execution.scheduler=...")  # fmt: skip
    p.add_argument("--workers", type=int, help="shortcut for --set execution.num_workers=N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_prepare)

    q = sub.add_parser("inspect", help="summarise a store (length, arrays, chunks, splits, stats, size)",
                       description="Print a store's manifest summary. STORE is a folder or a URL.")  # fmt: skip
    q.add_argument("store", help="store folder or URL (http://..., s3://...)")
    q.add_argument("--json", action="store_true", help="machine-readable JSON")
    q.add_argument("--stats", action="store_true", help="show per-feature statistics (text mode)")
    q.set_defaults(func=cmd_inspect)


def cmd_prepare(args: argparse.Namespace) -> int:
    from .pipeline import prepare

    overrides = list(args.overrides)
    if args.overwrite:
        overrides.append("overwrite=true")
    if args.scheduler:
        overrides.append(f"execution.scheduler={args.scheduler}")
    if args.workers:
        overrides.append(f"execution.num_workers={args.workers}")
    store = prepare(args.config, overrides=overrides, progress=False if args.no_progress else None)
    print(
        f"wrote {store.url}: {len(store)} samples, {store.num_chunks} chunks, arrays {list(store.arrays)}"
    )
    return 0


def summary(store: Any) -> dict[str, Any]:
    from .formats.base import is_local

    m = store.manifest
    size = None
    try:
        size = int(store.fs.du(store.root)) if is_local(store.fs) else None
    except Exception:
        size = None
    return {
        "url": store.url,
        "format": m.format,
        "complete": m.complete,
        "length": m.length,
        "num_chunks": m.num_chunks,
        "chunk_rows": m.chunk_rows,
        "arrays": {
            k: {
                "shape": list(a.shape),
                "dtype": a.dtype,
                "chunk_rows": a.chunk_rows,
                "num_features": len(a.features) if a.features else None,
            }
            for k, a in m.arrays.items()
        },
        "splits": {
            k: {
                "chunks": len(v),
                "rows": m.split_num_rows(k),
            }
            for k, v in m.splits.items()
        },
        "stats": {
            k: {
                "count": s.count,
                "nan_count": int(sum(s.nan_count)),
                "mean": list(s.mean),
                "std": list(s.std),
                "min": list(s.min),
                "max": list(s.max),
            }
            for k, s in m.stats.items()
        },
        "static": sorted(m.static),
        "options": dict(m.options),
        "size_bytes": size,
        "shardload_version": m.shardload_version,
    }


def cmd_inspect(args: argparse.Namespace) -> int:
    from .store import open_store

    store = open_store(args.store)
    s = summary(store)
    if args.json:
        json.dump(s, sys.stdout, indent=1, default=_nan_safe)
        sys.stdout.write("\n")
        return 0
    print(f"store     {s['url']}")
    print(
        f"format    {s['format']} ({s['options'].get('compression', '?')})   complete: {s['complete']}"
    )
    print(f"length    {s['length']} samples in {s['num_chunks']} chunks of {s['chunk_rows']} rows")
    if s["size_bytes"] is not None:
        print(f"size      {s['size_bytes'] / 2**20:.1f} MiB on disk")
    print("arrays")
    for k, a in s["arrays"].items():
        print(f"  {k:12s} {tuple(a['shape'])!s:24s} {a['dtype']}")
    print("splits")
    for k, v in s["splits"].items():
        print(f"  {k:12s} {v['chunks']} chunks, {v['rows']} rows")
    if s["static"]:
        print(f"static    {', '.join(s['static'])}")
    print("stats (over all features: min of min / mean of mean / max of max; NaN count)")
    for k, st in s["stats"].items():
        import numpy as np

        mn, mean, mx = np.nanmin(st["min"]), np.nanmean(st["mean"]), np.nanmax(st["max"])
        print(f"  {k:12s} min {mn:.4g}  mean {mean:.4g}  max {mx:.4g}  NaN {st['nan_count']}")
        if args.stats:
            feats = store.manifest.arrays[k].features or [str(i) for i in range(len(st["mean"]))]
            for f, a, b, c, d in zip(
                feats, st["mean"], st["std"], st["min"], st["max"], strict=False
            ):
                print(f"      {f:32s} mean {a:.4g} std {b:.4g} min {c:.4g} max {d:.4g}")
    return 0


def _nan_safe(o: Any) -> Any:
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
