"""``shardload verify STORE``: check every chunk of a store against its recorded checksums."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from shardload.errors import ShardloadError

HELP = """\
Check every chunk of a store against the checksums recorded when it was
written (checksums.npz beside shardload.json): npy chunk files and Zarr chunk or
shard files are hashed whole, HDF5 chunks are read and their rows hashed.
Prints one line per bad chunk, naming the array, the chunk and the file, and
exits with status 1 if any is bad (0: all good; 2: the store cannot be opened).

A store without checksums (written before they existed, or plain Zarr data) is
checked by reading every chunk instead (a missing chunk of plain Zarr data
reads as its fill value, as zarr reads it).

example:
  shardload verify ~/.shardload/data/processed/era5
"""


@dataclass(frozen=True)
class Problem:
    array: str
    unit: int
    message: str


def verify_store(store: Any, *, threads: int = 4) -> Iterator[tuple[str, int, Problem | None]]:
    """Check every checksum unit of every array of ``store`` (opened with ``verify="always"``);
    yields ``(array, unit, problem or None)`` in order."""
    ragged = set(store.ragged)  # variable-length arrays: their own reader (formats/ragged.py)

    def reader(a: str) -> Any:
        return store.ragged_reader if a in ragged else store.reader

    names = getattr(store.reader, "stored_arrays", store.arrays)  # at_load windows: the series
    jobs = [(a, k) for a in names for k in range(reader(a).checksum_units(a))]

    def check(job: tuple[str, int]) -> tuple[str, int, Problem | None]:
        a, k = job
        try:
            reader(a).check_unit(a, k)
        except ShardloadError as exc:
            return a, k, Problem(a, k, str(exc))
        return a, k, None

    with ThreadPoolExecutor(max_workers=max(1, threads)) as pool:
        yield from pool.map(check, jobs)


def run(args: argparse.Namespace) -> int:
    from shardload.store.core import open_store

    t0 = time.perf_counter()
    store = open_store(args.store, verify="always")
    layout = store.manifest.provenance.get("layout")  # e.g. an anemoi-datasets store
    how = (
        f"{store.manifest.checksums} checksums"
        if store.manifest.checksums
        else f"no checksums{f' (an {layout} store has none)' if layout else ' recorded'}: "
        "reading every chunk"
    )
    print(f"verifying {store.url} ({store.manifest.format}, {how})", flush=True)
    bad: list[Problem] = []
    units = 0
    for _, _, problem in verify_store(store, threads=args.threads):
        units += 1
        if problem is not None:
            bad.append(problem)
            print(f"BAD {problem.array} {problem.unit}: {problem.message}", flush=True)
    dt = time.perf_counter() - t0
    verdict = f"{len(bad)} bad" if bad else "all good"
    print(
        f"{units} chunk file(s)/chunk(s) of {len(store.arrays)} array(s) checked in {dt:.1f} s: {verdict}"
    )
    return 1 if bad else 0


def register(sub: Any) -> None:
    p = sub.add_parser(
        "verify",
        help="check every chunk of a store against its checksums",
        description=HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("store", help="a store folder or URL")
    p.add_argument(
        "--threads",
        type=int,
        default=min(4, os.cpu_count() or 1),
        help="chunks checked at once (default: min(4, CPUs))",
    )
    p.set_defaults(func=run)


if __name__ == "__main__":  # pragma: no cover
    from shardload.cli.app import main

    sys.exit(main(["verify", *sys.argv[1:]]))
