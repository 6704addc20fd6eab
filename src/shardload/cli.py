"""The ``shardload`` command line. Each subcommand lives in its own module (``cli_*.py`` or the
feature module) exposing ``register(subparsers)``; this file only assembles them."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence

from . import __version__
from .errors import ShardloadError

# module path -> registers one or more subcommands (imported lazily at parser build time)
COMMAND_MODULES = (
    "shardload.samples.cli",
    "shardload.cli_prepare",
    "shardload.cli_demo",
    "shardload.cli_move",
    "shardload.cli_pack",
    "shardload.cli_verify",
    "shardload.blockwise.cli",
    "shardload.train.cli_train",
    "shardload.bench.cli",
)

log = logging.getLogger("shardload")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="shardload",
        description="Prepare raw scientific array files (netCDF/HDF5/GRIB/Zarr) into sharded, "
        "ML-ready stores and stream them into training. Run 'shardload COMMAND --help' for details.",
    )
    parser.add_argument("--version", action="version", version=f"shardload {__version__}")
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, help="more logging (-vv: debug)"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in COMMAND_MODULES:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name and exc.name.startswith("shardload"):
                continue  # subcommand not built into this version
            raise
        module.register(sub)
    return parser


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    logging.basicConfig(
        level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S"
    )
    if verbose < 2:
        for noisy in ("distributed", "asyncio", "fsspec", "numcodecs", "urllib3", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    try:
        return int(args.func(args) or 0)
    except ShardloadError as exc:
        print(f"shardload {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"shardload {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (``shardload inspect | head``): stop quietly, as ``cat`` does;
        # point stdout at /dev/null so the interpreter's final flush does not fail again
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 141
