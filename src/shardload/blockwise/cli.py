"""``shardload compute CONFIG.yaml``: attributes block by block into a store."""

from __future__ import annotations

import argparse
from typing import Any


def register(sub: Any) -> None:
    p = sub.add_parser(
        "compute",
        help="compute attributes (functions of a block and its halo) of a source variable "
        "into a store, in bounded memory",
        description="Compute attributes block by block (as dask's map_overlap, bit for bit) into "
        "a store with one array per attribute. See docs/compute.md.",
    )
    p.add_argument("config", help="YAML config (source, attributes, chunks, out, execution)")
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config key (repeatable), e.g. --set execution.num_workers=4",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing output store")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--dry-run-jobs",
        action="store_true",
        help="scheduler jobqueue: print the batch job script dask-jobqueue would submit; "
        "submits and writes nothing",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from shardload.blockwise.engine import compute

    overrides = list(args.overrides) + (["overwrite=true"] if args.overwrite else [])
    if args.dry_run_jobs:
        import sys

        from shardload.blockwise.config import load_compute_config
        from shardload.prep.jobqueue import dry_run_text

        sys.stdout.write(dry_run_text(load_compute_config(args.config, overrides).execution))
        return 0
    m = compute(args.config, overrides, progress=False if args.no_progress else None)
    print(
        f"computed {len(m.arrays)} attribute(s) {sorted(m.arrays)}: {m.length} rows, "
        f"{m.num_chunks} chunk(s)"
    )
    return 0
