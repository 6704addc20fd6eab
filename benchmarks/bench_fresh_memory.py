"""What touching fresh memory costs on this machine: first touch of memory that has been free
for a while, against memory freed a moment ago.

On a VM whose balloon driver reports free pages to the host ("Free page reporting enabled" in
``dmesg``), memory that stayed free for a few seconds is taken back by the host, and touching
it again costs several times more: a fresh process's (or DataLoader worker's) first buffers pay
it, memory reused within seconds does not (docs/benchmarks.md, session 11).

Usage: ``python benchmarks/bench_fresh_memory.py [--mib 400] [--idle 8]``
"""

from __future__ import annotations

import argparse
import mmap
import time

import numpy as np


def touch(nbytes: int) -> float:
    """Seconds to write one byte per page of ``nbytes`` of fresh anonymous memory (huge pages
    allowed, as numpy asks for large arrays), then free it."""
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE)
    a = np.frombuffer(m, np.uint8)
    t = time.perf_counter()
    a[:: mmap.PAGESIZE] = 1
    dt = time.perf_counter() - t
    del a
    m.close()
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--mib", type=int, default=400, help="memory touched per step")
    ap.add_argument(
        "--idle", type=float, default=8.0, help="seconds left free before the last steps"
    )
    args = ap.parse_args()
    n = args.mib << 20
    steps = [
        ("first touch", touch(n)),
        ("right after freeing", touch(n)),
        ("right after freeing", touch(n)),
    ]
    time.sleep(args.idle)
    steps += [(f"after {args.idle:g} s free", touch(n)), ("right after freeing", touch(n))]
    for label, dt in steps:
        print(
            f"{label:>24}: {dt * 1e3:7.0f} ms per {args.mib} MiB ({dt * 1e3 / args.mib:.3f} ms per MiB)"
        )
    warm = min(dt for label, dt in steps if label == "right after freeing")
    print(f"memory free for {args.idle:g} s costs {steps[3][1] / warm:.1f}x memory just freed")


if __name__ == "__main__":
    main()
