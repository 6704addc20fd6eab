"""``shardload prepare`` and ``shardload inspect``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from shardload.layout import PARTIAL_SUFFIX

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
  compression: auto                           # auto (lz4 where it shrinks) | lz4 | zstd | none
  out: era5-store

An interrupted run leaves OUT.partial and resumes when run again with the same config.
The whole config is checked before any file is written; --check stops there and prints the plan.
"""

#: ``--scheduler`` of prepare and copy (config ``execution.scheduler``; a literal here: the
#: config models import pydantic, which ``shardload --help`` should not wait for)
SCHEDULER_CHOICES = ("auto", "threads", "processes", "distributed", "jobqueue", "sync")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "prepare",
        help="raw files -> sharded store (from a YAML config)",
        description=PREPARE_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("config", help="YAML config file")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (dotted for nested keys, value parsed as YAML), e.g. "
        "--set chunk_rows=4096 --set execution.scheduler=processes; repeatable",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at 'out'")
    p.add_argument(
        "--scheduler",
        choices=SCHEDULER_CHOICES,
        help="shortcut for --set execution.scheduler=...",
    )
    p.add_argument("--workers", type=int, help="shortcut for --set execution.num_workers=N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the config and print the plan (length, arrays, chunks, bytes, "
        "splits) without writing anything; the source is opened lazily",
    )
    p.add_argument(
        "--dry-run-jobs",
        action="store_true",
        help="scheduler jobqueue: print the batch job script dask-jobqueue would "
        "submit (and how many jobs, workers, threads); submits and writes nothing",
    )
    p.set_defaults(func=cmd_prepare)

    c = sub.add_parser(
        "config-schema",
        help="print the JSON schema of prepare configs (for editors)",
        description="Print the JSON schema of the prepare config, e.g. for the YAML "
        "language server: shardload config-schema > shardload.schema.json",
    )
    c.set_defaults(func=cmd_config_schema)

    q = sub.add_parser(
        "inspect",
        help="summarise a store (length, arrays, chunks, splits, stats, size)",
        description="Print a store's manifest summary. STORE is a folder or a URL.",
    )
    q.add_argument("store", help="store folder or URL (http://..., s3://...)")
    q.add_argument("--json", action="store_true", help="machine-readable JSON")
    q.add_argument("--stats", action="store_true", help="show per-feature statistics (text mode)")
    q.set_defaults(func=cmd_inspect)


def cmd_prepare(args: argparse.Namespace) -> int:
    overrides = list(args.overrides)
    if args.overwrite:
        overrides.append("overwrite=true")
    if args.scheduler:
        overrides.append(f"execution.scheduler={args.scheduler}")
    if args.workers:
        overrides.append(f"execution.num_workers={args.workers}")
    if args.dry_run_jobs:
        from shardload.prep.config import load_config
        from shardload.prep.jobqueue import dry_run_text

        sys.stdout.write(dry_run_text(load_config(args.config, overrides).execution))
        return 0
    if args.check:
        from shardload.prep.config import load_config

        print(format_plan(check_plan(load_config(args.config, overrides))))
        return 0
    from shardload.prep.driver import prepare

    store = prepare(args.config, overrides=overrides, progress=False if args.no_progress else None)
    print(
        f"wrote {store.url}: {len(store)} samples, {store.num_chunks} chunks, arrays {list(store.arrays)}"
    )
    return 0


def cmd_config_schema(args: argparse.Namespace) -> int:
    from shardload.prep.config_models import config_schema

    json.dump(config_schema(), sys.stdout, indent=1)
    sys.stdout.write("\n")
    return 0


def check_plan(cfg: Any) -> dict[str, Any]:
    """What ``prepare`` would write for a valid config, computed without writing anything.

    Opens the source lazily (metadata only) to learn the view's length and arrays.
    """
    from shardload.plan.chunks import plan_blocks
    from shardload.prep.planning import plan_store_rows
    from shardload.prep.tasks import build_source

    view, source = build_source(cfg)
    plan = plan_store_rows(cfg, view, source=source)  # exactly as prepare plans it
    cfg, specs, length, row_bytes, bounds = plan[:5]
    chunk_rows = bounds.chunk_rows
    blocks = plan_blocks(bounds, cfg.shard_chunks) if cfg.shard_chunks else bounds
    splits, split_rows = plan.splits, plan.split_rows
    from shardload.prep.driver import out_location

    out = out_location(cfg.out)  # a ConfigError for a URL prepare cannot write
    if isinstance(out, str):  # s3://: --check sends no request
        out_exists = partial_exists = False
    else:
        out_exists = out.exists()
        partial_exists = out.with_name(out.name + PARTIAL_SUFFIX).exists()
    return {
        "out": str(out),
        "out_exists": out_exists,
        "partial_exists": partial_exists,
        "overwrite": cfg.overwrite,
        "length": length,
        "view": cfg.view,
        "sample_dims": list(cfg.sample_dims),
        "arrays": {
            k: {
                "shape": list(s.shape),
                "dtype": str(s.dtype),
                "row_bytes": s.row_bytes,
                **({"mean_length": s.mean_length} if s.ragged else {}),
            }
            for k, s in specs.items()
        },
        "chunk_rows": chunk_rows,
        "num_chunks": len(bounds) - 1,
        "num_blocks": len(blocks) - 1,
        "chunk_bytes": chunk_rows * row_bytes,
        "total_bytes": length * row_bytes,
        "format": cfg.format,
        "compression": cfg.compression,
        "compression_level": cfg.compression_level,
        "shard_chunks": cfg.shard_chunks,
        "splits": {
            k: {
                "chunks": len(v),
                "rows": split_rows[k][1] - split_rows[k][0]
                if k in split_rows
                else int(sum(bounds[i + 1] - bounds[i] for i in v)),
            }
            for k, v in splits.items()
        },
        "execution": cfg.execution.scheduler,
        "dates": _dates_plan(view, cfg, splits),
    }


def _dates_plan(view: Any, cfg: Any, splits: Any) -> dict[str, Any] | None:
    """A dated store's axis as planned (None for others): the gaps are known before writing,
    the all-NaN states only once the rows are read."""
    from shardload.prep.dated import show_dates
    from shardload.prep.views.dated import DatedView

    if not isinstance(view, DatedView):
        return None
    axis = view.dated.axis
    return {
        "start": str(axis.start),
        "end": str(axis.end),
        "frequency": axis.frequency_text,
        "gaps": len(axis.missing),
        "gap_dates": show_dates(axis, axis.missing),
        "statistics": cfg.dates.statistics or ("train" if "train" in splits else "all"),
        "tendencies": list(cfg.dates.tendencies),
    }


def _dates_lines(d: dict[str, Any] | None) -> list[str]:
    if d is None:
        return []
    gaps = (
        f"{d['gaps']} date(s) missing in the source ({d['gap_dates']})" if d["gaps"] else "no gap"
    )
    return [
        f"dates     {d['start']} to {d['end']} every {d['frequency']}; {gaps}",
        f"          statistics over {d['statistics']} (missing dates left out); "
        f"tendencies {d['tendencies']}",
    ]


def _shape_text(a: dict[str, Any]) -> str:
    return f"({a['shape'][0]}, *)" if "mean_length" in a else str(tuple(a["shape"]))


def format_plan(p: dict[str, Any]) -> str:
    """The plan of :func:`check_plan` as text."""
    lines = ["config is valid; nothing was written", f"out       {p['out']}"]
    if p["out_exists"]:
        what = (
            "would be replaced (overwrite: true)"
            if p["overwrite"]
            else "exists: prepare would refuse it (set overwrite: true)"
        )
        lines.append(f"          {what}")
    if p["partial_exists"]:
        lines.append(
            "          an unfinished run exists: prepare resumes it if the config and files are unchanged"
        )
    lines += [
        f"view      {p['view']} over sample dims {p['sample_dims']}",
        f"length    {p['length']} samples",
        *_dates_lines(p.get("dates")),
        "arrays",
        *(
            f"  {k:12s} {_shape_text(a):24s} {a['dtype']:8s} {a['row_bytes']} bytes/sample"
            + (
                f" (variable-length, mean {a['mean_length']:.1f} values)"
                if "mean_length" in a
                else ""
            )
            for k, a in p["arrays"].items()
        ),
        f"chunks    {p['num_chunks']} chunks of {p['chunk_rows']} rows "
        f"({p['chunk_bytes'] / 2**20:.2f} MiB each, uncompressed)"
        + (
            f", {p['num_blocks']} shards of {p['shard_chunks']} chunks" if p["shard_chunks"] else ""
        ),
        f"bytes     {p['total_bytes']:,} ({p['total_bytes'] / 2**30:.3f} GiB) before compression",
        f"format    {p['format']}, compression {p['compression']}"
        + (f" level {p['compression_level']}" if p["compression_level"] is not None else ""),
        "splits",
        *(f"  {k:12s} {v['chunks']} chunks, {v['rows']} rows" for k, v in p["splits"].items()),
        f"execution {p['execution']}",
    ]
    return "\n".join(lines)


def summary(store: Any) -> dict[str, Any]:
    from shardload.formats.base import is_local

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
                **({"ragged": dict(a.ragged)} if a.ragged is not None else {}),
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
    from shardload.store.core import open_store

    store = open_store(args.store)
    s = summary(store)
    if args.json:
        # strict JSON: a NaN statistic (an all-NaN feature) is null, never a bare NaN token
        json.dump(json_safe(s), sys.stdout, indent=1, allow_nan=False)
        sys.stdout.write("\n")
        return 0
    print(f"store     {s['url']}")
    comp, per = s["options"].get("compression", "?"), s["options"].get("array_compression")
    comp += ": " + ", ".join(f"{k} {v}" for k, v in per.items()) if per else ""  # auto's choice
    print(f"format    {s['format']} ({comp})   complete: {s['complete']}")
    print(f"length    {s['length']} samples in {s['num_chunks']} chunks of {s['chunk_rows']} rows")
    if s["size_bytes"] is not None:
        print(f"size      {s['size_bytes'] / 2**20:.1f} MiB on disk")
    print("arrays")
    for k, a in s["arrays"].items():
        rag = a.get("ragged")
        if rag:  # variable-length: samples, and the row lengths
            print(
                f"  {k:12s} {'(' + str(a['shape'][0]) + ', *)':24s} {a['dtype']}  variable-length: "
                f"rows of {rag['min_length']}-{rag['max_length']} values (mean "
                f"{rag['mean_length']:.1f}), {rag['num_values']} values"
            )
            continue
        print(f"  {k:12s} {tuple(a['shape'])!s:24s} {a['dtype']}")
    print("splits")
    for k, v in s["splits"].items():
        print(f"  {k:12s} {v['chunks']} chunks, {v['rows']} rows")
    if s["static"]:
        print(f"static    {', '.join(s['static'])}")
    print("stats (over all features: min of min / mean of mean / max of max; NaN count)")
    for k, st in s["stats"].items():
        import numpy as np

        mn, mean, mx = (
            _nan_or(f, st[key])
            for f, key in ((np.nanmin, "min"), (np.nanmean, "mean"), (np.nanmax, "max"))
        )
        print(f"  {k:12s} min {mn:.4g}  mean {mean:.4g}  max {mx:.4g}  NaN {st['nan_count']}")
        if args.stats:
            feats = store.manifest.arrays[k].features or [str(i) for i in range(len(st["mean"]))]
            for f, a, b, c, d in zip(
                feats, st["mean"], st["std"], st["min"], st["max"], strict=False
            ):
                print(f"      {f:32s} mean {a:.4g} std {b:.4g} min {c:.4g} max {d:.4g}")
    return 0


def _nan_or(reduce: Any, values: Any) -> float:
    """``reduce`` over the finite values; NaN (no warning) when there are none."""
    import numpy as np

    arr = np.asarray(values, dtype="f8")
    return float(reduce(arr)) if np.isfinite(arr).any() else float("nan")


def json_safe(obj: Any) -> Any:
    """A copy that ``json.dump(..., allow_nan=False)`` accepts: NaN and infinities -> None."""
    import math

    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if hasattr(obj, "item") and hasattr(obj, "dtype"):  # numpy scalar
        return json_safe(obj.item())
    return obj
