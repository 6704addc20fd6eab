"""Does a DataLoader worker ever get a ring slot the main process holds? A race count.

The shared-memory ring (``shardload.load.ring``) hands each batch from a worker to the main
process in a slot; a worker that finds no free slot reclaims the slots of dead workers while
the main process leases slots at the same time. Here a forked worker claims on a full ring for
``--seconds`` (each claim runs that reclaim) while the main process leases, again and again, a
slot the (live) worker sent; slot 0 is held by the main process all along. Every slot is
taken, so a claim that gets one was handed a slot the main process holds (or is taking): its
batch would be overwritten while the training loop reads it. Prints the claims, the slots
handed out that way, and the leases.

Usage::

    python benchmarks/bench_ring_race.py --seconds 10
    PYTHONPATH=/tmp/before/src python benchmarks/bench_ring_race.py   # another tree
"""

from __future__ import annotations

import argparse
import inspect
import os
import time

import numpy as np

from shardload.load.ring import BatchRing


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    secs = ap.parse_args().seconds
    ring = BatchRing({"x": ((4,), np.dtype("f4"))}, 4, slots=4)
    flags = np.asarray(ring._flags)
    flags[0] = -1  # the training loop holds slot 0 before the worker starts
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: its mark on slots 1-3 (batches sent), then claims in a loop
        mark = ring._me()
        flags[1:] = mark
        os.write(w, mark.to_bytes(8, "little", signed=True))
        claims = got = 0
        end = time.monotonic() + secs
        while time.monotonic() < end:
            claims += 1
            slot = ring.claim()
            if slot is not None:  # a held slot handed out: count it, put it back as it was
                got += 1
                flags[slot] = -1 if slot == 0 else mark
        os.write(w, f"{claims} {got}".encode())
        os._exit(0)
    mark = int.from_bytes(os.read(r, 8), "little", signed=True)
    # a lease's end never frees slot 1 here: it goes straight back to the worker's mark
    ring._consumed = lambda slot: None  # type: ignore[method-assign]
    with_mark = "mark" in inspect.signature(ring.lease).parameters  # trees before 2026-11-29
    leases = 0
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        held = ring.lease(1, 4, mark) if with_mark else ring.lease(1, 4)
        leases += 1
        del held
        flags[1] = mark  # the worker's again, as if it filled and sent it once more
    claims, got = os.read(r, 100).decode().split()
    print(f"claims={claims} held_slots_handed_out={got} leases={leases}")


if __name__ == "__main__":
    main()
