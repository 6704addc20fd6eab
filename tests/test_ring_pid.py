"""A DataLoader worker's hand-off of each batch through the shared ring asks the kernel for
its pid once, not twice a batch (issue 25): system calls counted in a forked worker."""

from __future__ import annotations

import os

import numpy as np

from shardload.load.ring import BatchRing


def test_a_worker_hands_batches_through_the_ring_without_asking_its_pid_each_time(monkeypatch):
    """Claiming a slot and sending its batch need the worker's pid (its slot mark); a forked
    worker asks the kernel for it once, not twice a batch."""
    ring = BatchRing({"x": ((3,), np.dtype("f4")), "index": ((), np.dtype("i8"))}, 4, slots=8)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # a worker
        code = 1
        try:
            calls = [0]
            real = os.getpid

            def counted() -> int:
                calls[0] += 1
                return real()

            os.getpid = counted
            for _ in range(40):
                batch = ring.allocate(4)
                slot = ring.slot_of(batch)
                ring.sent(slot)
                ring.free(slot)
            os.write(w, str(calls[0]).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    got = os.read(r, 64)
    os.close(r)
    os.waitpid(pid, 0)
    assert int(got) <= 1  # the slot mark's start time is read once per process
