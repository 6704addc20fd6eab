"""The shared-memory ring hand-off of StreamingDataset and torchdata's StatefulDataLoader."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from _stores import check_values, make_store, split_rows

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, IterableDataset  # noqa: E402

from shardload.errors import StateError  # noqa: E402
from shardload.load.ring import BatchRing  # noqa: E402
from shardload.torch import StreamingDataLoader, StreamingDataset  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.usefixtures("young_gc"),  # collections walk only each test's own objects
    # torchdata 0.11's StatefulDataLoader calls torch.set_vital, deprecated in newer torch
    pytest.mark.filterwarnings("ignore:'set_vital' is deprecated"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("h"), fmt="zarr", compression="none", n=331, chunk_rows=9
    )


def as_numpy(batch):
    return {k: v.numpy() for k, v in batch.items()}


def indices(batches):
    return [b["index"].tolist() for b in batches]


def test_held_ring_batches_are_never_overwritten(store):
    """Batches held by the main process are never overwritten by later ones (the ring has only
    a few slots, far fewer than the batches of an epoch: workers fall back to fresh memory)."""
    ds = StreamingDataset(store, batch_size=4, seed=3, ring_slots=3)
    held = list(DataLoader(ds, batch_size=None, num_workers=2))
    assert len(held) > 20
    assert all(type(b) is dict for b in held)
    for b in held:
        check_values(store, as_numpy(b))
    idx = np.concatenate([b["index"].numpy() for b in held])
    np.testing.assert_array_equal(np.sort(idx), split_rows(store, None))
    stock = StreamingDataset(store, batch_size=4, seed=3, ring_slots=0)
    assert indices(held) == indices(DataLoader(stock, batch_size=None, num_workers=2))


def test_batches_arrive_in_ring_slots_without_a_copy(store):
    """A loop that drops each batch before the next gets them all in place, in reused slots
    (the default ring is sized for the groups of batches the workers fill at once)."""
    ds = StreamingDataset(store, batch_size=8, seed=4)
    lo = np.frombuffer(ds._ring._mm, np.uint8).ctypes.data
    hi = lo + len(ds._ring._mm)
    n = in_ring = 0
    for b in DataLoader(ds, batch_size=None, num_workers=2):
        n += 1
        in_ring += all(lo <= t.data_ptr() < hi for t in b.values())
        check_values(store, as_numpy(b))
        del b
    assert n > 30 and in_ring == n


@pytest.mark.filterwarnings("ignore:'pin_memory' argument is set as true")  # CPU-only torch
@pytest.mark.parametrize("pin", [False, True])
def test_persistent_workers_epochs_and_pin_memory(store, pin):
    ds = StreamingDataset(store, batch_size=8, seed=1)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True, pin_memory=pin)
    ref = StreamingDataset(store, batch_size=8, seed=1, ring_slots=0)
    for epoch in range(3):
        ds.set_epoch(epoch)
        ref.set_epoch(epoch)
        got = list(loader)
        assert indices(got) == indices(DataLoader(ref, batch_size=None, num_workers=2))
        for b in got[:: max(1, len(got) // 5)]:
            check_values(store, as_numpy(b))


def test_break_mid_epoch_then_iterate_again(store):
    ds = StreamingDataset(store, batch_size=4, seed=5, ring_slots=4)
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    full = indices(
        DataLoader(
            StreamingDataset(store, batch_size=4, seed=5, ring_slots=0),
            batch_size=None,
            num_workers=2,
        )
    )
    for _ in range(3):  # leave batches (and their slots) behind in the queues each time
        for i, _b in enumerate(loader):
            if i == 5:
                break
    ds.set_epoch(0)  # else each pass is the next epoch
    assert indices(loader) == full
    plain = DataLoader(ds, batch_size=None, num_workers=2)  # fresh workers, same ring
    for i, _b in enumerate(plain):
        if i == 3:
            break
    ds.set_epoch(0)
    assert indices(plain) == full
    # batches gathered ahead and dropped as the workers stop are freed, not taken for worker
    # code that dropped them (no "new dict" warning)
    assert ds._ring.orphaned == 0


class _Doubler(IterableDataset):
    """Changes the batches inside the worker: replaces one entry and adds another."""

    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        for b in self.ds:
            b["x"] = b["x"] * 2
            b["extra"] = b["index"] + 1
            yield b


def test_batches_changed_in_the_worker_arrive_changed(store):
    ds = StreamingDataset(store, batch_size=8, seed=1, ring_slots=2)
    for b in DataLoader(_Doubler(ds), batch_size=None, num_workers=2):
        x = store.read("x")[b["index"].numpy()]
        np.testing.assert_array_equal(b["x"].numpy(), x * 2)
        np.testing.assert_array_equal(b["extra"].numpy(), b["index"].numpy() + 1)


class _NewDict(IterableDataset):
    """Builds a new dict from each batch in the worker (the ring batch itself is dropped)."""

    def __init__(self, ds):
        self.ds = ds

    def __iter__(self):
        for b in self.ds:
            yield {**b, "extra": b["index"] + 1}


def test_new_dicts_built_in_the_worker_leak_no_ring_slot(store):
    """Three epochs of workers yielding {**b, ...}: every batch right, and after each epoch
    every slot free again (they were all held before: the loader fell back to the slow path)."""
    ds = StreamingDataset(store, batch_size=8, seed=1, ring_slots=8)
    loader = DataLoader(_NewDict(ds), batch_size=None, num_workers=2, persistent_workers=True)
    for _ in range(3):
        for b in loader:
            check_values(store, {k: v.numpy() for k, v in b.items() if k != "extra"})
            np.testing.assert_array_equal(b["extra"].numpy(), b["index"].numpy() + 1)
        del b
        gc.collect()
        assert not ds._ring._flags.any()
    assert ds._ring.orphaned >= 3 * 8  # the cause, counted (each worker also warned once)


def test_num_workers_0_uses_no_ring(store):
    ds = StreamingDataset(store, batch_size=8, seed=1)
    b = next(iter(DataLoader(ds, batch_size=None, num_workers=0)))
    assert type(b) is dict and set(b) == {"x", "y", "index"}
    check_values(store, as_numpy(b))


def test_ring_slots_and_fallback():
    ring = BatchRing({"x": ((3,), np.dtype("f4")), "index": ((), np.dtype("i8"))}, 4, slots=2)
    assert not ring.usable  # the creating process never uses its ring
    a, b = ring.allocate(4), ring.allocate(2)
    assert a is not None and b is not None and ring.allocate(1) is None  # full: caller falls back
    assert ring.allocate(5) is None  # larger than a slot
    a["x"][:] = 7
    slot = ring.slot_of(a)
    ring.sent(slot)
    out = ring.lease(slot, 4)  # the consumer's arrays, in place
    assert (out["x"] == 7).all() and out["x"].shape == (4, 3) and out["index"].shape == (4,)
    view = out["x"][1:]
    del out
    assert ring.allocate(4) is None  # a view still holds the slot
    ring._reclaim_dead()  # a slot the consumer holds is never reclaimed
    assert ring.allocate(4) is None
    del view
    gc.collect()
    c = ring.allocate(4)  # the freed slot
    assert c is not None and ring.slot_of(c) == slot
    ring.free(slot)
    ring.release_unsent()
    d = ring.allocate(3)
    assert d is not None
    ring.release_unsent()
    assert ring.orphaned == 0


def _sent(ring, part=(0, 1), rows=4):
    """A worker's side: allocate a batch, hand it out; its slot."""
    out = ring.allocate(rows, part=part)
    if out is None:
        return None
    slot = ring.slot_of(out)
    ring.sent(slot)
    return slot


def test_each_worker_claims_its_own_part_of_the_ring():
    """A worker claims slots of its own part of the ring first (it page-faults in only those),
    and borrows another part's free slots only when its own are all taken."""
    ring = BatchRing({"x": ((3,), np.dtype("f4")), "index": ((), np.dtype("i8"))}, 4, slots=6)
    w1 = [_sent(ring, (1, 2)) for _ in range(3)]
    assert w1 == [3, 4, 5]
    w0 = [_sent(ring, (0, 2)) for _ in range(2)]
    assert w0 == [0, 1]
    assert _sent(ring, (1, 2)) == 2  # part 1 full: borrows part 0's
    assert ring.allocate(4, part=(0, 2)) is None  # all taken


def test_a_batch_dropped_unsent_frees_its_slot_and_warns(monkeypatch):
    """Worker code that builds a new dict from a ring batch drops the batch itself unsent: its
    slot is freed once every view of it is garbage (the copy made), with a warning naming why."""
    import shardload.load.ring as ring_mod

    monkeypatch.setattr(ring_mod, "_WARNED", [False])
    ring = BatchRing({"x": ((3,), np.dtype("f4")), "index": ((), np.dtype("i8"))}, 4, slots=2)
    batch = ring.allocate(4)
    slot = ring.slot_of(batch)
    copy = {**batch, "extra": batch["index"] + 1}
    del batch
    assert ring._flags[slot] != 0  # the new dict's arrays still view the slot: held
    with pytest.warns(RuntimeWarning, match=r"new dict.*\{\*\*batch"):
        del copy
        gc.collect()
    assert ring._flags[slot] == 0 and ring.orphaned == 1


def _mapping_rss(mm):
    """Resident bytes of the mapping of ``mm`` in this process (/proc/self/smaps)."""
    lo = np.frombuffer(mm, np.uint8).ctypes.data
    inside = False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= lo < end
            elif inside and head == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("mapping not found")


@pytest.mark.skipif(not hasattr(__import__("mmap"), "MADV_REMOVE"), reason="no MADV_REMOVE")
def test_idle_ring_pages_go_back_to_the_kernel():
    """After a spike (the loop held 40 batches), slots left unused for two sweeps give their
    pages back: resident memory follows the slots in use, not the high-water mark."""
    ring = BatchRing({"x": ((16384,), np.dtype("f4"))}, 4, slots=40)  # 256 KiB slots
    ring.sweep_every = 0  # sweep by hand

    def cycle(n):
        held = []
        for _ in range(n):
            slot = _sent(ring)
            lease = ring.lease(slot, 4)
            lease["x"][:] = 1  # the consumer touches its pages too
            held.append(lease)
        return held

    spike = cycle(40)
    high = _mapping_rss(ring._mm)
    assert high >= 40 * ring.slot_bytes and ring.resident_slots == 40
    del spike
    gc.collect()
    for _ in range(3):
        steady = cycle(4)
        ring.sweep()
        del steady
        gc.collect()
    assert ring.resident_slots == 4
    assert _mapping_rss(ring._mm) <= high - 30 * ring.slot_bytes
    again = cycle(40)  # given-back slots work again (fresh pages)
    assert all((b["x"] == 1).all() for b in again)


def test_pieces_through_dataloader_workers(store):
    """Pieces (``piece_rows``) through 2 DataLoader workers: every row once, values right, the
    same batches as in-process, all in ring slots."""
    ds = StreamingDataset(store, batch_size=4, seed=5, piece_rows=4)
    got = [as_numpy(b) for b in DataLoader(ds, batch_size=None, num_workers=2)]
    for b in got:
        check_values(store, b)
    idx = np.concatenate([b["index"] for b in got])
    np.testing.assert_array_equal(np.sort(idx), split_rows(store, None))
    again = StreamingDataset(store, batch_size=4, seed=5, piece_rows=4)
    assert indices(got) == indices(DataLoader(again, batch_size=None, num_workers=2))
    whole = StreamingDataset(store, batch_size=4, seed=5, piece_rows=0)
    assert ds.fingerprint != whole.fingerprint  # a resume across piece sizes is refused


# -- StreamingDataLoader bundles ---------------------------------------------------------------
# 3 workers on a 2-CPU machine: DataLoader warns, and the tests mean it
many_workers = pytest.mark.filterwarnings("ignore:This DataLoader will create")


def _plain(store, workers, **kw):
    ds = StreamingDataset(store, **kw)
    return indices(DataLoader(ds, batch_size=None, num_workers=workers))


@many_workers
@pytest.mark.parametrize(
    ("workers", "bundle", "batch_size"),
    [(1, 3, 8), (2, None, 8), (2, 1, 50), (3, 2, 8), (3, 4, 40), (2, 7, 50)],
)
def test_bundles_come_out_in_the_order_of_a_plain_dataloader(store, workers, bundle, batch_size):
    """Workers with unequal batch counts (331 rows), bundles that do and do not divide them:
    the batches, values and order are those of a plain DataLoader, one batch per item."""
    want = _plain(store, workers, batch_size=batch_size, seed=6)
    loader = StreamingDataLoader(
        StreamingDataset(store, batch_size=batch_size, seed=6), num_workers=workers, bundle=bundle
    )
    assert loader.bundle == (bundle or loader.dataset.default_bundle) and loader._bundled
    got = list(loader)
    assert all(type(b) is dict for b in got)
    assert indices(got) == want
    for b in got[:: max(1, len(got) // 4)]:
        check_values(store, as_numpy(b))


def test_bundles_restore_the_order_with_in_order_false(store):
    import inspect

    if "in_order" not in inspect.signature(DataLoader).parameters:
        pytest.skip("this torch's DataLoader has no in_order")
    want = _plain(store, 2, batch_size=8, seed=7)
    ds = StreamingDataset(store, batch_size=8, seed=7)
    assert indices(StreamingDataLoader(ds, num_workers=2, bundle=3, in_order=False)) == want


def test_unbundle_yields_each_batch_as_soon_as_it_and_those_before_it_arrived():
    """The first batch goes out once worker 0's first bundle is in, without waiting for
    worker 1's (which arrives later); the order is still a plain DataLoader's, in either
    arrival order, and a round left incomplete loses nothing."""
    from shardload.torch.transport import _Bundle, _unbundle

    def bundle(worker, seq, names):
        b = _Bundle(worker, seq)
        b.extend(names)
        return b

    counts, size = [3, 2], 2  # worker 0: a0 a1 | a2; worker 1: b0 b1
    pulled = []

    def items(order):
        sent = [bundle(0, 0, ["a0", "a1"]), bundle(1, 0, ["b0", "b1"]), bundle(0, 1, ["a2"])]
        for k in order:
            pulled.append(k)
            yield sent[k]

    out = _unbundle(items([0, 1, 2]), counts, size)
    assert next(out) == "a0" and pulled == [0]  # worker 1's bundle not waited for
    assert next(out) == "b0" and pulled == [0, 1]
    assert list(out) == ["a1", "b1", "a2"]
    assert list(_unbundle(items([1, 2, 0]), counts, size)) == ["a0", "b0", "a1", "b1", "a2"]
    # worker 1 never sends (died): what came is passed on, none twice, none dropped
    assert list(_unbundle(items([0, 2]), counts, size)) == ["a0", "a1", "a2"]


@many_workers
def test_a_worker_with_no_batch(store):
    """3 workers, 2 batches: worker 2 sends nothing; the loader must neither hang nor drop any."""
    kw = dict(batch_size=8, seed=1, rows=(0, 16))
    want = _plain(store, 3, **kw)
    assert len(want) == 2
    ds = StreamingDataset(store, **kw)
    assert indices(StreamingDataLoader(ds, num_workers=3, bundle=4)) == want


def test_bundles_break_resume_and_free_every_ring_slot(store):
    """Breaking mid-epoch (persistent workers) leaves no slot taken once an epoch completes,
    and a bundled loader's state resumes exactly where it stopped."""
    ds = StreamingDataset(store, batch_size=4, seed=5)
    loader = StreamingDataLoader(ds, num_workers=2, bundle=5, persistent_workers=True)
    full = _plain(store, 2, batch_size=4, seed=5)
    for _ in range(2):
        ds.set_epoch(0)
        it = iter(loader)
        head = [next(it)["index"].tolist() for _ in range(7)]
        state = loader.state_dict()
        del it
        gc.collect()
    assert head == full[:7] and state["dataset"]["batches_consumed"] == 7
    ds.set_epoch(0)
    assert indices(loader) == full
    gc.collect()
    assert not ds._ring._flags.any()  # every slot free: none leaked by a discarded bundle
    resumed = StreamingDataLoader(StreamingDataset(store, batch_size=4, seed=5), num_workers=2)
    resumed.load_state_dict(state)
    assert head + indices(resumed) == full


def test_no_bundles_without_workers_or_with_a_collate_fn(store):
    ds = StreamingDataset(store, batch_size=8, seed=1)
    assert not StreamingDataLoader(ds, num_workers=0)._bundled
    own = StreamingDataLoader(ds, num_workers=2, collate_fn=lambda b: b)
    assert not own._bundled and indices(own) == _plain(store, 2, batch_size=8, seed=1)
    with pytest.raises(ValueError, match="bundle"):
        StreamingDataLoader(ds, num_workers=2, bundle=0)


# -- torchdata StatefulDataLoader --------------------------------------------------------------
stateful = pytest.importorskip("torchdata.stateful_dataloader")


def _sdl(store, workers, **kw):
    ds = StreamingDataset(store, batch_size=8, seed=7)
    return ds, stateful.StatefulDataLoader(ds, batch_size=None, num_workers=workers, **kw)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("k", [0, 1, 3, 6])
def test_stateful_dataloader_resumes_mid_epoch(store, workers, k):
    ds, loader = _sdl(store, workers)
    ds.set_epoch(2)
    full = indices(loader)
    ds.set_epoch(2)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(k)]
    state = loader.state_dict()
    del it
    ds2, loader2 = _sdl(store, workers)
    loader2.load_state_dict(state)
    rest = indices(loader2)
    assert head + rest == full
    ds2.set_epoch(3)  # the next epoch starts from its beginning
    ds.set_epoch(3)
    assert indices(loader2) == indices(loader)


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_across_epochs(store, workers):
    ds, loader = _sdl(store, workers, persistent_workers=workers > 0)
    e0 = indices(loader)
    ds.set_epoch(1)
    it = iter(loader)
    head = [next(it)["index"].tolist() for _ in range(4)]
    state = loader.state_dict()
    del it
    ref, ref_loader = _sdl(store, workers)
    ref.set_epoch(1)
    e1 = indices(ref_loader)
    assert e1 != e0 and head == e1[:4]
    _, loader2 = _sdl(store, workers)
    loader2.load_state_dict(state)
    assert head + indices(loader2) == e1
    # a state saved at the end of an epoch starts the next one (torchdata's semantics): the
    # epoch set with set_epoch, from its beginning
    ds3, loader3 = _sdl(store, workers)
    ds3.set_epoch(1)
    list(loader3)
    end = loader3.state_dict()
    ds4, loader4 = _sdl(store, workers)
    ds4.set_epoch(2)
    loader4.load_state_dict(end)
    ref.set_epoch(2)
    assert indices(loader4) == indices(ref_loader)


def test_stateful_state_taken_before_the_first_batch_of_a_new_epoch(store):
    """Persistent workers: a state taken after set_epoch but before any batch of the new epoch
    resumes that epoch from its start (not the end of the previous one)."""
    ds, loader = _sdl(store, 2, persistent_workers=True)
    list(loader)
    ds.set_epoch(1)
    it = iter(loader)
    state = loader.state_dict()
    rest = indices(it)
    _, loader2 = _sdl(store, 2)
    loader2.load_state_dict(state)
    assert indices(loader2) == rest and len(rest) > 0


def test_worker_state_is_refused_outside_a_worker(store):
    _, loader = _sdl(store, 2)
    it = iter(loader)
    next(it)
    worker_state = next(iter(loader.state_dict()["_snapshot"]["_worker_snapshots"].values()))
    del it
    with pytest.raises(StateError, match="worker"):
        StreamingDataset(store, batch_size=8, seed=7).load_state_dict(worker_state["dataset_state"])


def test_spawned_workers_use_the_stock_hand_off(store):
    """A ring is shared by fork only; spawned workers get the dataset without it."""
    ds = StreamingDataset(store, batch_size=16, seed=2)
    loader = torch.utils.data.DataLoader(
        ds, batch_size=None, num_workers=2, multiprocessing_context="spawn"
    )
    got = sorted(int(i) for b in loader for i in b["index"])
    want = sorted(
        int(i) for b in torch.utils.data.DataLoader(ds, batch_size=None) for i in b["index"]
    )
    assert got == want and len(got) > 0
