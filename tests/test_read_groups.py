"""Read groups (model parallelism) and ensemble members across ranks: the plan, the slices,
the bytes read, resume (docs/loading.md, "Read groups")."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload import iter_batches
from shardload.errors import PlanError
from shardload.plan.read_groups import member_slice, plan_row_slices, split_rank
from shardload.store import sliced

N, V, E, C = 40, 3, 4, 10


def states(
    tmp: Path, *, fmt: str = "npy", compression: str = "none", name: str = "st", **config: object
):
    """A store of states: ``a`` rows ``(V, C)`` (variables, cells), ``b`` rows ``(V, E, C)``
    (variables, ensemble members, cells); every value distinct. Returns (store, a, b)."""
    a = np.arange(N * V * C, dtype="f4").reshape(N, V, C)
    b = -np.arange(N * V * E * C, dtype="f4").reshape(N, V, E, C)
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / f"{name}.nc"
    dims = ("time", "variable")
    xr.Dataset({"a": ((*dims, "cell"), a), "b": ((*dims, "ensemble", "cell"), b)}).to_netcdf(src)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    st = prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "view": "userfuncs:unequal",  # {"a": ds.a, "b": ds.b}: rows as they are
            "chunk_rows": 6,
            "format": fmt,
            "compression": compression,
            "out": str(tmp / name),
            "splits": {},
            **config,
        }
    )
    return st, a, b


@pytest.fixture(scope="module")
def npy_store(tmp_path_factory):
    return states(tmp_path_factory.mktemp("rg"))


def rank_batches(st, rank, world, group, **kw):
    opts = dict(batch_size=4, seed=3, shuffle=True)
    opts.update(kw)
    return list(iter_batches(st, rank=rank, world_size=world, read_group_size=group, **opts))


# -- the pure plan -------------------------------------------------------------------------------
def test_member_slices_are_array_split():
    for length in range(1, 30):
        for parts in range(1, length + 1):
            cuts = np.array_split(np.arange(length), parts)
            got = [member_slice(length, parts, m) for m in range(parts)]
            assert got == [(int(c[0]), int(c[-1]) + 1) for c in cuts]


def test_split_rank_groups_consecutive_ranks():
    assert [split_rank(r, 6, 3) for r in range(6)] == [
        (0, 2, 0),
        (0, 2, 1),
        (0, 2, 2),
        (1, 2, 0),
        (1, 2, 1),
        (1, 2, 2),
    ]


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        (dict(world=6, group=4), ["read_group_size=4", "world_size=6"]),
        (dict(group=11), ["read_group_size=11", "'a'", "(3, 10)"]),
        (dict(group=0), ["read_group_size=0"]),
        (dict(group=True), ["read_group_size=True"]),
        (dict(axis=2), ["read_group_axis=2", "'a'"]),
        (dict(axis={"c": 0}), ["read_group_axis", "'c'"]),
    ],
)
def test_bad_read_groups_are_errors_naming_the_option(kw, words):
    group, axis = kw.get("group", 2), kw.get("axis", -1)
    with pytest.raises(PlanError) as err:
        world = kw.get("world", 2 * group if type(group) is int and group > 0 else 4)
        split_rank(0, world, group)
        plan_row_slices({"a": (3, 10)}, read_group_size=group, member=0, axis=axis)
    for w in words:
        assert w in str(err.value)


def test_bad_read_groups_at_load(npy_store):
    st, _, _ = npy_store
    with pytest.raises(PlanError, match="read_group_size=3 does not divide world_size=4"):
        rank_batches(st, 0, 4, 3)
    with pytest.raises(PlanError, match=r"read_group_size=5 is larger than axis 1 of array 'b'"):
        rank_batches(st, 0, 5, 5, read_group_axis={"a": None, "b": 1})


# -- groups read the same samples, each its slice --------------------------------------------------
def check_groups(st, a, b, world, group, axis=-1):
    ranks = [rank_batches(st, r, world, group, read_group_axis=axis) for r in range(world)]
    ids = [[bt["index"].tolist() for bt in batches] for batches in ranks]
    for r in range(world):  # the ranks of a group: the same batches, in the same order
        assert ids[r] == ids[r - r % group], r
    sets = [{i for bt in ids[g * group] for i in bt} for g in range(world // group)]
    assert sum(len(s) for s in sets) == len(set().union(*sets)) == N  # disjoint, cover
    axes = {"a": axis, "b": axis} if not isinstance(axis, dict) else axis
    for r, batches in enumerate(ranks):
        for name, full in (("a", a), ("b", b)):
            ax = axes[name]
            rows = full[np.concatenate([bt["index"] for bt in batches])]
            got = np.concatenate([bt[name] for bt in batches])
            if ax is None:
                np.testing.assert_array_equal(got, rows)
                continue
            parts = np.array_split(rows, group, axis=1 + ax % (rows.ndim - 1))
            np.testing.assert_array_equal(got, parts[r % group])


@pytest.mark.parametrize(
    ("fmt", "compression", "config"),
    [
        ("npy", "none", {}),
        ("zarr", "lz4", {}),
        ("zarr", "zstd", {"shard_chunks": 2}),  # spans of a shard in one call, then sliced
        ("hdf5", "none", {}),
    ],
)
def test_groups_identical_disjoint_and_sliced(tmp_path, fmt, compression, config):
    st, a, b = states(tmp_path, fmt=fmt, compression=compression, **config)
    check_groups(st, a, b, world=4, group=2)


def test_uneven_slices_and_one_group_of_the_world(npy_store):
    st, a, b = npy_store
    check_groups(st, a, b, world=3, group=3)  # 10 cells: 4, 3, 3


def test_ensemble_members_across_the_ranks_of_a_group(npy_store):
    """b's members (row axis 1) spread over the 2 ranks of each group: the same dates, 2
    members each; a whole on every rank."""
    st, a, b = npy_store
    check_groups(st, a, b, world=4, group=2, axis={"a": None, "b": 1})
    batch = rank_batches(st, 1, 4, 2, read_group_axis={"a": None, "b": 1})[0]
    assert batch["b"].shape == (4, V, E // 2, C) and batch["a"].shape == (4, V, C)


@pytest.mark.parametrize(("fmt", "compression"), [("npy", "none"), ("zarr", "none")])
def test_raw_rows_read_only_the_slice(tmp_path, monkeypatch, fmt, compression):
    """Raw rows in local files: each rank reads its slice's bytes and no more (one pread per
    run of the slice, runs of any size here), values equal."""
    st, a, _ = states(tmp_path, fmt=fmt, compression=compression)
    monkeypatch.setattr(sliced, "RUN_MIN_BYTES", 0)
    read = []
    preadv = os.preadv

    def counting(fd, bufs, offset):
        got = preadv(fd, bufs, offset)
        read.append(got)
        return got

    monkeypatch.setattr(sliced.os, "preadv", counting)
    batches = rank_batches(st, 1, 2, 2, shuffle=False, batch_size=8, arrays=["a"])
    rows = np.concatenate([bt["index"] for bt in batches])
    np.testing.assert_array_equal(np.concatenate([bt["a"] for bt in batches]), a[rows][..., 5:])
    assert sum(read) == len(rows) * V * 5 * 4  # 5 of 10 cells of float32 per variable
    assert len(read) == len(rows) * V


def test_short_runs_read_whole_rows(npy_store, monkeypatch):
    """Runs shorter than RUN_MIN_BYTES (these are 20 bytes): whole rows, then the slice."""
    st, a, _ = npy_store
    calls = []
    monkeypatch.setattr(sliced.SlicedReader, "_read_runs", lambda *args: calls.append(args))
    batches = rank_batches(st, 0, 2, 2, arrays=["a"])
    rows = np.concatenate([bt["index"] for bt in batches])
    np.testing.assert_array_equal(np.concatenate([bt["a"] for bt in batches]), a[rows][..., :5])
    assert not calls


# -- resume ------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")


def dataset(st, rank, world, group=2):
    from shardload.torch import StreamingDataset

    return StreamingDataset(
        st, batch_size=4, seed=5, rank=rank, world_size=world, read_group_size=group
    )


def test_resume_mid_epoch_gives_the_rest_of_the_epoch(npy_store):
    st, a, _ = npy_store
    full = {r: list(dataset(st, r, 4)) for r in range(4)}
    states_ = {}
    for r in range(4):
        ds = dataset(st, r, 4)
        it = iter(ds)
        head = [next(it) for _ in range(2)]
        assert [h["index"].tolist() for h in head] == [f["index"].tolist() for f in full[r][:2]]
        states_[r] = ds.state_dict()
        assert ds.read_slices() == {
            "a": (1, 5 * (r % 2), 5 * (r % 2) + 5),
            "b": (2, *ds.read_slices()["a"][1:]),
        }
    assert states_[0]["world_size"] == 2  # the state is the data-parallel groups'
    for r in range(4):
        ds = dataset(st, r, 4)
        ds.load_state_dict(states_[r])
        rest = list(ds)
        assert [x["index"].tolist() for x in rest] == [f["index"].tolist() for f in full[r][2:]]
        for x in rest:
            np.testing.assert_array_equal(
                x["a"].numpy(), a[x["index"].numpy()][..., 5 * (r % 2) :][..., :5]
            )


def test_elastic_resume_on_another_number_of_groups(npy_store):
    """Saved by 2 groups of 2 after 2 batches; resumed by 1 group of 2 ranks: the rest of the
    epoch is every row not yet seen, once, and both ranks of the group get it."""
    st, _, _ = npy_store
    seen, saved = set(), None
    for r in (0, 2):  # one rank per group: its group's batches
        ds = dataset(st, r, 4)
        it = iter(ds)
        seen |= {i for _ in range(2) for i in next(it)["index"].tolist()}
        saved = ds.state_dict()
    rests = []
    for r in range(2):
        ds = dataset(st, r, 2)
        ds.load_state_dict(saved)
        rests.append([x["index"].tolist() for x in ds])
    assert rests[0] == rests[1]
    rest = [i for bt in rests[0] for i in bt]
    assert len(rest) == len(set(rest)) and set(rest) == set(range(N)) - seen


def test_dataloader_workers_hand_slices_over_the_ring(npy_store):
    """Forked DataLoader workers of a read group member: its slices in ring slots of its
    slices' shape, values equal, the group's batches in order."""
    from shardload.torch import StreamingDataLoader

    st, a, _ = npy_store
    got = []
    for rank in (0, 1):
        ds = dataset(st, rank, 2)
        cells = (V, 5)  # the member's slice of the cells
        assert ds._ring is not None and ds._ring.specs["a"][0] == cells
        got.append(list(StreamingDataLoader(ds, num_workers=2, multiprocessing_context="fork")))
    assert [b["index"].tolist() for b in got[0]] == [b["index"].tolist() for b in got[1]]
    assert sorted(i for b in got[0] for i in b["index"].tolist()) == list(range(N))
    for rank, batches in enumerate(got):
        for b in batches:
            want = a[b["index"].numpy()][..., 5 * rank : 5 * rank + 5]
            np.testing.assert_array_equal(b["a"].numpy(), want)


@pytest.mark.slow  # importing lightning: ~11 s here
def test_lightning_data_module_passes_read_groups_on(npy_store):
    pytest.importorskip("lightning")
    from shardload.torch.lightning import ShardloadDataModule

    st, a, _ = npy_store
    got = []
    for rank in (0, 1):
        dm = ShardloadDataModule(
            st, batch_size=4, train_split="all", val_split=None, test_split=None,
            read_group_size=2, rank=rank, world_size=2,
        )  # fmt: skip
        got.append(list(dm.train_dataloader()))
    assert [b["index"].tolist() for b in got[0]] == [b["index"].tolist() for b in got[1]]
    for rank, batches in enumerate(got):
        for b in batches:
            cells = slice(5 * rank, 5 * rank + 5)
            np.testing.assert_array_equal(b["a"].numpy(), a[b["index"].numpy()][..., cells])
