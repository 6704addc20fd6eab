"""``shardload bench formats``: which on-disk format, mmap or not, fixed or variable length,
shuffled or not, how many workers — measured on this machine.

One seeded dataset (fixed length, then variable length) is written in every format of
``CASES`` (:mod:`~shardload.bench.format_cases`); each format is then read for one epoch per
setting, every sample checked against the one written (``format_epoch``), by
:func:`~shardload.bench.format_run.run_formats`. The read limit is measured in the same run: a
large sequential read of the npy stack's data file from the page cache. Results go to
``OUT/results.json`` (one row per epoch), ``OUT/report.md`` and PNG plots (``format_report``).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from shardload.bench.format_cases import FORMAT_NAMES, select_cases
from shardload.bench.format_run import run_formats
from shardload.bench.format_squashfs import squashfs_unavailable
from shardload.errors import ConfigError

__all__ = ["register", "run_formats", "select_cases", "squashfs_unavailable"]


def parse_workers(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--workers: expected comma-separated integers, got {text!r}") from None
    if not workers or min(workers) < 0:
        raise ConfigError(f"--workers: expected integers >= 0, got {text!r}")
    return sorted(set(workers))


def _run(args: argparse.Namespace) -> int:
    workers = parse_workers(args.workers)
    for option, value, low in (
        ("--samples", args.samples, 1),
        ("--sample-bytes", args.sample_bytes, 4),
        ("--batch-size", args.batch_size, 1),
        ("--max-epoch-seconds", args.max_epoch_seconds, 1e-9),
    ):
        if value < low:
            raise ConfigError(f"{option} must be >= {low:g}, got {value}")
    cases = select_cases(args.formats.split(",") if args.formats else None)
    rows = run_formats(
        Path(args.out),
        num_samples=args.samples,
        sample_bytes=args.sample_bytes,
        workers=workers,
        batch_size=args.batch_size,
        seed=args.seed,
        max_epoch_s=args.max_epoch_seconds,
        cases=cases,
        keep_data=args.keep_data,
        progress=not args.no_progress,
    )
    print(f"{len(rows)} epochs measured: {Path(args.out) / 'report.md'}")
    return 0


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``shardload bench formats`` to the ``bench`` subcommands."""
    p = kinds.add_parser(
        "formats",
        help="storage formats x mmap x fixed/variable length x shuffle x workers",
        description="Write one generated dataset as a directory of .npy files, an npy stack, "
        "Zarr v3 (unsharded/sharded, none/zstd), HDF5, Arrow IPC, Parquet, WebDataset tar "
        "shards and a SquashFS image of the npy stack, then time one checked epoch per setting "
        "(mmap on/off, fixed/variable length, shuffle on/off, DataLoader workers). Writes "
        "OUT/results.json, OUT/report.md and PNG plots.",
    )
    p.add_argument("--samples", type=int, default=1024, help="samples per dataset (default 1024)")
    p.add_argument(
        "--sample-bytes",
        type=int,
        default=65536,
        help="bytes per sample (the mean for variable length; default 65536)",
    )
    p.add_argument("--workers", default="0,2", help="DataLoader worker counts (default 0,2)")
    p.add_argument("--out", default="bench-formats", help="output folder (default bench-formats)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of lengths, values and shuffles")
    p.add_argument(
        "--formats",
        default=None,
        help=f"comma-separated subset of {','.join(FORMAT_NAMES)} (default: all)",
    )
    p.add_argument(
        "--max-epoch-seconds",
        type=float,
        default=10.0,
        help="stop an epoch after this long and report its rate as capped (default 10)",
    )
    p.add_argument("--keep-data", action="store_true", help="keep OUT/data (the written formats)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
