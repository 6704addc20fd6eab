"""The ``shardload`` command line. Each subcommand lives in its own module (``cli_*.py`` or the
feature module) exposing ``register(subparsers)``; this file only assembles them."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from shardload.errors import ShardloadError
from shardload.version import __version__

# module path -> registers one or more subcommands (imported lazily at parser build time)
COMMAND_MODULES = (
    "shardload.samples.cli",
    "shardload.cli.prepare",
    "shardload.cli.copy",
    "shardload.cli.demo",
    "shardload.cli.move",
    "shardload.cli.pack",
    "shardload.cli.verify",
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
        # distributed sets its loggers' levels from dask's config when it is imported (later,
        # and again in its worker processes, which inherit the environment): INFO by default
        # (-q: errors only, whatever the environment says: a Ctrl-C makes each worker warn
        # about its cancelled tasks; without -q a level the user set is kept)
        if quiet:
            os.environ["DASK_LOGGING__DISTRIBUTED"] = "error"
        else:
            os.environ.setdefault("DASK_LOGGING__DISTRIBUTED", "warning")
        for noisy in ("distributed", "asyncio", "fsspec", "numcodecs", "urllib3", "aiohttp.access"):
            logging.getLogger(noisy).setLevel(logging.WARNING)


#: ``SHARDLOAD_LOG=off`` (or 0/no/false): no per-command log file.
LOG_ENV = "SHARDLOAD_LOG"
run_log = logging.getLogger("shardload.command")
run_log.propagate = False
run_log.setLevel(logging.INFO)


def open_command_log(command: str, verbose: int = 0) -> tuple[Path, logging.Handler] | None:
    """A log file for this command run, ``$SHARDLOAD_HOME/logs/COMMAND-YYYYmmdd-HHMMSS-PID.log``,
    attached to the root logger (INFO, DEBUG with ``-vv``, whatever the console shows); None
    when ``SHARDLOAD_LOG`` is off or the folder cannot be written (a warning says so)."""
    from shardload.util.home import home_dir

    if os.environ.get(LOG_ENV, "").strip().lower() in ("0", "off", "no", "false"):
        return None
    folder = home_dir() / "logs"
    path = folder / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(path, encoding="utf-8")
    except OSError as exc:
        log.warning("no log file for this run: %s", exc)
        return None
    handler.setLevel(logging.DEBUG if verbose > 1 else logging.INFO)
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%Y-%m-%d %H:%M:%S")
    )
    root = logging.getLogger()
    for h in root.handlers:  # the console keeps its level when the root's is lowered
        if h.level == logging.NOTSET:
            h.setLevel(root.level)
    root.addHandler(handler)
    root.setLevel(min(root.level or logging.WARNING, handler.level))
    run_log.addHandler(handler)  # the command line and exit status: the file only
    return path, handler


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    setup_logging(args.verbose, args.quiet)
    opened = open_command_log(args.command, args.verbose)
    rc = 1
    try:
        cmd = " ".join(sys.argv[1:] if argv is None else argv)
        run_log.info("shardload %s", cmd)
        rc = _run(args)
        return rc
    except Exception:
        run_log.exception("shardload %s failed", args.command)
        raise
    finally:
        if opened is not None:
            path, handler = opened
            run_log.info("exit status %d", rc)
            logging.getLogger().removeHandler(handler)
            run_log.removeHandler(handler)
            handler.close()
            if rc != 0 or not args.quiet:
                print(f"shardload {args.command}: log in {path}", file=sys.stderr)


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args) or 0)
    except ShardloadError as exc:
        run_log.error("%s", exc)
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
