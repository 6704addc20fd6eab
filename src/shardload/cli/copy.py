"""``shardload copy SRC DST``."""

from __future__ import annotations

import argparse
from typing import Any

from shardload.cli.prepare import SCHEDULER_CHOICES

COPY_HELP = """\
Copy the store SRC (a folder or URL; any format: zarr, sharded zarr, npy, hdf5; plain Zarr
data too) into DST, rewritten in the layout 'prepare' writes by default, or the one the
options give (prepare's config keys of the same names). Every array, row, dtype, attr and
feature name is copied, values equal; splits keep their rows, and statistics, static data and
sample coordinates are carried.

Splits are sets of whole chunks: the new chunks keep every split boundary of SRC (planned
chunk rows shrink to fit; a --chunk-rows that would cut a split is refused, naming a fit).

Like prepare, the copy writes DST.partial (locked: a second copy into the same DST is
refused), records each block with its checksums, and publishes DST when complete. An
interrupted copy resumes when run again with the same options. SRC is read with its
checksums verified. DST may be s3://bucket/prefix (written locally, then uploaded with the
manifest last; credentials and endpoint from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_ENDPOINT_URL; docs/moving.md, "S3 and S3-compatible storage").

Examples:
  shardload copy old-store new-store                  # prepare's default layout
  shardload copy http://host:8000/era5 era5 --chunk-rows 256 --compression zstd --shard-chunks 64
  shardload copy era5 era5-npy --format npy           # raw npy chunks (compression none)

In Python: shardload.copy(src, dst, chunk_rows=..., ...). More: docs/moving.md.
"""


def register(sub: Any) -> None:
    p = sub.add_parser(
        "copy",
        help="rewrite a store (any format, by URL too) in the default or a given layout",
        description=COPY_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("src", metavar="SRC", help="source store: a folder or URL (http://, s3://...)")
    p.add_argument("dst", metavar="DST", help="the new store's folder, or s3://bucket/prefix")
    p.add_argument("--chunk-rows", type=int, metavar="N", help="rows per chunk (config chunk_rows)")
    p.add_argument(
        "--target-chunk-bytes",
        metavar="SIZE",
        help="chunk size to plan rows from, e.g. 16MiB (config target_chunk_bytes)",
    )
    p.add_argument("--format", help="zarr | npy | hdf5 (config format; default zarr)")
    p.add_argument(
        "--compression",
        help="auto | none | zstd | lz4 (config compression; default: the format's)",
    )
    p.add_argument(
        "--compression-level", type=int, metavar="L", help="0-9 (config compression_level)"
    )
    p.add_argument(
        "--shard-chunks",
        type=int,
        metavar="K",
        help="chunks per Zarr shard file (config shard_chunks)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing store at DST")
    p.add_argument(
        "--scheduler",
        choices=SCHEDULER_CHOICES,
        help="who writes the blocks (config execution.scheduler)",
    )
    p.add_argument("--workers", type=int, help="config execution.num_workers")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        default=argparse.SUPPRESS,  # 'shardload -q copy' sets it too
        help="only warnings and errors, no progress bar",
    )
    p.set_defaults(func=cmd_copy)


def cmd_copy(args: argparse.Namespace) -> int:
    from shardload.prep.copy import copy_store

    execution: dict[str, Any] = {}
    if args.scheduler:
        execution["scheduler"] = args.scheduler
    if args.workers:
        execution["num_workers"] = args.workers
    quiet = args.no_progress or getattr(args, "quiet", False)
    store = copy_store(
        args.src,
        args.dst,
        overwrite=args.overwrite,
        progress=False if quiet else None,
        execution=execution or None,
        format=args.format,
        compression=args.compression,
        compression_level=args.compression_level,
        chunk_rows=args.chunk_rows,
        target_chunk_bytes=args.target_chunk_bytes,
        shard_chunks=args.shard_chunks,
    )
    m = store.manifest
    if not getattr(args, "quiet", False):
        print(
            f"copied {args.src} -> {store.url}: {len(store)} samples, {store.num_chunks} chunks "
            f"of {m.chunk_rows} rows, format {m.format} compression {m.options.get('compression')}"
            f"{' shards of ' + str(m.options['shard_chunks']) if m.options.get('shard_chunks') else ''}"
        )
    return 0
