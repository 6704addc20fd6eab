"""``iter_batches(..., window=K, window_views=True)``: windows of a batch in date order served as
one read-only strided view of the batch's distinct states (issue #27, speed in date order).

The batches equal those of the default (copied) windows on every format, in date order and
shuffled, with missing dates, ``window_step`` and read groups; every array is read-only; in
date order windows really share memory (nothing copied); each distinct state is read once; a
batch held while later ones are read keeps its values; the planner is checked against brute
force.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardload
from dated_fixtures import dated_store, window_stores
from shardload.errors import PlanError
from shardload.plan.dated import (
    WindowGrid,
    plan_batch_reads,
    plan_grid_reads,
    plan_window_grid,
    window_rows,
)
from test_dated_windows import MISSING, CountingReader, check_batch


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return window_stores(tmp_path_factory.mktemp("views"), MISSING)


@pytest.mark.parametrize("fmt", ["npy", "zstd", "sharded"])
@pytest.mark.parametrize(
    ("window", "step", "shuffle"), [(4, 1, False), (3, 2, False), (4, 1, True)]
)
def test_views_serve_the_same_batches_read_only(stores, fmt, window, step, shuffle):
    st, full = stores[fmt], stores["full"]
    opts = dict(batch_size=6, window=window, window_step=step, shuffle=shuffle, threads=2, seed=4)
    copied = list(shardload.iter_batches(st, **opts))
    viewed = list(shardload.iter_batches(st, **opts, window_views=True))  # all held at once
    assert len(viewed) == len(copied)
    shared = 0
    for v, c in zip(viewed, copied, strict=True):
        assert v.keys() == c.keys()
        for k in c:
            assert v[k].shape == c[k].shape and v[k].dtype == c[k].dtype
            np.testing.assert_array_equal(v[k], c[k])
        check_batch(v, st, full, window, step)
        for name in ("x", "y"):
            assert not v[name].flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                v[name][0, 0] += 1
        shared += np.shares_memory(v["x"][:1], v["x"][1:])  # window 0's states in others
    if not shuffle:  # in date order windows share their states' memory: nothing copied
        assert shared > len(viewed) // 2
    else:
        assert shared == 0


def test_views_read_each_distinct_state_once(tmp_path):
    st = dated_store(tmp_path, n=40, missing=(7,))
    full = st.read("x", 0, 40)
    counting = CountingReader(st.reader)
    st._reader = counting
    want = []
    for b in shardload.iter_batches(
        st, batch_size=6, window=4, shuffle=False, threads=2, window_views=True
    ):
        rows = b["index"][:, None] + np.arange(4)
        want += np.unique(rows).tolist()
        np.testing.assert_array_equal(b["x"], full[rows])
    for name in ("x", "y"):
        assert sorted(counting.rows[name]) == sorted(want)


@pytest.mark.parametrize("fmt", ["npy", "sharded"])
def test_views_with_read_groups(stores, fmt):
    """Each member of a read group gets its slice of the same windows, as views."""
    st, full = stores[fmt], stores["full"]
    opts = dict(batch_size=5, window=3, shuffle=False, world_size=4, read_group_size=2)
    opts["read_group_axis"] = {"x": -1, "y": None}
    for rank in range(4):
        copied = list(shardload.iter_batches(st, rank=rank, **opts))
        viewed = list(shardload.iter_batches(st, rank=rank, **opts, window_views=True))
        assert len(viewed) == len(copied) > 0
        for v, c in zip(viewed, copied, strict=True):
            for k in c:
                np.testing.assert_array_equal(v[k], c[k])
            assert v["x"].shape[-1] == full["x"].shape[-1] // 2
            assert not v["x"].flags.writeable


def test_window_views_options_are_checked(stores):
    st = stores["npy"]
    with pytest.raises(PlanError, match="window_views=True needs window="):
        shardload.iter_batches(st, batch_size=4, window_views=True)

    def slots(n):
        return {
            "x": np.empty((n, 3, 24), "f4"),
            "y": np.empty((n, 3, 1), "i8"),
            "dates": np.empty((n, 3), "M8[s]"),
            "index": np.empty(n, "i8"),
        }

    with pytest.raises(PlanError, match=r"window_views=True.*allocate="):
        shardload.iter_batches(st, batch_size=4, window=3, window_views=True, allocate=slots)


def test_window_grid_against_brute_force():
    """plan_window_grid is a view of exactly the batch's distinct rows when it says so (and
    says so for evenly spaced starts that use every row between), plan_grid_reads reads them
    as plan_batch_reads would."""
    rng = np.random.default_rng(1)
    found = 0
    for _ in range(2000):
        b, k = int(rng.integers(1, 9)), int(rng.integers(1, 6))
        step, spacing = int(rng.integers(1, 5)), int(rng.integers(1, 5))
        first = int(rng.integers(0, 20)) + spacing * np.arange(b)
        if b > 2 and rng.random() < 0.2:
            first[-1] += 1  # not evenly spaced
        rows = window_rows(first, window=k, step=step)
        distinct = np.unique(rows)
        grid = plan_window_grid(first, window=k, step=step)
        even = b < 2 or (np.diff(first) == first[1] - first[0]).all()
        if grid is None:
            if even and b > 1:  # only refused when rows between would be read for nothing
                gap = np.gcd(first[1] - first[0], step)
                assert len(distinct) < (distinct[-1] - distinct[0]) // gap + 1
            assert not even or b > 1
            continue
        found += 1
        assert isinstance(grid, WindowGrid) and even
        buf = grid.first_row + grid.gap * np.arange(grid.num_rows)
        assert buf.tolist() == distinct.tolist()  # each distinct row once, nothing else
        view = np.lib.stride_tricks.as_strided(
            buf, (b, k), (grid.window_stride * buf.itemsize, grid.state_stride * buf.itemsize)
        )
        assert view.tolist() == rows.tolist()
        bounds = np.unique(np.concatenate(([0, 80], rng.integers(1, 60, 5))))
        got, want = plan_grid_reads(grid, bounds), plan_batch_reads(buf, bounds)
        for f in ("rows", "places", "lengths", "copy_to", "copy_from", "copy_lengths"):
            assert getattr(got, f).tolist() == getattr(want, f).tolist(), f
    assert found > 1000


def test_a_failed_read_of_viewed_windows_names_rows_and_array(tmp_path):
    from shardload.errors import ChunkReadError

    st = dated_store(tmp_path, n=40)

    class Broken(CountingReader):
        def read_into(self, name, start, stop, out):
            raise OSError("disk gone")

    st._reader = Broken(st.reader)
    it = shardload.iter_batches(st, batch_size=4, window=3, shuffle=False, window_views=True)
    with pytest.raises(ChunkReadError, match=r"rows 0:6 \(chunks 0\.\.1\) of array 'x'.*disk gone"):
        next(it)


@pytest.mark.parametrize(("threads", "calls_per_batch"), [(2, 1), (6, 2)])
def test_views_in_date_order_hand_off_one_read_per_thread_in_flight(
    tmp_path, monkeypatch, threads, calls_per_batch
):
    """A batch of windows in date order is read in as few reader calls as keep every thread
    busy over the batches in flight (``prefetch=2``: three), each call one hand-off to a
    reader thread: one call a batch with 2 threads, two with 6; the values are the store's."""
    from shardload.load import dated

    monkeypatch.setattr(dated, "TASK_BYTES", 1)  # any state size: cut only by threads
    st = dated_store(tmp_path, n=40)
    full = st.read("x", 0, 40)
    calls: list[tuple[str, int, int]] = []

    class Calls(CountingReader):
        def read_into(self, name, start, stop, out):
            calls.append((name, start, stop))
            super().read_into(name, start, stop, out)

    st._reader = Calls(st.reader)
    opts = dict(batch_size=6, window=4, shuffle=False, threads=threads, window_views=True)
    batches = list(shardload.iter_batches(st, **opts))
    for b in batches:
        np.testing.assert_array_equal(b["x"], full[b["index"][:, None] + np.arange(4)])
    assert len(batches) == 7  # 37 windows
    assert len([c for c in calls if c[0] == "x"]) == calls_per_batch * len(batches)


def test_default_windows_in_date_order_are_writable_copies(stores):
    """Windows stay copies by default, also in date order where views would be faster: an
    in-place write to one window of a default batch changes that window only (no state is
    shared with another window), so ``torch.from_numpy(batch["x"])`` and in-place
    normalisation are safe; a view shared by windows would pass a write through torch
    silently (docs/weather.md, "Views instead of copies")."""
    st, full = stores["npy"], stores["full"]
    opts = dict(batch_size=6, window=4, shuffle=False, threads=2)
    for b in shardload.iter_batches(st, **opts):
        x = b["x"]
        assert x.flags.writeable and x.flags.c_contiguous
        assert not np.shares_memory(x[:1], x[1:])
        x[0] -= 1000.0  # a caller normalising window 0 in place
        rows = b["index"][:, None] + np.arange(4)
        np.testing.assert_array_equal(x[1:], full["x"][rows[1:]])
        np.testing.assert_array_equal(x[0], full["x"][rows[0]] - 1000.0)
