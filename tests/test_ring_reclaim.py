"""A worker that finds the shared-memory ring full reclaims the slots of dead workers
(:meth:`shardload.load.ring.BatchRing.claim`); the main process leases slots meanwhile, without
waiting for it before 2026-11-29. No slot the main process holds, or is about to take a batch
from, may go to a worker to overwrite (a CI run once saw a held batch's rows replaced by a
later batch's: tests/test_ring_views.py)."""

from __future__ import annotations

import os
import pickle

import numpy as np
import pytest

from shardload.load import ring as ring_mod
from shardload.load.ring import BatchRing

SPECS = {"x": ((3,), np.dtype("f4")), "index": ((), np.dtype("i8"))}


def _sent(ring: BatchRing, rows: int = 4) -> int:
    """A worker's side: allocate a batch, hand it out; its slot."""
    out = ring.allocate(rows)
    assert out is not None
    slot = ring.slot_of(out)
    assert slot is not None
    ring.sent(slot)
    return slot


def test_a_lease_while_a_worker_reclaims_keeps_every_slot_the_consumer_holds(monkeypatch):
    """Slot 0 is the consumer's (flag -1); slots 1-3 hold batches a live worker sent. A worker
    finding the ring full reclaims dead workers' slots, and the consumer leases slot 1 while
    it does: between its reads of the header, or while it asks whether a mark's process lives
    (a worker preempted on a loaded machine leaves it that long). The code before read the
    flags twice: the second read saw the new -1, which as a mark is no live process's, and
    every slot the consumer held came free (slot 0 went to the next claim)."""
    ring = BatchRing(SPECS, 4, slots=4)
    assert [_sent(ring) for _ in range(4)] == [0, 1, 2, 3]
    held = ring.lease(0, 4)  # the training loop holds this batch
    raw = np.asarray(ring._flags)  # the shared header, written as the main process writes it
    mark = int(raw[1])
    leased = []

    def lease_slot_1() -> None:  # the consumer leases slot 1 now (as before: no lock)
        if not leased:
            leased.append(True)
            raw[1] = -1

    class LeaseOnSecondRead(np.ndarray):
        """The header as the reclaim reads it: the lease lands just before its second read."""

        reads = 0

        def _read(self) -> np.ndarray:
            LeaseOnSecondRead.reads += 1
            if LeaseOnSecondRead.reads == 2:
                lease_slot_1()
            return np.asarray(self)

        def __gt__(self, other):  # type: ignore[override]
            return self._read() > other

        def __eq__(self, other):  # type: ignore[override]
            return self._read() == other

        def __getitem__(self, key):
            return self._read()[key]

        def copy(self, *args, **kwargs):  # type: ignore[override]
            return self._read().copy(*args, **kwargs)

    alive = ring_mod.procs.alive_packed

    def judge(value: int) -> bool:  # or the lease lands while the reclaim judges a mark
        lease_slot_1()
        return alive(value)

    monkeypatch.setattr(ring_mod.procs, "alive_packed", judge)
    monkeypatch.setattr(ring, "_flags", raw.view(LeaseOnSecondRead))
    ring._reclaim_dead()
    monkeypatch.setattr(ring, "_flags", raw)
    assert leased  # the lease did land during the reclaim
    assert raw.tolist() == [-1, -1, mark, mark]  # both consumer slots kept, the worker's too
    assert ring.claim() is None  # the ring is full: no held slot is handed out
    assert held["x"].shape == (4, 3)


def test_a_batch_whose_slot_was_reclaimed_is_refused_not_served_with_other_rows():
    """Worker A fills the one slot, sends the batch and dies before the main process takes it;
    worker B finds the ring full, reclaims the dead worker's slot and fills it with other rows.
    The message then names a slot that holds another batch: taking it must raise, never serve
    B's rows as A's batch (before, the slot was taken whatever it held)."""
    pytest.importorskip("torch")
    from shardload.torch.transport import _RingBatch, _to_torch

    ring = BatchRing(SPECS, 4, slots=1)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # worker A
        code = 1
        try:
            batch = ring.allocate(4)
            assert batch is not None
            batch["x"][:], batch["index"][:] = 1.0, np.arange(4)
            slot = ring.slot_of(batch)
            assert slot is not None
            os.write(w, pickle.dumps(_RingBatch(_to_torch(batch), ring, slot, 4)))
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0  # A is gone
    with os.fdopen(r, "rb") as f:
        message = f.read()
    pid = os.fork()
    if pid == 0:  # worker B
        code = 1
        try:
            batch = ring.allocate(4)  # the ring is full: A's slot, reclaimed
            if batch is not None:
                batch["x"][:], batch["index"][:] = 2.0, np.arange(4) + 100
                code = 0
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0  # B took the slot
    with pytest.raises(RuntimeError, match="reclaimed"):
        pickle.loads(message)
    assert ring._flags[0] != -1  # not leased: the slot is not held by this process


def test_a_private_batch_is_never_taken_for_a_slots_batch():
    """A worker finding the ring full gathers a batch into memory of its own; it must go by the
    stock hand-off, never as a slot's address. Before 2026-11-29 the slot of a batch was looked
    up by ``id()`` of its first array: once that array object was gone (its slot still claimed,
    the batch's other arrays alive) a new array could reuse the id and a private batch was sent
    as that slot, whose rows are another batch's."""
    ring = BatchRing(SPECS, 4, slots=2)
    out = ring.allocate(4)
    assert out is not None
    first = next(iter(SPECS))
    others = {k: v for k, v in out.items() if k != first}  # keep the slot's memory claimed
    old_id = id(out[first])
    del out
    private = None
    for _ in range(10_000):  # a fresh array taking the freed object's id (CPython reuses it)
        candidate = np.zeros((4, 3), "f4")
        if id(candidate) == old_id:
            private = candidate
            break
        del candidate
    if private is None:
        pytest.skip("no array reused the freed id here")
    assert ring.slot_of({first: private, **{k: v.copy() for k, v in others.items()}}) is None


def test_a_slots_batch_is_found_by_its_memory_once():
    """The batch from a slot is handed out once; a copy of it, or a batch of arrays at other
    places, is not a slot's; a closed iterator frees what it claimed but never handed out."""
    ring = BatchRing(SPECS, 4, slots=3)
    a, b = ring.allocate(4), ring.allocate(2)
    assert a is not None and b is not None
    assert ring.slot_of({k: v.copy() for k, v in a.items()}) is None
    assert ring.slot_of({"x": a["index"], "index": a["x"]}) is None  # wrong place in the slot
    assert ring.slot_of(a) == 0 and ring.slot_of(a) is None  # handed out once
    ring.release_unsent()  # b's slot: claimed, never handed out
    assert list(np.asarray(ring._flags)) == [ring._me(), 0, 0]


@pytest.mark.timeout(60)
def test_a_lease_does_not_wait_for_ever_on_a_lock_a_dead_worker_held(monkeypatch):
    """A worker killed inside a claim leaves the ring's lock taken: the consumer's next lease
    raises after ``LEASE_WAIT_S`` instead of hanging the training loop."""
    monkeypatch.setattr(ring_mod, "LEASE_WAIT_S", 0.2)
    ring = BatchRing(SPECS, 4, slots=2)
    slot = _sent(ring)
    ring._lock.acquire()  # as a worker killed while it held it
    with pytest.raises(RuntimeError, match="lock was held"):
        ring.lease(slot, 4, ring._me())
