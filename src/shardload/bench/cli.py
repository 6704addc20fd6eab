"""``shardload bench KIND``: assembles the benchmark subcommands of this package."""

from __future__ import annotations

import argparse
import importlib

# module path -> registers one subcommand of ``shardload bench`` (imported at parser build time)
BENCH_MODULES: tuple[str, ...] = (
    "shardload.bench.formats",
    "shardload.bench.loaders",
)


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add the ``bench`` command and each benchmark of ``BENCH_MODULES`` under it."""
    bench = subparsers.add_parser(
        "bench",
        help="benchmarks to run on your machine (storage formats, loaders)",
        description="Measure, on this machine, what the choices cost: storage formats and "
        "loader settings. Each benchmark writes results.json, report.md and plots.",
    )
    kinds = bench.add_subparsers(dest="kind", metavar="KIND")
    kinds.required = True
    for mod in BENCH_MODULES:
        try:
            module = importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name == mod:
                continue  # benchmark not built into this version
            raise
        module.register(kinds)
