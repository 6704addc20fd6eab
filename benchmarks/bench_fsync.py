"""Ways to make N written files durable, on the disk under ``--dir`` (design.md, "A block is
durable before its record"): fsync each file in the writing thread (``inline``, what prepare
did), one fsync pass at the end (``end``, what an fsync after ``to_zarr`` does), and the
recorder's way (``deferred``: a background thread fsyncs each file while the writer goes on;
``+kick``: the writer first starts the kernel's writeback, ``sync_file_range``).

Usage: python benchmarks/bench_fsync.py [--dir DIR] [--files 40] [--mib 25] [--rounds 2]
"""

from __future__ import annotations

import argparse
import os
import queue
import tempfile
import threading
import time
from collections.abc import Callable

import numpy as np

from shardload.util.durable import fsync_path, start_writeback


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--files", type=int, default=40)
    ap.add_argument("--mib", type=int, default=25)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    folder = args.dir or tempfile.mkdtemp(prefix="bench-fsync-")
    os.makedirs(folder, exist_ok=True)
    buf = np.random.default_rng(0).integers(0, 255, args.mib << 20, dtype=np.uint8).tobytes()
    paths = [os.path.join(folder, f"f{i}") for i in range(args.files)]

    def write(path: str, kick: bool = False, sync: bool = False) -> None:
        with open(path, "wb") as f:
            f.write(buf)
            f.flush()
            if kick:
                start_writeback(f.fileno())
            if sync:
                os.fsync(f.fileno())

    def inline() -> None:
        for p in paths:
            write(p, sync=True)

    def end() -> None:
        for p in paths:
            write(p)
        for p in paths:
            fsync_path(p)

    def deferred(kick: bool) -> None:
        q: queue.Queue[str | None] = queue.Queue(8)

        def loop() -> None:
            while (p := q.get()) is not None:
                fsync_path(p)

        t = threading.Thread(target=loop)
        t.start()
        for p in paths:
            write(p, kick=kick)
            q.put(p)
        q.put(None)
        t.join()

    ways: dict[str, Callable[[], None]] = {
        "inline": inline,
        "end": end,
        "deferred+kick": lambda: deferred(True),
        "deferred": lambda: deferred(False),
    }
    for r in range(args.rounds):
        for name, fn in ways.items():
            for p in paths:
                if os.path.exists(p):
                    os.unlink(p)
            os.sync()
            t = time.perf_counter()
            fn()
            dt = time.perf_counter() - t
            print(f"round {r + 1} {name}: {len(paths) * len(buf) / dt / 1e6:.0f} MB/s", flush=True)
    for p in paths:
        os.unlink(p)


if __name__ == "__main__":
    main()
