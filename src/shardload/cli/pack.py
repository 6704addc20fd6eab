"""``shardload pack``: a store folder into one SquashFS image (see :mod:`shardload.move.pack`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from shardload.move.pack import COMPRESSIONS

PACK_HELP = """\
Pack a finished store folder into one read-only SquashFS image file (mksquashfs).
A store of thousands of chunk files becomes one file: on a parallel file system
with a slow metadata server (Lustre, GPFS, NFS) opening it is one metadata
operation instead of one per chunk, and copying it is one large sequential
transfer.

Read it by giving the image where a store is expected:

  shardload.open_store("era5.sqfs")        # also StreamingDataset("era5.sqfs")

which mounts it read-only with squashfuse at a private mount point (one mount
per node and image, shared by every process that opens it) and unmounts it
right after the last such process ends, however it ends (exit, exception,
SIGTERM, kill -9). Needs squashfs-tools here, and squashfuse, fusermount and
/dev/fuse where it is read.

The image is written under a temporary name beside IMAGE and renamed into place
when complete. A partial store (a prepare still running or interrupted) is
refused.

examples:
  shardload pack ~/.shardload/data/processed/era5 --to /scratch/$USER/era5.sqfs
  shardload pack era5 --to era5.sqfs --compression none --overwrite
"""


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``pack`` subcommand."""
    p = subparsers.add_parser(
        "pack",
        help="pack a store into one SquashFS image file (read back by open_store('X.sqfs'))",
        description=PACK_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", metavar="STORE", type=Path, help="a finished store folder")
    p.add_argument(
        "--to",
        required=True,
        type=Path,
        metavar="IMAGE",
        help="image file to write, e.g. era5.sqfs",
    )
    p.add_argument(
        "--compression",
        choices=COMPRESSIONS,
        default="zstd",
        help="how the image compresses its blocks (default zstd; 'none': raw, "
        "fastest to read; chunks already compressed by the store gain little)",
    )
    p.add_argument(
        "--block-size",
        type=_size,
        default=131072,
        metavar="BYTES",
        help="SquashFS block size, a power of two from 4K to 1M (default 128K; "
        "a read decodes whole blocks)",
    )
    p.add_argument(
        "--processors",
        type=int,
        default=None,
        metavar="N",
        help="threads mksquashfs uses (default all)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace IMAGE if it exists")
    p.set_defaults(func=run_pack)


def _size(text: str) -> int:
    units = {"k": 1 << 10, "m": 1 << 20}
    t = text.strip().lower().removesuffix("b").removesuffix("i")
    try:
        if t and t[-1] in units:
            return int(t[:-1]) * units[t[-1]]
        return int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a size in bytes: {text!r} (e.g. 131072, 128K, 1M)"
        ) from None


def run_pack(args: argparse.Namespace) -> int:
    from shardload.move.pack import pack

    image = pack(
        args.store,
        args.to,
        compression=args.compression,
        block_size=args.block_size,
        processors=args.processors,
        overwrite=args.overwrite,
    )
    print(f"packed {args.store} into {image} ({image.stat().st_size:,} bytes)", flush=True)
    return 0
