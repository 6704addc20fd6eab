"""Reading an anemoi-datasets store: shardload's loader against anemoi's own reads.

Builds a store with ``anemoi-datasets create`` (the venv of ``make anemoi-venv``, through
``tests/anemoi_helpers.py``): 240 dates every 6 h, one missing, 4 variables on a 100 x 200
grid (320 KB a row), unless ``--dates`` / ``--grid``; ``--members E`` adds E ensemble members
(anemoi chunks ``data`` one date and one member at a time). Then times, best of ``--passes``
passes over the dates that are not missing, each reader in a fresh process:

- ``shardload``: ``iter_batches(store, batch_size=8)``, the default shuffle, one process;
- ``shardload-zarr-python``: the same with every read through zarr-python (the path of
  chunks that split a date by member until 2026-11-28);
- ``anemoi``: ``open_dataset(path)[i]`` for every date in a shuffled order.

Usage::

    python benchmarks/bench_anemoi.py                       # the figures of docs/weather.md
    python benchmarks/bench_anemoi.py --dates 120 --grid 50 100 --passes 3
    python benchmarks/bench_anemoi.py --members 4 --shardload-src /work/main/src  # another tree
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

SHARDLOAD = """
import sys, time
import shardload
if sys.argv[3] == "zarr-python":
    import shardload.formats.zarr.read as zr
    zr.load_chunk_layout = lambda *a, **k: None  # every read through zarr-python
store = shardload.open_store(sys.argv[1])
best = []
for epoch in range(int(sys.argv[2])):
    t = time.perf_counter(); n = 0
    for b in shardload.iter_batches(store, batch_size=8, epoch=epoch):
        n += len(b["index"])
    best.append(time.perf_counter() - t)
print(n, min(best))
"""

ANEMOI = """
import sys, time
import numpy as np
from anemoi.datasets import MissingDateError, open_dataset
ds = open_dataset(sys.argv[1])
best = []
for rep in range(int(sys.argv[2])):
    t = time.perf_counter(); n = 0
    for i in np.random.default_rng(rep).permutation(len(ds)):
        try:
            ds[int(i)]
            n += 1
        except MissingDateError:
            pass
    best.append(time.perf_counter() - t)
print(n, min(best))
"""


def run(python: str, script: str, *args: str, src: Path = REPO / "src") -> tuple[int, float]:
    env = {"PYTHONPATH": str(src)}
    res = subprocess.run(
        [python, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **env},
    )
    n, seconds = res.stdout.split()[-2:]
    return int(n), float(seconds)


def main() -> None:
    from anemoi_helpers import GriddedSpec, build_store, require_anemoi

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dates", type=int, default=240)
    p.add_argument("--grid", type=int, nargs=2, default=(100, 200))
    p.add_argument("--passes", type=int, default=5)
    p.add_argument("--members", type=int, default=None, help="ensemble members (default none)")
    p.add_argument("--shardload-src", type=Path, default=REPO / "src", help="the shardload to time")
    args = p.parse_args()
    anemoi_python = str(require_anemoi())
    spec = GriddedSpec(
        length=args.dates,
        variables=("t2m", "msl", "u10", "v10"),
        grid=tuple(args.grid),
        missing=("2020-01-05T00:00:00",),
        members=args.members,
    )
    with tempfile.TemporaryDirectory() as tmp:
        path = str(build_store(Path(tmp), spec, name="bench.zarr"))
        rows = []
        for name, python, script, how in (
            ("shardload", sys.executable, SHARDLOAD, "native"),
            ("shardload-zarr-python", sys.executable, SHARDLOAD, "zarr-python"),
            ("anemoi", anemoi_python, ANEMOI, ""),
        ):
            extra = [how] if how else []
            n, seconds = run(python, script, path, str(args.passes), *extra, src=args.shardload_src)
            rows.append(f"| {name} | {n} | {seconds:.2f} | {n / seconds:.0f} |")
    print(f"| reader | dates | best of {args.passes} passes, s | dates/s |\n|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
