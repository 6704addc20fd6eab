"""Windows of dates at load time (``iter_batches(..., window=K)`` on a dated store, issue #27).

Every yielded window equals the numpy reference ``x[s : s + K * step : step]``, its dates are
the time axis's, no window touches a missing date or leaves its split, every window comes once
an epoch over 1, 2 and 4 ranks (equal batch counts), resume is exact, torch workers serve the
same, and a batch reads each of its distinct states once.
"""

from __future__ import annotations

import numpy as np
import pytest

import shardload
from _resume import assert_resumes_exactly
from _stores import make_store
from dated_fixtures import dated_store, set_time_axis, window_stores
from shardload.errors import PlanError, StateError
from shardload.load.spec import LoadSpec

MISSING = (10, 11, 50, 51, 52, 90)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    return window_stores(tmp_path_factory.mktemp("dated"), MISSING)


def expected_starts(store, window: int, step: int, split: str | None = None) -> list[int]:
    """Brute force: rows whose window lies in the split and touches no missing date."""
    m = store.manifest
    rows = set(range(m.length))
    if split is not None:
        b = np.asarray(m.chunk_bounds)
        rows = {r for c in m.split_chunks(split) for r in range(int(b[c]), int(b[c + 1]))}
    ok = rows - set(store.time.missing)
    return [r for r in range(m.length) if all(r + j * step in ok for j in range(window))]


def check_batch(batch, store, full, window: int, step: int) -> None:
    dates = store.time.dates
    missing = set(store.time.missing)
    for i, s in enumerate(np.asarray(batch["index"]).tolist()):
        for a in ("x", "y"):
            np.testing.assert_array_equal(
                np.asarray(batch[a][i]), full[a][s : s + window * step : step]
            )
        np.testing.assert_array_equal(
            np.asarray(batch["dates"][i]).astype("datetime64[s]"),
            dates[s : s + window * step : step],
        )
        assert not missing & {s + j * step for j in range(window)}
    assert not np.isnan(np.asarray(batch["x"])).any()


@pytest.mark.parametrize("fmt", ["npy", "zstd", "sharded"])
@pytest.mark.parametrize(("window", "step"), [(3, 1), (5, 2), (1, 1)])
def test_every_window_once_equal_to_numpy(stores, fmt, window, step):
    st, full = stores[fmt], stores["full"]
    seen = []
    for batch in shardload.iter_batches(
        st, batch_size=7, window=window, window_step=step, split="train", seed=3
    ):
        assert batch["x"].shape[1:] == (window, 24) and batch["dates"].dtype == "M8[s]"
        assert batch["y"].shape[1:] == (window, 1) and batch["dates"].shape[1:] == (window,)
        check_batch(batch, st, full, window, step)
        seen += batch["index"].tolist()
    assert sorted(seen) == expected_starts(st, window, step, "train")
    assert seen != sorted(seen)  # shuffled


def test_windows_without_a_split_and_in_order(stores):
    st, full = stores["npy"], stores["full"]
    got = [b for b in shardload.iter_batches(st, batch_size=16, window=4, shuffle=False, threads=2)]
    idx = np.concatenate([b["index"] for b in got]).tolist()
    assert idx == expected_starts(st, 4, 1)  # every window of the store, in date order
    for b in got:
        check_batch(b, st, full, 4, 1)


@pytest.mark.parametrize("world", [1, 2, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_each_window_once_over_ranks_with_equal_batches(stores, world, workers):
    st = stores["npy"]
    want = expected_starts(st, 3, 2, "train")
    counts, seen = [], []
    for rank in range(world):
        n = 0
        for w in range(max(1, workers)):
            for b in shardload.iter_batches(
                st,
                batch_size=5,
                window=3,
                window_step=2,
                split="train",
                rank=rank,
                world_size=world,
                worker=w,
                num_workers=workers,
                seed=1,
                epoch=2,
            ):
                seen += b["index"].tolist()
                n += 1
        counts.append(n)
    assert len(set(counts)) == 1  # equal batches on every rank
    assert len(seen) == len(set(seen))  # no window twice
    assert set(seen) <= set(want) and len(want) - len(seen) < world  # mode="drop"


def test_splits_keep_windows_inside_their_rows(stores):
    st = stores["npy"]
    m = st.manifest
    for split in ("train", "val"):
        b = np.asarray(m.chunk_bounds)
        rows = {r for c in m.split_chunks(split) for r in range(int(b[c]), int(b[c + 1]))}
        got = [
            s
            for batch in shardload.iter_batches(st, batch_size=4, window=3, split=split)
            for s in batch["index"].tolist()
        ]
        assert got and all({s, s + 1, s + 2} <= rows for s in got)
        assert sorted(got) == expected_starts(st, 3, 1, split)


@pytest.mark.parametrize(("fmt", "shuffle"), [("npy", True), ("zstd", True), ("npy", "uniform")])
def test_resume_mid_epoch_equals_the_uninterrupted_run(stores, fmt, shuffle):
    assert_resumes_exactly(
        stores[fmt],
        world=2,
        workers=2,
        batch_size=4,
        window=3,
        window_step=2,
        split="train",
        shuffle=shuffle,
    )


def test_streaming_dataloader_resumes_windows_mid_epoch(stores):
    pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    st = stores["npy"]

    def loader(workers):
        ds = StreamingDataset(st, batch_size=4, split="train", seed=7, window=4)
        return StreamingDataLoader(ds, num_workers=workers)

    whole = [b["index"].tolist() for b in loader(2)]
    first = loader(2)
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(5)]
    state = first.state_dict()
    del it
    rest = loader(0)  # another worker count
    rest.load_state_dict(state)
    tail = [b["index"].tolist() for b in rest]
    assert head == whole[:5]
    seen = [s for b in head + tail for s in b]
    assert sorted(seen) == sorted(s for b in whole for s in b) == expected_starts(st, 4, 1, "train")


def test_elastic_resume_sees_each_window_once(stores):
    st = stores["npy"]
    kw = dict(batch_size=4, window=3, split="train", seed=5)
    spec = LoadSpec.build(st, **kw)
    from shardload.plan.resume import plan_state

    plan = spec.plan(world_size=2, num_workers=1, epoch=1)
    head = []
    for rank in range(2):
        it = shardload.iter_batches(st, rank=rank, world_size=2, epoch=1, **kw)
        head += [next(it)["index"].tolist() for _ in range(3)]
    state = plan_state(plan, 3).to_dict()
    state["dataset"] = spec.fingerprint
    tail = []
    for rank in range(3):  # elastic: 3 ranks now
        for b in shardload.iter_batches(st, rank=rank, world_size=3, state=state, **kw):
            tail += b["index"].tolist()
    seen = [s for b in head for s in b] + tail
    assert len(seen) == len(set(seen))
    # mode="drop": at most 1 window left out by the first 2 ranks, 2 by the 3 that resume
    assert set(seen) <= set(expected_starts(st, 3, 1, "train"))
    assert len(expected_starts(st, 3, 1, "train")) - len(seen) <= 3


def test_a_state_of_other_windows_is_refused(stores):
    st = stores["npy"]
    kw = dict(batch_size=4, split="train")
    spec = LoadSpec.build(st, window=3, **kw)
    from shardload.plan.resume import plan_state

    state = plan_state(spec.plan(world_size=1, num_workers=1, epoch=0), 1).to_dict()
    state["dataset"] = spec.fingerprint
    with pytest.raises(StateError, match="other data"):
        list(shardload.iter_batches(st, window=4, state=state, **kw))


class CountingReader:
    """A store reader that records every row it reads (per array)."""

    def __init__(self, inner):
        self.inner, self.rows = inner, {}

    def _count(self, name, start, stop):
        self.rows.setdefault(name, []).extend(range(start, stop))

    def read(self, name, start, stop):
        self._count(name, start, stop)
        return self.inner.read(name, start, stop)

    def read_into(self, name, start, stop, out):
        self._count(name, start, stop)
        out[...] = self.inner.read(name, start, stop)

    def close(self):
        self.inner.close()


def test_each_distinct_state_is_read_once_per_batch(tmp_path):
    st = dated_store(tmp_path, n=40, missing=(7,))
    full = st.read("x", 0, 40)
    counting = CountingReader(st.reader)
    st._reader = counting
    want, states = [], 0
    # in date order, batches of overlapping windows share most of their states
    for b in shardload.iter_batches(st, batch_size=6, window=4, shuffle=False, threads=2):
        rows = b["index"][:, None] + np.arange(4)
        want += np.unique(rows).tolist()  # each distinct state of the batch, once
        states += rows.size
        np.testing.assert_array_equal(b["x"], full[rows])
    for name in ("x", "y"):  # batches are read ahead: the epoch's reads, batch by batch
        assert sorted(counting.rows[name]) == sorted(want)
    assert len(want) < states / 2  # the windows shared most states


def test_window_needs_a_time_axis_and_room(tmp_path, stores):
    plain = make_store(tmp_path, n=30)
    with pytest.raises(PlanError, match=r"window=3: .* has no time axis"):
        shardload.iter_batches(plain, batch_size=2, window=3)
    with pytest.raises(PlanError, match=r"window=40 .* longest run of existing dates is 38 rows"):
        shardload.iter_batches(stores["npy"], batch_size=2, window=40)
    with pytest.raises(PlanError, match="window_step must be an integer >= 1"):
        shardload.iter_batches(stores["npy"], batch_size=2, window=2, window_step=0)
    with pytest.raises(PlanError, match="window_step= needs window="):
        shardload.iter_batches(stores["npy"], batch_size=2, window_step=2)
    dated = set_time_axis(tmp_path / "store", missing=range(0, 30, 2))
    with pytest.raises(PlanError, match="longest run of existing dates is 1 rows"):
        shardload.iter_batches(dated, batch_size=2, window=2)


def test_streaming_dataset_with_two_workers(stores):
    torch = pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    st, full = stores["npy"], stores["full"]
    ds = StreamingDataset(st, batch_size=6, split="train", seed=2, window=3, window_step=2)
    seen = []
    for batch in StreamingDataLoader(ds, num_workers=2):
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape[1:] == (3, 24)
        assert batch["dates"].dtype == torch.int64
        check_batch(batch, st, full, 3, 2)
        seen += batch["index"].tolist()
    assert sorted(seen) == expected_starts(st, 3, 2, "train")


def test_map_dataset_serves_windows(stores):
    pytest.importorskip("torch")
    from shardload.torch import MapDataset

    st, full = stores["zstd"], stores["full"]
    ds = MapDataset(st, split="train", window=3, window_step=2)
    want = expected_starts(st, 3, 2, "train")
    assert len(ds) == len(want)
    for i in (0, 1, len(ds) // 2, len(ds) - 1):
        item = ds[i]
        assert int(item["index"]) == want[i] and item["x"].shape == (3, 24)
        batch = {k: v.numpy()[None] for k, v in item.items() if k != "index"}
        batch["index"] = np.array([want[i]])
        check_batch(batch, st, full, 3, 2)


@pytest.mark.slow  # ~10 s here, most of it importing lightning
def test_datamodule_passes_windows_through(stores):
    pytest.importorskip("lightning")
    from types import SimpleNamespace

    from shardload.torch.lightning import ShardloadDataModule

    st, full = stores["npy"], stores["full"]
    dm = ShardloadDataModule(st, batch_size=8, seed=1, test_split=None, window=4)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True)
    for loader, split in ((dm.train_dataloader(), "train"), (dm.val_dataloader(), "val")):
        seen = []
        for batch in loader:
            check_batch(batch, st, full, 4, 1)
            seen += batch["index"].tolist()
        assert sorted(seen) == expected_starts(st, 4, 1, split)


def test_window_planners_against_brute_force():
    """plan_window_starts and plan_batch_reads (pure) over random masks, selections, batches."""
    from shardload.plan.dated import plan_batch_reads, plan_window_starts, window_rows

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(5, 60))
        ok = rng.random(n) > 0.15
        bounds = np.unique(np.concatenate(([0, n], rng.integers(1, n, 4))))
        chunks = np.sort(rng.choice(len(bounds) - 1, int(rng.integers(1, len(bounds))), False))
        sizes, starts = np.diff(bounds)[chunks], bounds[chunks]
        window, step = int(rng.integers(1, 4)), int(rng.integers(1, 3))
        rows = {r for a, m in zip(starts, sizes, strict=True) for r in range(a, a + m)}
        want = [
            r
            for r in range(n)
            if all(r + j * step in rows and ok[r + j * step] for j in range(window))
        ]
        if not want:
            with pytest.raises(PlanError, match="fits nowhere"):
                plan_window_starts(ok, sizes, chunks, starts, window=window, step=step)
            continue
        got_sizes, got_ids, got_starts = plan_window_starts(
            ok, sizes, chunks, starts, window=window, step=step
        )
        got = [s + i for s, m in zip(got_starts, got_sizes, strict=True) for i in range(m)]
        assert got == want
        for s, m, c in zip(got_starts, got_sizes, got_ids, strict=True):  # each run in its chunk
            assert bounds[c] <= s and s + m <= bounds[c + 1]
        first = rng.choice(want, int(rng.integers(1, 2 * len(want) + 1)))
        flat = window_rows(first, window=window, step=step).reshape(-1)
        reads = plan_batch_reads(flat, bounds)
        out = np.full(len(flat), -1)
        for r, p, m in zip(reads.rows, reads.places, reads.lengths, strict=True):
            assert np.searchsorted(bounds, r, "right") == np.searchsorted(
                bounds, r + m - 1, "right"
            )
            out[p : p + m] = np.arange(r, r + m)
        assert reads.num_rows == len(np.unique(flat))  # each distinct row read once
        for t, f, m in zip(reads.copy_to, reads.copy_from, reads.copy_lengths, strict=True):
            out[t : t + m] = out[f : f + m]
        assert out.tolist() == flat.tolist()


def test_windows_of_a_row_range(stores):
    st, full = stores["npy"], stores["full"]
    got = []
    for b in shardload.iter_batches(st, batch_size=4, window=3, rows=(20, 70), seed=2):
        check_batch(b, st, full, 3, 1)
        got += b["index"].tolist()
    want = [s for s in expected_starts(st, 3, 1) if s >= 20 and s + 2 < 70]
    assert sorted(got) == want


def test_default_window_shuffle_mixes_as_a_uniform_shuffle(tmp_path):
    """The windows' default shuffle, on 2 ranks: batches as varied as a uniform shuffle's of the
    same windows (variance inflation of the batch mean of the date and of an AR(1) series, and
    chunks per batch), where date order is far from it (the figures can fail)."""
    from shardload.plan.groups import iter_rank_batches
    from shardload.plan.quality import quality

    st = dated_store(tmp_path, n=4000, grid=(1, 1), missing=(100, 101, 2500), chunk_rows=50)
    chunk_of = np.repeat(np.arange(80), 50)

    def figures(shuffle):
        spec = LoadSpec.build(st, batch_size=32, window=5, window_step=2, shuffle=shuffle)
        epochs = []
        for epoch in (0, 1):
            plan = spec.plan(world_size=2, num_workers=1, epoch=epoch)
            epochs.append([b for r in range(2) for b in iter_rank_batches(plan, r)])
        return quality(epochs, chunk_of)

    q = figures(True)
    assert q["vif_pos"] < 1.4 and q["vif_ar"] < 1.4, q
    assert q["chunks_per_batch_ratio"] > 0.95 and q["recurrence"] < 1.5, q
    in_order = figures(False)
    assert in_order["vif_pos"] > 20 and in_order["chunks_per_batch_ratio"] < 0.2, in_order


def test_a_callers_batch_memory_must_have_the_window_shapes(stores):
    st = stores["npy"]

    def rows_not_windows(n):  # the shapes of a batch of rows, not of windows
        return {
            "x": np.empty((n, 24), "f4"),
            "y": np.empty((n, 1), "i8"),
            "dates": np.empty((n, 3), "M8[s]"),
            "index": np.empty(n, "i8"),
        }

    it = shardload.iter_batches(st, batch_size=4, window=3, allocate=rows_not_windows)
    with pytest.raises(PlanError, match=r"allocate\(4\)\['x'\] has shape \(4, 24\).*\(4, 3, 24\)"):
        next(it)


def test_windows_with_read_groups_resume_mid_epoch(stores):
    """Windows and read groups together (4 ranks in 2 groups, x cut along its last axis): the
    ranks of a group get the same windows, their slices together are the numpy windows, and a
    state saved mid-epoch gives each rank exactly the rest of its epoch."""
    pytest.importorskip("torch")
    from shardload.torch import StreamingDataset

    st, full = stores["npy"], stores["full"]

    def dataset(rank):
        return StreamingDataset(
            st,
            batch_size=4,
            split="train",
            seed=3,
            rank=rank,
            world_size=4,
            window=3,
            window_step=2,
            read_group_size=2,
            read_group_axis={"x": -1, "y": None},
        )

    whole = {r: list(dataset(r)) for r in range(4)}
    for g in (0, 2):
        for a, b in zip(whole[g], whole[g + 1], strict=True):
            assert a["index"].tolist() == b["index"].tolist()
            x = np.concatenate([a["x"].numpy(), b["x"].numpy()], axis=-1)
            rows = a["index"].numpy()[:, None] + 2 * np.arange(3)
            np.testing.assert_array_equal(x, full["x"][rows])
            np.testing.assert_array_equal(a["y"].numpy(), full["y"][rows])
    seen = sorted(i for g in (0, 2) for b in whole[g] for i in b["index"].tolist())
    assert len(set(seen)) == len(seen) and set(seen) <= set(expected_starts(st, 3, 2, "train"))
    for r in range(4):
        ds = dataset(r)
        it = iter(ds)
        [next(it) for _ in range(2)]
        state = ds.state_dict()
        again = dataset(r)
        again.load_state_dict(state)
        rest = list(again)
        assert [b["index"].tolist() for b in rest] == [b["index"].tolist() for b in whole[r][2:]]
        for got, want in zip(rest, whole[r][2:], strict=True):
            np.testing.assert_array_equal(got["x"].numpy(), want["x"].numpy())


def test_windows_of_a_store_prepare_dated(tmp_path):
    """A dated store as prepare writes it (gaps in the source's dates, an all-NaN state): every
    window equals the source's states at its dates, and none touches a missing date."""
    import pandas as pd
    import xarray as xr

    dates = pd.date_range("2021-03-01", periods=30, freq="6h")
    t = np.random.default_rng(1).normal(size=(30, 2, 3)).astype("f4")
    t[12] = np.nan
    ds = xr.Dataset({"t": (("time", "lat", "lon"), t)}, coords={"time": dates})
    ds.drop_isel(time=[5, 20]).to_netcdf(tmp_path / "src.nc")
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    st = prepare(
        {
            "source": str(tmp_path / "src.nc"),
            "sample_dims": ["time"],
            "arrays": {"x": ["t"]},
            "splits": {},
            "nan": "ignore",
            "out": str(tmp_path / "store"),
        }
    )
    assert st.time is not None and st.time.missing == (5, 12, 20)
    seen = []
    for b in shardload.iter_batches(st, batch_size=3, window=4, window_step=2):
        for i, s in enumerate(b["index"].tolist()):
            rows = s + 2 * np.arange(4)
            np.testing.assert_array_equal(b["x"][i], t[rows].reshape(4, -1))
            np.testing.assert_array_equal(b["dates"][i], dates.values[rows].astype("M8[s]"))
            seen.append(s)
    bad = {5, 12, 20}
    want = [s for s in range(30 - 6) if not bad & {s, s + 2, s + 4, s + 6}]
    assert sorted(seen) == want
