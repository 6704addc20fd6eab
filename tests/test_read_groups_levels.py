"""Two-level read groups: ensemble members spread over ranks *and* the grid split within a
model-parallel group, as anemoi-training does (``read_group_size=(E, G)``,
``read_group_axis=(members axis, grid axis)``; docs/weather.md, "Read groups")."""

from __future__ import annotations

import numpy as np
import pytest

from shardload import iter_batches
from shardload.errors import PlanError
from shardload.plan.read_groups import member_slice, plan_level_slices, split_rank
from test_read_groups import C, E, N, V, states

#: level 1: b's ensemble members (row axis 1; a has none, read whole); level 2: the cells
AXES = ({"a": None, "b": 1}, -1)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return states(tmp_path_factory.mktemp("rg2"))


def rank_batches(st, rank, world, levels=(2, 2), axis=AXES, **kw):
    opts = dict(batch_size=4, seed=3, shuffle=True, read_group_size=levels, read_group_axis=axis)
    opts.update(kw)
    return list(iter_batches(st, rank=rank, world_size=world, **opts))


# -- the pure plan -------------------------------------------------------------------------------
@pytest.mark.parametrize("levels", [(2, 2), (2, 3), (3, 2), (4, 1), (1, 5)])
def test_member_reads_member_slice_r_div_g_and_grid_slice_r_mod_g(levels):
    e, g = levels
    for r in range(e * g):
        got = plan_level_slices(
            {"a": (V, C), "b": (V, E, C)}, read_group_size=levels, member=r, axis=AXES
        )
        assert got == (
            {"b": (1, *member_slice(E, e, r // g))},
            {"a": (1, *member_slice(C, g, r % g)), "b": (2, *member_slice(C, g, r % g))},
        )
    assert [split_rank(r, 2 * e * g, levels)[:2] for r in range(2 * e * g)] == [
        (r // (e * g), 2) for r in range(2 * e * g)
    ]


@pytest.mark.parametrize(
    ("levels", "axis", "world", "words"),
    [
        ((2, 2), -1, 8, ["read_group_size=(2, 2) has 2 levels", "one axis per level"]),
        ((2, 2), (1,), 8, ["read_group_axis=(1,) gives 1 axes", "2 level"]),
        ((2, 2), (-1, 2), 8, ["cuts axis 2 of array 'b' at two levels"]),
        ((5, 2), (1, -1), 10, ["read_group_size=5 is larger than axis 1 of array 'b'"]),
        ((2, 3), (1, -1), 8, ["read_group_size=(2, 3) (6 ranks) does not divide world_size=8"]),
        ((2, 0), (1, -1), 8, ["read_group_size=(2, 0) must be at least 1"]),
        ((), -1, 8, ["read_group_size=() has no level"]),
    ],
)
def test_bad_levels_are_errors_naming_the_option(levels, axis, world, words):
    with pytest.raises(PlanError) as err:
        split_rank(0, world, levels)
        plan_level_slices({"b": (V, E, C)}, read_group_size=levels, member=0, axis=axis)
    for w in words:
        assert w in str(err.value)


# -- loading: groups identical, disjoint, each rank its two slices -------------------------------
def check_levels(st, a, b, world, levels, **kw):
    e, g = levels
    size = e * g
    ranks = [rank_batches(st, r, world, levels, **kw) for r in range(world)]
    ids = [[bt["index"].tolist() for bt in batches] for batches in ranks]
    for r in range(world):  # every rank of a group: the same batches in the same order
        assert ids[r] == ids[r - r % size], r
    sizes = {len(batches) for batches in ranks}
    assert len(sizes) == 1  # equal numbers of batches on every rank
    sets = [{i for bt in ids[k * size] for i in bt} for k in range(world // size)]
    assert sum(len(s) for s in sets) == len(set().union(*sets)) == N  # disjoint, cover
    for r, batches in enumerate(ranks):
        rows = np.concatenate([bt["index"] for bt in batches])
        m, c = r % size // g, r % size % g
        members = np.array_split(np.arange(E), e)[m]
        cells = np.array_split(np.arange(C), g)[c]
        got_a = np.concatenate([bt["a"] for bt in batches])
        got_b = np.concatenate([bt["b"] for bt in batches])
        np.testing.assert_array_equal(got_a, a[rows][:, :, cells])
        np.testing.assert_array_equal(got_b, b[rows][:, :, members][..., cells])


@pytest.mark.parametrize(("world", "levels"), [(8, (2, 2)), (6, (2, 3)), (4, (4, 1))])
def test_two_levels_identical_disjoint_and_sliced(store, world, levels):
    st, a, b = store
    check_levels(st, a, b, world, levels)


def test_two_levels_on_compressed_zarr(tmp_path):
    """Compressed chunks decode whole, then each level cuts its slice."""
    st, a, b = states(tmp_path, fmt="zarr", compression="lz4")
    check_levels(st, a, b, 4, (2, 2))


# -- resume ------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")


def dataset(st, rank, world, levels=(2, 2)):
    from shardload.torch import StreamingDataset

    return StreamingDataset(
        st,
        batch_size=4,
        seed=5,
        rank=rank,
        world_size=world,
        read_group_size=levels,
        read_group_axis=AXES,
    )


def test_resume_mid_epoch_gives_the_rest_of_the_epoch(store):
    st, _, b = store
    world = 8
    for r in range(world):
        full = list(dataset(st, r, world))
        ds = dataset(st, r, world)
        it = iter(ds)
        head = [next(it) for _ in range(2)]
        assert [h["index"].tolist() for h in head] == [f["index"].tolist() for f in full[:2]]
        state = ds.state_dict()
        assert state["world_size"] == 2  # the state is the groups'
        m, c = r % 4 // 2, r % 2
        assert ds.read_slices() == {
            "a": ((1, 5 * c, 5 * c + 5),),
            "b": ((1, 2 * m, 2 * m + 2), (2, 5 * c, 5 * c + 5)),
        }
        again = dataset(st, r, world)
        again.load_state_dict(state)
        rest = list(again)
        assert [x["index"].tolist() for x in rest] == [f["index"].tolist() for f in full[2:]]
        for x in rest:
            rows = x["index"].numpy()
            want = b[rows][:, :, 2 * m : 2 * m + 2, 5 * c : 5 * c + 5]
            np.testing.assert_array_equal(x["b"].numpy(), want)


def test_elastic_resume_on_another_number_of_groups(store):
    """Saved by 2 groups of 2 x 2 after 2 batches; resumed by 1 group of 4 ranks: the rest of
    the epoch is every row not yet seen, once, and every rank of the group gets it."""
    st, _, _ = store
    seen, saved = set(), None
    for r in (0, 4):  # one rank per group: its group's batches
        ds = dataset(st, r, 8)
        it = iter(ds)
        seen |= {i for _ in range(2) for i in next(it)["index"].tolist()}
        saved = ds.state_dict()
    rests = []
    for r in range(4):
        ds = dataset(st, r, 4)
        ds.load_state_dict(saved)
        rests.append([x["index"].tolist() for x in ds])
    assert rests[0] == rests[1] == rests[2] == rests[3]
    rest = [i for bt in rests[0] for i in bt]
    assert len(rest) == len(set(rest)) and set(rest) == set(range(N)) - seen


def test_two_levels_on_an_anemoi_store_with_members(tmp_path):
    """anemoi's layout with several members (one chunk per date and member, read natively):
    members over 2 ranks, cells over 2 within, values equal to the stored rows' slices."""
    import shardload
    from test_anemoi_layout import write_anemoi_layout

    path = tmp_path / "a.zarr"
    values = write_anemoi_layout(path, length=10, members=4, cells=6, missing=(3,))
    st = shardload.open_store(path)
    assert st.reader.layout("data") is not None  # native, chunks split by member
    ranks = [rank_batches(st, r, 4, (2, 2), axis=(1, -1), batch_size=3) for r in range(4)]
    assert len({str([b["index"].tolist() for b in batches]) for batches in ranks}) == 1
    assert sorted(i for b in ranks[0] for i in b["index"].tolist()) == [0, 1, 2, 4, 5, 6, 7, 8, 9]
    for r, batches in enumerate(ranks):
        m, c = r // 2, r % 2
        for b in batches:
            want = values[b["index"]][:, :, 2 * m : 2 * m + 2, 3 * c : 3 * c + 3]
            np.testing.assert_array_equal(b["data"], want)


def test_dataloader_workers_hand_both_slices_over_the_ring(store):
    """Forked DataLoader workers of ranks of a 2 x 2 group: ring slots of the two-level slices'
    shape, values equal, the group's batches in order."""
    from shardload.torch import StreamingDataLoader

    st, _, b = store
    got = []
    for rank in (1, 2):  # member slice 0 / grid slice 1, member slice 1 / grid slice 0
        ds = dataset(st, rank, 4)
        assert ds._ring is not None and ds._ring.specs["b"][0] == (V, 2, 5)
        got.append(list(StreamingDataLoader(ds, num_workers=2, multiprocessing_context="fork")))
    assert [x["index"].tolist() for x in got[0]] == [x["index"].tolist() for x in got[1]]
    assert sorted(i for x in got[0] for i in x["index"].tolist()) == list(range(N))
    for (m, c), batches in zip(((0, 1), (1, 0)), got, strict=True):
        for x in batches:
            want = b[x["index"].numpy()][:, :, 2 * m : 2 * m + 2, 5 * c : 5 * c + 5]
            np.testing.assert_array_equal(x["b"].numpy(), want)
