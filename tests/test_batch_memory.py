"""Batch memory of the in-process loader: the kernel's copy into fresh batches faults once per
huge page, not once per 4 KiB page (load/recycle.py)."""

from __future__ import annotations

import gc
import os
import resource
import sys
import time
import weakref
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.load.recycle import HUGE_PAGE, PAGE, BatchRecycler, huge_empty

ROWS, FEATURES, BATCH = 4096, 1024, 256  # 16 MiB of float32 rows: 16 batches of 1 MiB


def _thp_text() -> str:
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    except OSError:
        return "[never]"


def _thp_on() -> bool:
    return "[never]" not in _thp_text()


needs_thp = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _thp_on(),
    reason="transparent huge pages are off (or not Linux)",
)


@pytest.fixture(scope="module")
def big_npy(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("batchmem")
    values = np.arange(ROWS * FEATURES, dtype="f4").reshape(ROWS, FEATURES)
    xr.Dataset({"a": (("sample", "f"), values)}).to_netcdf(tmp / "src.nc")
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    return prepare(
        {
            "source": {"paths": [str(tmp / "src.nc")]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a"]},
            "format": "npy",
            "compression": "none",
            "chunk_rows": 512,
            "out": str(tmp / "store"),
        }
    )


def _faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@needs_thp
def test_an_epoch_faults_per_huge_page_not_per_page(big_npy):
    """An epoch of 16 MiB of batches faults in far fewer than its 4,096 pages (the batches of
    a fresh iterator were fresh ``np.empty`` memory, faulted page by page: ~4,100 faults)."""
    for _ in shardload.iter_batches(big_npy, batch_size=BATCH, epoch=0):  # imports, rings
        pass
    before = _faults()
    n = 0
    for b in shardload.iter_batches(big_npy, batch_size=BATCH, epoch=1):
        assert np.array_equal(b["x"][:, 0], b["index"].astype("f4") * FEATURES)
        n += 1
    faults = _faults() - before
    pages = n * BATCH * FEATURES * 4 // PAGE
    assert n == ROWS // BATCH
    assert faults < pages // 4, f"{faults} page faults for {pages} pages of batches"


def test_huge_empty_is_aligned_and_writable():
    a = huge_empty(3 * HUGE_PAGE + 5)
    assert len(a) == 3 * HUGE_PAGE + 5 and a.dtype == np.uint8
    assert a.ctypes.data % (HUGE_PAGE if sys.platform.startswith("linux") else PAGE) == 0
    a[:] = 7
    assert int(a.sum()) == 7 * len(a)


def _resident_kib(start: int, stop: int) -> int:
    """KiB resident of this process's mappings inside ``[start, stop)``."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = start <= lo and hi <= stop
        elif inside and line.startswith("Rss:"):
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not _thp_on() or "[always]" in _thp_text(),
    reason="transparent huge pages on request (madvise) only",
)
def test_huge_empty_faults_no_huge_page_past_its_bytes():
    """A buffer ending a few pages into a huge page: writing all of it faults its whole huge
    pages as such and only the pages of its tail, not 2 MiB for them (a slab of batches ends
    anywhere in its last huge page)."""
    tail = 5 * PAGE
    a = huge_empty(3 * HUGE_PAGE + tail)
    a[:] = 1
    start = a.ctypes.data
    assert _resident_kib(start, start + 4 * HUGE_PAGE) * 1024 <= 3 * HUGE_PAGE + tail


def test_recycler_cuts_page_aligned_buffers_from_shared_slabs():
    specs = {"x": ((1000,), np.dtype("f4")), "index": ((), np.dtype("i8"))}
    r = BatchRecycler(specs, 64, keep=8)
    held = [r.allocate(64) for _ in range(5)]
    bases = sorted(h["x"].ctypes.data for h in held)
    assert all(b % PAGE == 0 for b in bases)
    assert r.allocated == 5
    # buffers of one slab follow each other, a page-rounded buffer apart
    stride = -(-r.buffer_bytes // PAGE) * PAGE
    assert np.diff(bases).tolist() == [stride] * 4
    for i, h in enumerate(held):  # no two batches share memory
        h["x"][:] = i
    assert [int(h["x"][0, 0]) for h in held] == list(range(5))


def _python_calls(fn):
    """``fn()`` and the Python functions it ran (``sys.setprofile`` ``call`` events)."""
    calls: list[str] = []

    def prof(frame, event, arg):
        if event == "call":
            calls.append(frame.f_code.co_name)

    sys.setprofile(prof)
    try:
        out = fn()
    finally:
        sys.setprofile(None)
    return out, calls


def test_a_recycled_batch_costs_few_python_calls_and_comes_back_with_its_last_view():
    """A batch is allocated 256 times an epoch of the raw store: its bookkeeping is a weak
    reference with a callback, not a ``weakref.finalize`` (~11 us of Python a batch, whose
    ``__init__`` ran per batch), and its arrays are made in one call each."""
    specs = {"x": ((1000,), np.dtype("f4")), "index": ((), np.dtype("i8"))}
    r = BatchRecycler(specs, 64, keep=8)
    r.allocate(64)  # one buffer, dropped at once: now idle
    gc.collect()
    finalizers = len(weakref.finalize._registry)  # type: ignore[attr-defined]
    b, calls = _python_calls(lambda: r.allocate(64))
    assert r.allocated == 1  # the idle buffer again
    assert len(weakref.finalize._registry) == finalizers  # type: ignore[attr-defined]
    assert len(calls) <= 4, calls  # the lambda, allocate, batch_views and its comprehension
    assert b["x"].shape == (64, 1000) and b["index"].shape == (64,)
    assert b["x"].flags.writeable and b["x"].flags.c_contiguous
    view = b["x"][3:5]  # a view the caller keeps (as a tensor would) keeps the buffer
    del b
    gc.collect()
    held = r.allocate(64)
    assert r.allocated == 2 and not np.shares_memory(held["x"], view)
    del view
    gc.collect()
    again = r.allocate(64)  # the first buffer came back with its last view
    assert r.allocated == 2 and not np.shares_memory(again["x"], held["x"])


def test_the_next_epoch_reuses_the_last_epochs_batch_memory(big_npy, monkeypatch):
    """A store's next iterator takes up the memory its last one's batches left (already
    faulted in): the second epoch makes no new batch memory (each iterator made its own)."""
    from shardload.load import recycle

    made = []
    slabs: list[np.ndarray] = []
    real = recycle.huge_empty

    def counting(nbytes: int) -> np.ndarray:
        made.append(nbytes)
        slabs.append(real(nbytes))
        return slabs[-1]

    monkeypatch.setattr(recycle, "huge_empty", counting)
    store = shardload.open_store(big_npy.url)  # a store object no other test has read
    first = [b["index"].copy() for b in shardload.iter_batches(store, batch_size=BATCH, epoch=0)]
    assert made  # the first epoch's batches
    first_made, first_slabs, made[:] = list(made), list(slabs), []
    second, reused = [], 0
    for b in shardload.iter_batches(store, batch_size=BATCH, epoch=1):
        second.append(b["index"].copy())
        reused += any(np.shares_memory(b["x"], slab) for slab in first_slabs)
    # every batch on a quiet machine; a loaded one may let the reader threads run further ahead
    # of the consumer than in the first epoch, and a new slab is cut for those: never all new
    assert reused and sum(made) <= sum(first_made), (reused, made, first_made)
    assert len(first) == len(second) and not all(
        np.array_equal(a, b) for a, b in zip(first, second, strict=True)
    )
    # another batch size is another layout: its own memory
    for _ in shardload.iter_batches(store, batch_size=BATCH // 2, epoch=1):
        pass
    assert made
    # the memory goes with the store
    ref = weakref.ref(store)
    del store
    gc.collect()
    assert ref() is None


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_starts_with_recyclers_of_its_own(big_npy):
    """A child forked while a parent's thread holds the recyclers' lock neither deadlocks nor
    takes the parent's idle buffers."""
    import threading

    from shardload.load import recycle as batches

    store = shardload.open_store(big_npy)
    list(shardload.iter_batches(store, batch_size=64, seed=0))
    assert batches._RECYCLERS
    held = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with batches._RECYCLERS_LOCK:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    held.wait(10)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one epoch, then report how many recyclers it inherited
        try:
            n = len(batches._RECYCLERS)
            list(shardload.iter_batches(store, batch_size=64, seed=0))
            os.write(w, str(n).encode())
        finally:
            os._exit(0)
    release.set()
    t.join()
    os.close(w)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(0.05)
    else:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child deadlocked on the parent's recycler lock")
    with os.fdopen(r, "rb") as f:
        assert f.read() == b"0"


def test_default_store_epochs_reuse_the_last_epochs_group_buffers(tmp_path, monkeypatch):
    """A compressed (gather) store's group buffers stay with the store: the second epoch's
    groups take the first's memory (already faulted in) and allocate none. Before: each
    iterator had its own pool, so every epoch allocated (and the kernel zeroed) them anew."""
    from shardload.formats.zarr import shard_rows
    from shardload.load import reader

    monkeypatch.setattr(shard_rows, "KERNEL", None)  # the gather reader (decode reads: none)
    values = np.arange(8192 * 64, dtype="f4").reshape(8192, 64)
    xr.Dataset({"a": (("sample", "f"), values)}).to_netcdf(tmp_path / "src.nc")
    store = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "src.nc")]},
            "sample_dims": ["sample"],
            "arrays": {"x": ["a"]},
            "out": str(tmp_path / "store"),
        }
    )
    new = [0]
    take = reader.BufferPool.take

    def counted(self, name, shape, dtype):  # type: ignore[no-untyped-def]
        want = int(np.prod(shape)) * np.dtype(dtype).itemsize + reader.READ_ALIGN
        if not any(b.nbytes >= want for b in self._free.get(name, [])):
            new[0] += 1
        return take(self, name, shape, dtype)

    monkeypatch.setattr(reader.BufferPool, "take", counted)
    first = [b["x"].copy() for b in shardload.iter_batches(store, batch_size=64, epoch=0)]
    assert new[0] > 0
    new[0] = 0
    second = [b["x"].copy() for b in shardload.iter_batches(store, batch_size=64, epoch=1)]
    assert new[0] == 0, f"the second epoch allocated {new[0]} group buffers"
    for got in (first, second):  # the reused memory still yields every row once
        rows = np.concatenate(got)
        assert np.array_equal(rows[np.argsort(rows[:, 0])], values)


@pytest.mark.parametrize("gathered", [True, False], ids=["gather", "decode"])
def test_epochs_from_a_path_reuse_the_last_epochs_memory(tmp_path, monkeypatch, gathered):
    """``iter_batches(path)`` opens a store each epoch: the next epoch of the same path takes
    up the group buffers and batch memory the last one's store kept (already faulted in),
    and allocates none. Before: each epoch's store allocated them anew (fresh pages, zeroed
    by the kernel). Another path does not take them up, and they go with the process. The
    gather reader (without the compiled kernel) and decode reads (no group buffers) alike."""
    from shardload.formats.zarr import shard_rows
    from shardload.load import reader, recycle

    if gathered:
        monkeypatch.setattr(shard_rows, "KERNEL", None)
    elif shard_rows.KERNEL is None:
        pytest.skip("shardload's compiled kernel is not built (setup.py build_ext)")

    values = np.arange(8192 * 64, dtype="f4").reshape(8192, 64)
    xr.Dataset({"a": (("sample", "f"), values)}).to_netcdf(tmp_path / "src.nc")
    paths = []
    for name in ("store", "other"):
        shardload.prepare(
            {
                "source": {"paths": [str(tmp_path / "src.nc")]},
                "sample_dims": ["sample"],
                "arrays": {"x": ["a"]},
                "out": str(tmp_path / name),
            }
        )
        paths.append(str(tmp_path / name))
    new = [0]
    take = reader.BufferPool.take
    made: list[int] = []
    real = recycle.huge_empty

    def counted(self, name, shape, dtype):  # type: ignore[no-untyped-def]
        want = int(np.prod(shape)) * np.dtype(dtype).itemsize + reader.READ_ALIGN
        if not any(b.nbytes >= want for b in self._free.get(name, [])):
            new[0] += 1
        return take(self, name, shape, dtype)

    slabs: list[np.ndarray] = []

    def counting(nbytes: int) -> np.ndarray:
        made.append(nbytes)
        slabs.append(real(nbytes))
        return slabs[-1]

    monkeypatch.setattr(reader.BufferPool, "take", counted)
    monkeypatch.setattr(recycle, "huge_empty", counting)
    reused = [0]

    def epoch(path: str, e: int, old: Sequence[np.ndarray] = ()) -> np.ndarray:
        got = []
        for b in shardload.iter_batches(path, batch_size=64, epoch=e):
            got.append(b["x"].copy())
            reused[0] += any(np.shares_memory(b["x"], slab) for slab in old)
        rows = np.concatenate(got)
        assert np.array_equal(rows[np.argsort(rows[:, 0])], values)  # every row once
        return rows

    first = epoch(paths[0], 0)
    assert (new[0] > 0) == gathered and made
    first_made, new[0], made[:] = list(made), 0, []
    second = epoch(paths[0], 1, old=list(slabs))
    assert new[0] == 0, f"the second epoch allocated {new[0]} group buffers"
    # batches in the last epoch's memory (all of them on a quiet machine; a loaded one may let
    # the readers run further ahead than in the first epoch: a slab is cut for those)
    assert reused[0] and sum(made) <= sum(first_made), (reused, made, first_made)
    assert not np.array_equal(first, second)
    new[0], made[:] = 0, []
    epoch(paths[1], 0)  # another store: its own memory
    assert (new[0] > 0) == gathered and made
