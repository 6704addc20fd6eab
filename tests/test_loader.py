"""iter_batches: every format round-trips, partitions are exact, bad input fails clearly."""

from __future__ import annotations

import numpy as np
import pytest

import shardload
from _stores import check_values, make_store, split_rows
from shardload.errors import ChunkReadError, PlanError, StateError, StoreError
from shardload.load import gather as gather_mod
from shardload.load import kinds as kinds_mod
from shardload.load import options as options_mod
from shardload.load import spec as spec_mod
from shardload.load.select import select_rows
from shardload.load.spec import loader_selection, plan_for
from shardload.plan.resume import EpochState

FORMATS = [("zarr", "none"), ("zarr", "zstd"), ("zarr", "lz4"), ("npy", "none"), ("hdf5", "none")]


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("stores")
    return {f"{f}-{c}": make_store(root / f"{f}-{c}", fmt=f, compression=c) for f, c in FORMATS}


@pytest.fixture(scope="module")
def npy(stores):
    return stores["npy-none"]


def collect(store, **kw):
    return list(shardload.iter_batches(store, **kw))


@pytest.mark.parametrize("fmt", [f"{f}-{c}" for f, c in FORMATS])
@pytest.mark.parametrize("split", ["train", "val"])
def test_every_format_round_trips(stores, fmt, split):
    store = stores[fmt]
    batches = collect(store, batch_size=5, split=split, epoch=1)
    idx = np.concatenate([b["index"] for b in batches])
    np.testing.assert_array_equal(np.sort(idx), split_rows(store, split))
    for b in batches:
        assert b["index"].dtype == np.int64 and set(b) == {"x", "y", "index"}
        check_values(store, b)
    assert all(len(b["index"]) == 5 for b in batches[:-1])


@pytest.mark.parametrize("mode", ["drop", "pad"])
@pytest.mark.parametrize(("world", "workers"), [(1, 1), (2, 2), (3, 2), (4, 3)])
def test_ranks_and_workers_partition_the_split(npy, mode, world, workers):
    rows = split_rows(npy, "train")
    per_rank, seen = [], []
    for rank in range(world):
        got = [
            collect(
                npy,
                batch_size=8,
                split="train",
                rank=rank,
                world_size=world,
                worker=w,
                num_workers=workers,
                mode=mode,
                seed=3,
            )
            for w in range(workers)
        ]
        per_rank.append(sum(len(g) for g in got))
        seen.extend(np.concatenate([b["index"] for g in got for b in g]).tolist())
    assert len(set(per_rank)) == 1
    n = len(rows)
    if mode == "drop":
        assert len(seen) == len(set(seen)) == n - n % world
    else:
        assert set(seen) == set(rows.tolist()) and len(seen) == -(-n // world) * world
    assert set(seen) <= set(rows.tolist())


def test_round_robin_of_workers_is_the_rank_sequence(npy):
    one = collect(npy, batch_size=6, split="train", num_workers=1, seed=5)
    parts = [
        iter(collect(npy, batch_size=6, split="train", num_workers=3, worker=w, seed=5))
        for w in range(3)
    ]
    # not the same order (groups differ per worker), but the same batch count and sizes
    rr = [next(parts[k % 3]) for k in range(len(one))]
    assert [len(b["index"]) for b in rr] == [len(b["index"]) for b in one]
    assert all(next(p, None) is None for p in parts)


def test_seed_epoch_and_shuffle(npy):
    def order(**kw):
        return np.concatenate([b["index"] for b in collect(npy, batch_size=8, split="train", **kw)])

    assert np.array_equal(order(seed=1, epoch=2), order(seed=1, epoch=2))
    assert not np.array_equal(order(seed=1, epoch=2), order(seed=1, epoch=3))
    assert not np.array_equal(order(seed=1), order(seed=2))
    assert np.array_equal(order(shuffle=False), split_rows(npy, "train"))


def test_row_range_chunk_subset_and_arrays(npy):
    b = collect(npy, batch_size=4, rows=(10, 33), shuffle=False, arrays=["y"])
    assert set(b[0]) == {"y", "index"}
    assert np.concatenate([x["index"] for x in b]).tolist() == list(range(10, 33))
    check = np.concatenate([x["y"] for x in b])[:, 0]
    np.testing.assert_array_equal(check, np.arange(10, 33) * 10)
    c = collect(npy, batch_size=4, chunks=[3, 0], shuffle=False)
    assert sorted(np.concatenate([x["index"] for x in c]).tolist()) == [
        *range(0, 7),
        *range(21, 28),
    ]
    d = collect(npy, batch_size=4, split="train", rows=(0, 50))
    assert set(np.concatenate([x["index"] for x in d]).tolist()) == set(
        split_rows(npy, "train")
    ) & set(range(50))


def test_one_read_per_array_per_segment(npy, monkeypatch):
    """The gather path (compressed or remote chunks): one read per array per chunk."""
    from shardload.formats.npy.read import NpyReader

    monkeypatch.setattr(kinds_mod, "raw_sources", lambda *a: None)
    calls = []
    real = NpyReader.read_into
    monkeypatch.setattr(
        NpyReader, "read_into", lambda self, *a: (calls.append(a[:3]), real(self, *a))[1]
    )
    collect(npy, batch_size=8, split="train")
    sel, _, _ = loader_selection(npy, split="train")
    assert len(calls) == 2 * len(sel.sizes)  # two arrays, one read each per piece
    pieces = sorted(zip(sel.starts.tolist(), (sel.starts + sel.sizes).tolist(), strict=True))
    assert sorted((int(a), int(b)) for n, a, b in calls if n == "x") == pieces


@pytest.fixture
def io_path(request, monkeypatch):
    """Scatter reads through io_uring (skipped where this kernel refuses it) or one ``preadv``
    per run (as where io_uring is missing); none through the compiled small buffer
    (``runs.READ_ROWS``, tests/test_staged_reads.py), which serves what the page cache holds
    before either."""
    from shardload.load import runs, uring

    monkeypatch.setattr(runs, "READ_ROWS", None)
    uring.reset_for_tests(None if request.param == "io_uring" else False)
    if request.param == "io_uring" and uring.thread_ring() is None:
        pytest.skip("io_uring is not usable here (kernel, seccomp or SHARDLOAD_IO_URING=0)")
    yield request.param
    uring.reset_for_tests(None)


@pytest.mark.parametrize("io_path", ["preadv", "io_uring"], indirect=True)
@pytest.mark.parametrize("shuffle", [True, False])
def test_scatter_reads_coalesce_runs_of_each_chunk(npy, monkeypatch, shuffle, io_path):
    """Raw local chunks are read straight into the batches, with no group buffer read
    (``read_into``) at all: at most one read task per array per reader thread per group, every
    chunk file opened once per task, and one read call per run of consecutive file rows (so
    a group in storage order reads each chunk with one call, whatever its pieces): a
    ``preadv``, or an io_uring entry (the calls of a task go to the kernel in one batch)."""
    from shardload.formats.npy.read import NpyReader
    from shardload.load import runs, scatter, uring
    from shardload.plan.groups import iter_worker_spans

    tasks, preadvs, batches = [], [], []
    real, real_preadv, real_readv = scatter.read_runs, runs._preadv(), uring.Ring.readv
    monkeypatch.setattr(scatter, "read_runs", lambda *a: (tasks.append(a[1]), real(*a))[1])
    monkeypatch.setattr(
        runs, "_preadv", lambda: lambda *a: (preadvs.append(a[2]), real_preadv(*a))[1]
    )
    monkeypatch.setattr(
        uring.Ring, "readv", lambda self, *a: (batches.append(len(a[0])), real_readv(self, *a))[1]
    )
    monkeypatch.setattr(NpyReader, "read_into", None)
    got = collect(npy, batch_size=8, split="train", shuffle=shuffle, threads=2)
    monkeypatch.undo()
    sel, _, k = loader_selection(npy, split="train")
    plan = plan_for(
        npy,
        sel,
        batch_size=8,
        world_size=1,
        num_workers=1,
        shuffle=shuffle,
        seed=0,
        epoch=0,
        mode="drop",
        drop_last=False,
        shuffle_chunks=k,
    )
    groups = list(iter_worker_spans(plan, 0, 0))
    assert len(tasks) <= 2 * 2 * len(groups)
    calls = preadvs if io_path == "preadv" else [1] * sum(batches)
    assert (len(preadvs) == 0) == (io_path == "io_uring")  # no preadv when io_uring reads
    assert len(batches) == (len(tasks) if io_path == "io_uring" else 0)  # one batch per task
    if not shuffle:  # storage order: one read call per chunk of a group
        assert len(calls) == 2 * sum(len(np.unique(s.chunk)) for s, _ in groups)
    assert sorted(np.concatenate([b["index"] for b in got]).tolist()) == sorted(
        sel.global_rows().tolist()
    )
    for b in got:
        check_values(npy, b)


def test_scatter_planner_errors_surface_and_close_stops_its_threads(npy):
    """Groups are planned in a planner thread: an error there (here the batch allocator)
    is raised by ``next`` in the consuming thread, and closing the iterator mid-epoch leaves no
    planner or reader thread behind (none can write into a batch after it is reclaimed)."""
    import threading

    before = set(threading.enumerate())

    def names() -> set[str]:  # of the threads this test started
        new = set(threading.enumerate()) - before
        return {t.name.rsplit("_", 1)[0] for t in new if t.is_alive()}

    def broken(n: int):
        raise RuntimeError(f"no memory for a batch of {n}")

    it = shardload.iter_batches(npy, batch_size=8, split="train", allocate=broken)
    with pytest.raises(RuntimeError, match="no memory for a batch of 8"):
        next(it)
    it = shardload.iter_batches(npy, batch_size=8, split="train", prefetch=8)
    check_values(npy, next(it))
    assert {"shardload-plan", "shardload-read"} <= names()
    it.close()
    assert not {"shardload-plan", "shardload-read"} & names()


@pytest.mark.parametrize("fmt", ["npy-none", "zarr-none"])
@pytest.mark.parametrize("consumed", [1, 3, 5])
def test_scatter_and_gather_paths_agree(stores, fmt, consumed, monkeypatch):
    """Scatter reads give exactly the gather path's batches, fresh and resumed mid-group (a
    resumed group reads explicit rows: the bounding span, unwanted rows to scratch)."""
    from shardload.plan.epoch import plan_fingerprint

    store = stores[fmt]
    sel = select_rows(store, split="train")
    state = EpochState(1, consumed, 1, 2, "", ()).to_dict()
    state["fingerprint"] = plan_fingerprint(
        sel.sizes,
        chunk_ids=sel.ids,
        chunk_starts=sel.starts,
        batch_size=5,
        seed=2,
        shuffle_chunks=3,
    )
    kw = dict(batch_size=5, split="train", seed=2, num_workers=2, shuffle_chunks=3)
    runs = []
    for raw in (True, False):
        if not raw:
            monkeypatch.setattr(kinds_mod, "raw_sources", lambda *a: None)
        runs.append(
            [
                collect(store, **kw, worker=w, epoch=1, **extra)
                for w in range(2)
                for extra in ({}, {"state": state}, {"skip_batches": 2})
            ]
        )
    scatter_runs, gather_runs = runs
    for got, want in zip(scatter_runs, gather_runs, strict=True):
        assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in want]
        for b, w in zip(got, want, strict=True):
            for k in w:
                np.testing.assert_array_equal(b[k], w[k])
            check_values(store, b)


def test_batches_are_recycled_once_dropped(npy):
    """Batch memory is reused once the caller drops a batch, never while it holds one."""
    seen, held = set(), []
    for i, b in enumerate(shardload.iter_batches(npy, batch_size=4, seed=1)):
        seen.add(b["x"].ctypes.data)
        if i % 5 == 0:
            held.append(b)  # kept: its memory must not change under it
    for b in held:
        check_values(npy, b)
    n = sum(1 for _ in shardload.iter_batches(npy, batch_size=4, seed=1))
    assert len(seen) < n  # dropped batches' buffers came back


def test_resume_state_gives_the_rest(npy):
    full = collect(npy, batch_size=8, split="train", world_size=2, rank=1, seed=4)
    state = EpochState(0, 3, 2, 1, "", ()).to_dict()
    from shardload.plan.epoch import plan_fingerprint

    sel, _, k = loader_selection(npy, split="train")
    state["fingerprint"] = plan_fingerprint(
        sel.sizes,
        chunk_ids=sel.ids,
        chunk_starts=sel.starts,
        batch_size=8,
        seed=4,
        shuffle_chunks=k,
    )
    rest = collect(npy, batch_size=8, split="train", world_size=2, rank=1, seed=4, state=state)
    assert [b["index"].tolist() for b in rest] == [b["index"].tolist() for b in full[3:]]
    with pytest.raises(StateError):
        collect(npy, batch_size=8, split="train", world_size=2, rank=1, seed=5, state=state)
    # elastic: one rank now gets everything rank 0 and 1 had not consumed
    both = [
        collect(npy, batch_size=8, split="train", world_size=2, rank=r, seed=4) for r in range(2)
    ]
    left = {i for r in range(2) for b in both[r][3:] for i in b["index"].tolist()}
    one = collect(npy, batch_size=8, split="train", world_size=1, seed=4, state=state)
    assert {i for b in one for i in b["index"].tolist()} == left


def test_plain_zarr_group(tmp_path):
    import zarr

    g = zarr.open_group(str(tmp_path / "z"), mode="w")
    g.create_array("u", shape=(50, 3), chunks=(8, 3), dtype="f8")[:] = np.arange(150.0).reshape(
        50, 3
    )
    g.create_array("v", shape=(50,), chunks=(8,), dtype="i4")[:] = np.arange(50)
    idx = np.concatenate([b["index"] for b in collect(str(tmp_path / "z"), batch_size=7)])
    assert sorted(idx.tolist()) == list(range(50))
    b = collect(str(tmp_path / "z"), batch_size=7)[0]
    np.testing.assert_array_equal(b["v"], b["index"])


def test_bad_stores(tmp_path):
    import zarr

    g = zarr.open_group(str(tmp_path / "other_axis"), mode="w")
    g.create_array("u", shape=(50, 4), chunks=(50, 2), dtype="f4")
    with pytest.raises(StoreError, match="chunked along axis 0"):
        shardload.iter_batches(str(tmp_path / "other_axis"), batch_size=4)
    g = zarr.open_group(str(tmp_path / "unequal"), mode="w")
    g.create_array("u", shape=(50,), chunks=(10,), dtype="f4")
    g.create_array("v", shape=(40,), chunks=(10,), dtype="f4")
    with pytest.raises(StoreError, match="unequal lengths"):
        shardload.open_store(str(tmp_path / "unequal"), arrays=["u", "v"])


def test_bad_options(npy):
    with pytest.raises(StoreError, match=r"'test', 'train', 'val'"):
        shardload.iter_batches(npy, batch_size=4, split="nope")
    with pytest.raises(PlanError, match="batch"):
        shardload.iter_batches(npy, batch_size=500, split="val", world_size=2, drop_last=True)
    with pytest.raises(PlanError):
        shardload.iter_batches(npy, batch_size=4, split="test", world_size=100)
    with pytest.raises(PlanError):
        shardload.iter_batches(npy, batch_size=4, rank=2, world_size=2)
    with pytest.raises(StoreError, match="nope"):
        shardload.iter_batches(npy, batch_size=4, arrays=["nope"])


@pytest.mark.parametrize(
    ("fmt", "rel", "keep", "pattern"),
    [
        ("npy", "x/000003.npy", 200, r"chunk 3 .*000003\.npy"),
        ("zarr", "x/c/3/0", 100, r"chunk 3 .*x/c/3/0"),
    ],
)
@pytest.mark.parametrize("damage", ["delete", "truncate"])
def test_missing_or_corrupt_chunk(tmp_path, fmt, rel, keep, pattern, damage):
    """A missing or truncated chunk names the chunk and its file. npy and raw Zarr chunks are
    read by scatter, where a truncated file is caught before any read: no SIGBUS, no short
    batch."""
    make_store(tmp_path, fmt=fmt, n=60, chunk_rows=10, splits={"train": 1.0})
    path = tmp_path / "store" / rel
    if damage == "delete":
        path.unlink()
    else:
        path.write_bytes(path.read_bytes()[:keep])
    with pytest.raises(ChunkReadError, match=pattern):
        collect(str(tmp_path / "store"), batch_size=4)


@pytest.mark.parametrize("inline_bytes", [0, 1 << 30])  # gathers in the pool / all inline
@pytest.mark.parametrize("fmt", ["zarr-zstd", "npy-none", "zarr-none"])
def test_batches_follow_the_plan_whatever_the_threads(stores, fmt, inline_bytes, monkeypatch):
    """Batches equal the pure plan's rows in order, for any thread count, prefetch, allocator
    and per-worker skip (gathers run ahead in threads but are yielded in plan order)."""
    from shardload.load.spec import plan_for

    monkeypatch.setattr(gather_mod, "INLINE_GATHER_BYTES", inline_bytes)
    from shardload.plan.groups import iter_worker_batches

    store = stores[fmt]
    sel, _, k = loader_selection(store, split="train")  # the defaults
    kw = dict(batch_size=6, split="train", seed=4, epoch=2, num_workers=2, worker=1)
    plan = plan_for(
        store,
        sel,
        batch_size=6,
        world_size=1,
        num_workers=2,
        shuffle=True,
        seed=4,
        epoch=2,
        mode="drop",
        drop_last=False,
        shuffle_chunks=k,
    )
    want = [b.tolist() for b in iter_worker_batches(plan, 0, 1)]
    slots: list[dict] = []

    def allocate(n):  # gather into caller-owned arrays (as the torch ring does)
        if len(slots) % 2:
            slots.append({})
            return None  # every other batch: fresh arrays
        out = {
            "x": np.empty((n, 4), "f4"),
            "y": np.empty((n, 1), "i8"),
            "index": np.empty(n, "i8"),
        }
        slots.append(out)
        return out

    for opts in [dict(threads=1, prefetch=0), dict(threads=4), dict(threads=3, allocate=allocate)]:
        got = collect(store, **kw, **opts)
        assert [b["index"].tolist() for b in got] == want
        for b in got:
            check_values(store, b)
    for skip in (1, 3, len(want)):
        got = collect(store, **kw, skip_batches=skip)
        assert [b["index"].tolist() for b in got] == want[skip:]
    with pytest.raises(StateError, match="cannot skip"):
        collect(store, **kw, skip_batches=len(want) + 1)


def test_split_pieces_cover_the_selection_exactly():
    """Pieces are the selection's rows in order, at most ``piece_rows`` each, equal within a
    chunk (sizes differ by at most one), and every piece stays inside its chunk."""
    from shardload.load.select import Selection, split_pieces

    rng = np.random.default_rng(0)
    for _ in range(200):
        sizes = rng.integers(1, 40, size=rng.integers(1, 8))
        starts = np.concatenate(([0], np.cumsum(sizes)[:-1])) + 5
        sel = Selection(("x",), sizes, np.arange(len(sizes)) * 3, starts)
        p = int(rng.integers(0, 15))
        cut = split_pieces(sel, p)
        np.testing.assert_array_equal(cut.global_rows(), sel.global_rows())
        if p == 0:
            assert cut is sel
            continue
        assert cut.sizes.max() <= p and cut.sizes.min() >= 1
        for i, n, s in zip(sel.ids, sel.sizes, sel.starts, strict=True):
            mine = cut.ids == i
            assert cut.sizes[mine].sum() == n and np.ptp(cut.sizes[mine]) <= 1
            assert cut.starts[mine].min() == s and len(cut.sizes[mine]) == -(-n // p)
    with pytest.raises(PlanError, match="piece_rows"):
        split_pieces(sel, -1)


@pytest.mark.parametrize("fmt", ["npy-none", "zarr-none", "zarr-zstd", "hdf5-none"])
def test_pieces_are_the_shuffle_unit(stores, fmt):
    """With ``piece_rows``, ranks and workers still partition the split exactly, batches mix
    pieces of several chunks, and the values are right in every format."""
    store = stores[fmt]
    rows = split_rows(store, "train")
    seen, counts = [], []
    for rank in range(2):
        got = [
            collect(
                store,
                batch_size=4,
                split="train",
                rank=rank,
                world_size=2,
                worker=w,
                num_workers=2,
                seed=1,
                piece_rows=3,
                shuffle_chunks=3,
            )
            for w in range(2)
        ]
        counts.append(sum(len(g) for g in got))
        for b in (b for g in got for b in g):
            check_values(store, b)
            seen.extend(b["index"].tolist())
    assert counts[0] == counts[1]
    assert len(seen) == len(set(seen)) == len(rows) - len(rows) % 2
    assert set(seen) <= set(rows.tolist())
    whole = collect(store, batch_size=4, split="train", seed=1, piece_rows=0, shuffle_chunks=3)
    cut = collect(store, batch_size=4, split="train", seed=1, piece_rows=3, shuffle_chunks=3)
    assert [b["index"].tolist() for b in whole] != [b["index"].tolist() for b in cut]


def test_pieces_scatter_and_gather_agree_and_resume(stores, monkeypatch):
    """Scatter reads of pieces (which start inside chunks) equal the gather path's batches,
    fresh and resumed; a state saved with other pieces is refused, naming the options."""
    from shardload.plan.epoch import plan_fingerprint

    store = stores["zarr-none"]
    sel, _, _ = spec_mod.loader_selection(store, split="train", piece_rows=4)
    state = EpochState(0, 3, 1, 1, "", ()).to_dict()
    state["fingerprint"] = plan_fingerprint(
        sel.sizes, chunk_ids=sel.ids, chunk_starts=sel.starts, batch_size=5, seed=2
    )
    kw = dict(batch_size=5, split="train", seed=2, piece_rows=4)
    runs = []
    for raw in (True, False):
        if not raw:
            monkeypatch.setattr(kinds_mod, "raw_sources", lambda *a: None)
        runs.append([collect(store, **kw), collect(store, **kw, state=state)])
    for got, want in zip(*runs, strict=True):
        assert [b["index"].tolist() for b in got] == [b["index"].tolist() for b in want]
        for b, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(b["x"], w["x"])
    fresh, resumed = runs[0]
    assert [b["index"].tolist() for b in resumed] == [b["index"].tolist() for b in fresh[3:]]
    with pytest.raises(StateError, match="fingerprint"):
        collect(store, batch_size=5, split="train", seed=2, piece_rows=0, state=state)


@pytest.mark.parametrize("fmt", ["npy-none", "zarr-none", "zarr-zstd", "hdf5-none"])
def test_auto_pieces_only_for_raw_local_chunks(stores, fmt, monkeypatch):
    """``piece_rows=None`` cuts chunks into pieces of at most DEFAULT_PIECE_BYTES where rows are
    raw in local files (a piece of a compressed chunk would decode all of it)."""

    monkeypatch.setattr(options_mod, "DEFAULT_PIECE_BYTES", 100)  # a row: x 16 B, y 8 B, index 8 B
    store = stores[fmt]
    whole = select_rows(store, split="train")
    sel, _, _ = spec_mod.loader_selection(store, split="train", shuffle_chunks=4)
    if fmt in ("npy-none", "zarr-none"):
        assert sel.sizes.max() <= 3 and len(sel.sizes) > len(whole.sizes)
    else:
        np.testing.assert_array_equal(sel.sizes, whole.sizes)
    got = collect(store, batch_size=4, split="train", seed=3, shuffle_chunks=4)
    idx = np.concatenate([b["index"] for b in got])
    np.testing.assert_array_equal(np.sort(idx), split_rows(store, "train"))


@pytest.mark.parametrize("fmt", ["npy-none", "zarr-none"])
def test_uniform_shuffle_reads_rows_where_they_lie(stores, fmt):
    """``shuffle="uniform"`` yields the plan's uniform permutation with the right values, on
    every rank and worker; resumed (also on another world shape) it yields exactly the rest."""
    from shardload.plan.groups import iter_rank_batches
    from shardload.plan.resume import plan_state

    store = stores[fmt]
    kw = dict(batch_size=5, split="train", seed=3, shuffle="uniform", epoch=1)
    sel, _, k = loader_selection(store, split="train", shuffle="uniform")
    plan = plan_for(
        store,
        sel,
        batch_size=5,
        world_size=2,
        num_workers=2,
        shuffle="uniform",
        seed=3,
        epoch=1,
        mode="drop",
        drop_last=False,
        shuffle_chunks=k,
    )
    for r in range(2):
        got = [
            collect(store, **kw, rank=r, world_size=2, worker=w, num_workers=2) for w in range(2)
        ]
        rank = [b for pair in zip(*got, strict=False) for b in pair]
        want = list(iter_rank_batches(plan, r))
        assert [b["index"].tolist() for b in rank] == [b.tolist() for b in want]
        for b in rank:
            check_values(store, b)
    state = {**plan_state(plan, 3).to_dict(), "dataset": None}
    del state["dataset"]
    rest = [
        collect(store, **kw, rank=0, world_size=1, worker=w, num_workers=3, state=state)
        for w in range(3)
    ]
    seen = {i for r in range(2) for b in list(iter_rank_batches(plan, r))[:3] for i in b.tolist()}
    left = {i for r in range(2) for b in list(iter_rank_batches(plan, r))[3:] for i in b.tolist()}
    got = [i for g in rest for b in g for i in b["index"].tolist()]
    assert len(got) == len(set(got)) and set(got) <= left and not set(got) & seen
    for g in rest:
        for b in g:
            check_values(store, b)


def test_uniform_shuffle_needs_raw_local_chunks(stores):
    with pytest.raises(PlanError, match="uniform"):
        collect(stores["zarr-zstd"], batch_size=4, shuffle="uniform")


def test_loader_doctests():
    import doctest

    from shardload.load import batches, files, kinds, runs, scatter, select, spec

    for mod in (scatter, runs, files, select, batches, spec, kinds):
        assert doctest.testmod(mod, optionflags=doctest.ELLIPSIS).failed == 0, mod.__name__


@pytest.mark.parametrize("fmt", ["zarr-none", "zarr-zstd"])
def test_default_shuffle_is_small_pieces_on_raw_local_chunks(stores, fmt, monkeypatch):
    """The default cuts a group of the earlier default's rows (4 pieces of at most
    DEFAULT_PIECE_BYTES) into DEFAULT_GROUP_PIECES small pieces on raw local chunks; whole
    chunks elsewhere; and the batches still cover the split exactly."""

    monkeypatch.setattr(options_mod, "DEFAULT_PIECE_BYTES", 100)  # 3-row pieces (32 B a row)
    monkeypatch.setattr(options_mod, "DEFAULT_GROUP_PIECES", 6)  # 12 rows -> 6 pieces of 2
    store = stores[fmt]
    whole = select_rows(store, split="train")
    sel, piece, k = spec_mod.loader_selection(store, split="train")
    if fmt in ("npy-none", "zarr-none"):
        assert (piece, k) == (2, 6) and sel.sizes.max() == 2
    else:  # whole chunks, groups by decoded bytes: these tiny chunks, the most chunks a group
        assert (piece, k) == (0, options_mod.MAX_GROUP_CHUNKS)
        np.testing.assert_array_equal(sel.sizes, whole.sizes)
    got = collect(store, batch_size=4, split="train", seed=3)
    idx = np.concatenate([b["index"] for b in got])
    np.testing.assert_array_equal(np.sort(idx), split_rows(store, "train"))
    for b in got:
        check_values(store, b)


def test_default_pieces_are_no_longer_than_the_groups_batch_count(tmp_path, monkeypatch):
    """Dealt groups put one row of a piece in a batch only while the piece has no more rows
    than the group has batches: the default pieces shrink with bigger batches (more pieces a
    group, up to MAX_GROUP_PIECES), never grow past DEFAULT_GROUP_PIECES' size, and the group
    keeps its rows."""

    monkeypatch.setattr(options_mod, "DEFAULT_PIECE_BYTES", 30 * 32)  # 30-row big pieces
    monkeypatch.setattr(options_mod, "DEFAULT_GROUP_PIECES", 10)  # 120 rows -> 12-row pieces
    monkeypatch.setattr(options_mod, "MAX_GROUP_PIECES", 40)  # ... at least 3-row pieces
    store = make_store(tmp_path / "s", fmt="zarr", n=480, chunk_rows=120)  # 32 B a row
    got = {
        b: spec_mod.loader_selection(store, split="train", batch_size=b)[1:]
        for b in (None, 4, 10, 20, 30, 1000)
    }
    assert got == {
        None: (12, 10),
        4: (12, 10),
        10: (12, 10),
        20: (6, 20),
        30: (4, 30),
        1000: (3, 40),
    }


@pytest.mark.parametrize("fmt", ["npy-none", "zarr-none"])
@pytest.mark.parametrize("opts", [{}, {"shuffle_chunks": 4}], ids=["default", "legacy"])
def test_elastic_resume_through_the_scatter_reader(stores, fmt, opts):
    """A state of 2 ranks x 2 workers resumed on 1 rank with 0 or 3 workers reads exactly
    the unseen rows with the right values (explicit-row segments through scatter reads)."""
    from shardload.plan.groups import iter_rank_batches
    from shardload.plan.resume import plan_state

    store = stores[fmt]
    sel, _, k = loader_selection(store, split="train", **opts)
    plan = plan_for(
        store,
        sel,
        batch_size=4,
        world_size=2,
        num_workers=2,
        shuffle=True,
        seed=1,
        epoch=0,
        mode="drop",
        drop_last=False,
        shuffle_chunks=k,
    )
    for consumed in (1, plan.batches_per_rank - 1):
        state = plan_state(plan, consumed).to_dict()
        ranks = [list(iter_rank_batches(plan, r)) for r in range(2)]
        left = {i for batches in ranks for b in batches[consumed:] for i in b.tolist()}
        for workers in (0, 3):
            got = []
            for w in range(max(1, workers)):
                for b in shardload.iter_batches(
                    store,
                    batch_size=4,
                    split="train",
                    seed=1,
                    state=state,
                    worker=w,
                    num_workers=workers,
                    **opts,
                ):
                    check_values(store, b)
                    got += b["index"].tolist()
            assert len(got) == len(set(got)) and set(got) == left


def test_store_fingerprint_sees_every_feature_statistic() -> None:
    """numpy prints long arrays abbreviated: the fingerprint must hash every value, so a
    resume state saved for other statistics (other data, same layout) is refused."""
    from types import SimpleNamespace

    from shardload.load.select import store_fingerprint
    from shardload.manifest.features import FeatureStats

    def fingerprint(mean: np.ndarray) -> str:
        n = len(mean)
        stats = FeatureStats(
            count=10,
            mean=mean,
            std=np.ones(n),
            min=np.zeros(n),
            max=np.ones(n),
            nan_count=np.zeros(n, "i8"),
        )
        manifest = SimpleNamespace(
            length=10,
            chunk_bounds=[0, 10],
            arrays={"x": SimpleNamespace(shape=(10, n), dtype="float32")},
            stats={"x": stats},
        )
        sel = SimpleNamespace(arrays=("x",), sizes=[10], ids=[0], starts=[0])
        return store_fingerprint(SimpleNamespace(manifest=manifest), sel)

    base = np.zeros(3000)
    other = base.copy()
    other[1500] = 1.0  # hidden in the "..." of numpy's summary
    assert fingerprint(base) == fingerprint(base.copy())
    assert fingerprint(base) != fingerprint(other)
