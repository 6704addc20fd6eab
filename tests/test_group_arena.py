"""Group buffers of forked DataLoader workers in shared memory kept by the dataset
(``load/arena.py``): workers that do not persist (torch's ``DataLoader`` default) take the pages
the workers before them faulted in, instead of fresh ones each epoch; batches are unchanged.
"""

from __future__ import annotations

import doctest
import os
import pickle
import select
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.load import arena as arena_mod
from shardload.load.reader import BufferPool
from shardload.load.spec import LoadSpec

torch = pytest.importorskip("torch")

prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
N, F, B, GROUP = 2048, 256, 32, 16  # rows, float32 per row, batch, chunks per shuffle group


@pytest.fixture(autouse=True)
def gathered(monkeypatch) -> None:
    """The gather reader, whose group buffers the arena holds: without the compiled kernel
    (with it, compressed local shards are decoded into their batches, load/decoded.py)."""
    from shardload.formats.zarr import shard_rows

    monkeypatch.setattr(shard_rows, "KERNEL", None)


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    """A store of the default layout (compressed shards of small inner chunks: gather reads)."""
    out = tmp_path_factory.mktemp("arena") / "default"
    x = np.zeros((N, F), np.float32)
    x[:, 0] = np.arange(N)
    x[:, 1:] = (np.arange(N)[:, None] % 5).astype(np.float32)
    ds = xr.Dataset({"a": (("sample", "feat"), x)})
    cfg = {"sample_dims": ["sample"], "view": "flat", "arrays": {"x": ["a"]}, "out": str(out)}
    prepare({**cfg, "splits": {}}, dataset=ds)
    return out


def _count_private_takes(monkeypatch, log: Path) -> None:
    """Append a line to ``log`` for each group buffer a *worker* takes from private memory."""
    main, take = os.getpid(), BufferPool.take

    def counted(self, name, shape, dtype):  # type: ignore[no-untyped-def]
        if os.getpid() != main:
            with open(log, "a") as f:
                f.write(f"{os.getpid()}\n")
        return take(self, name, shape, dtype)

    monkeypatch.setattr(BufferPool, "take", counted)


def test_later_workers_take_the_group_buffers_earlier_workers_faulted(store, tmp_path, monkeypatch):
    """Each epoch of a plain ``DataLoader`` starts 2 new workers; from the second epoch on they
    take no group buffer from private memory (before: every group of every epoch did)."""
    from torch.utils.data import DataLoader

    from shardload.torch import StreamingDataset

    ds = StreamingDataset(store, batch_size=B, shuffle_chunks=GROUP)
    assert LoadSpec.build(store, batch_size=B, shuffle_chunks=GROUP).kind == "gather"
    seen = []
    for epoch in range(3):
        log = tmp_path / f"private-{epoch}.txt"
        log.touch()
        _count_private_takes(monkeypatch, log)
        rows = [b["index"].numpy().copy() for b in DataLoader(ds, batch_size=None, num_workers=2)]
        got = np.concatenate(rows)
        assert len(np.unique(got)) == len(got) == N  # every row once
        seen.append(got)
        private = log.read_text().split()
        if epoch:  # the first epoch's workers fault the shared pages in
            assert private == [], f"epoch {epoch}: {len(private)} private group buffers"
    assert not np.array_equal(seen[0], seen[1])  # each pass is the next epoch, as before
    expect = [b["index"] for e in range(3) for b in _in_process(store, e)]
    assert np.array_equal(np.concatenate(seen), np.concatenate(expect))


def _in_process(store: Path, epoch: int):
    """The same rank's batches, workers 0 and 1 interleaved as the DataLoader yields them."""
    its = [
        shardload.iter_batches(
            store, batch_size=B, shuffle_chunks=GROUP, epoch=epoch, worker=w, num_workers=2
        )
        for w in (0, 1)
    ]
    done = [False, False]
    while not all(done):
        for w, it in enumerate(its):
            b = next(it, None)
            if b is None:
                done[w] = True
            else:
                yield b


def test_a_slot_in_use_is_not_taken_again_and_comes_back_when_garbage():
    arena = arena_mod.GroupArena(10_000, regions=2, slots=2)
    assert arena.take(100) is None  # the creating process is not a worker
    arena.owner = -1  # as in a forked worker
    a, b = arena.take(10_000), arena.take(5_000)
    assert a is not None and b is not None and arena.take(100) is None  # both slots in use
    assert arena.take(arena.slot_bytes + 1) is None  # larger than a slot: private memory
    view = a[10:20]  # a read still writing into a dropped group holds a view
    del a
    assert arena.take(100) is None
    del view
    c = arena.take(100)
    assert c is not None and c.ctypes.data % 4096 == 0
    assert int(arena._owners[0]) > 0 and int(arena._owners[1]) == 0  # one region claimed


def test_the_pool_falls_back_to_private_memory_and_keeps_it():
    arena = arena_mod.GroupArena(4096, regions=1, slots=1)
    arena.owner = -1
    pool = arena_mod.ArenaPool(arena)
    shared = pool.take("x", (4, 256), np.dtype(np.float32))  # 4 KiB: fits the slot
    private = pool.take("x", (4, 256), np.dtype(np.float32))  # the one slot is in use
    pool.give("x", shared)
    pool.give("x", private)
    assert len(pool._free.get("x", [])) == 1  # only the private buffer is pooled
    del shared
    assert arena.take(4096) is not None  # the shared one went back to the arena


def test_spawned_workers_get_no_arena(store):
    from shardload.torch import StreamingDataset

    ds = StreamingDataset(store, batch_size=B, shuffle_chunks=GROUP)
    assert ds._arena is not None
    assert pickle.loads(pickle.dumps(ds))._arena is None


def test_arena_doctests():
    assert doctest.testmod(arena_mod).failed == 0


def _claim_in_child(arena, hold_r: int, report_w: int) -> None:  # type: ignore[no-untyped-def]
    """In a forked child: take a buffer, write a byte of it, report the region, wait."""
    try:
        buf = arena.take(4096)
        region = -1
        if buf is not None:
            buf[0] = 1
            region = arena._region
        os.write(report_w, region.to_bytes(2, "little", signed=True))
        os.read(hold_r, 1)  # hold the region until the parent says so
    finally:
        os._exit(0)


def _report(fd: int) -> int:
    """A child's region (-1: none), or a failure instead of waiting forever."""
    assert select.select([fd], [], [], 60)[0], "a child did not report"
    return int.from_bytes(os.read(fd, 2), "little", signed=True)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_live_workers_never_share_a_region_and_dead_ones_give_theirs_up():
    """Three forked processes at once over an arena of 2 regions: two claim one each, the third
    takes private memory; once they exited, a new process claims a region again."""
    arena = arena_mod.GroupArena(4096, regions=2, slots=2)
    hold_r, hold_w = os.pipe()
    report_r, report_w = os.pipe()
    pids = []
    for _ in range(3):
        pid = os.fork()
        if pid == 0:
            _claim_in_child(arena, hold_r, report_w)
        pids.append(pid)
    got = sorted(_report(report_r) for _ in pids)
    assert got == [-1, 0, 1]
    os.write(hold_w, b"xxx")
    for pid in pids:
        os.waitpid(pid, 0)
    pid = os.fork()
    if pid == 0:
        _claim_in_child(arena, hold_r, report_w)
    assert _report(report_r) in (0, 1)
    os.write(hold_w, b"x")
    os.waitpid(pid, 0)
    for fd in (hold_r, hold_w, report_r, report_w):
        os.close(fd)
