"""Epoch plan and resume: invariants over random and swept configurations (pure, no torch)."""

from __future__ import annotations

import doctest
import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload.plan.epoch as epoch_mod
import shardload.plan.groups as groups_mod
import shardload.plan.resume as resume_mod
import shardload.plan.shuffles as shuffles_mod
import shardload.plan.spans as spans_mod
from shardload.errors import PlanError, StateError
from shardload.plan.chunks import chunk_sizes, plan_chunk_bounds
from shardload.plan.epoch import EpochPlan, plan_epoch
from shardload.plan.groups import (
    iter_rank_batches,
    iter_worker_batches,
    iter_worker_groups,
    worker_rows,
)
from shardload.plan.resume import EpochState, plan_from_state, plan_resume, plan_state

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- helpers -----------------------------------------------------------------------------------


def split(length: int, chunk_rows: int, keep: float = 1.0, seed: int = 0):
    """The chunks of a split: sizes, ids and starts of a random subset of a store's chunks."""
    bounds = np.asarray(plan_chunk_bounds(length, chunk_rows))
    sizes = chunk_sizes(bounds)
    ids = np.flatnonzero(np.random.default_rng(seed).random(len(sizes)) < keep)
    if len(ids) == 0:
        ids = np.array([len(sizes) - 1])  # the short last chunk, the hardest case
    rows = np.concatenate([np.arange(bounds[i], bounds[i + 1]) for i in ids])
    return sizes[ids], ids, bounds[ids], rows


def dataloader_order(per_worker: list[list[np.ndarray]]) -> list[np.ndarray]:
    """What torch's DataLoader yields from iterable workers: round robin, skipping exhausted
    workers (simulated; it is what ``_MultiProcessingDataLoaderIter`` does)."""
    its = [iter(b) for b in per_worker]
    active, out = list(range(len(its))), []
    while active:
        for w in list(active):
            try:
                out.append(next(its[w]))
            except StopIteration:
                active.remove(w)
    return out


def expected_error(n: int, world: int, batch: int, mode: str, drop_last: bool) -> bool:
    n_r = n // world if mode == "drop" else -(-n // world)
    return n_r == 0 or (drop_last and n_r < batch)


def check_plan(plan: EpochPlan) -> list[list[np.ndarray]]:
    """Structural invariants; returns each rank's batches in DataLoader order."""
    ranks = []
    for r, workers in enumerate(plan.workers):
        per_worker = [list(iter_worker_batches(plan, r, w)) for w in range(len(workers))]
        for wp, batches in zip(workers, per_worker, strict=True):
            assert wp.num_batches == len(batches)
            assert wp.num_rows == sum(len(b) for b in batches)
            got = np.concatenate(batches) if batches else np.zeros(0, int)
            assert np.array_equal(got, worker_rows(plan, r, wp.worker))
            groups = list(iter_worker_groups(plan, r, wp.worker))
            assert all(len(segs) <= plan.shuffle_chunks for segs, _ in groups)
            from_groups = [np.concatenate([s.global_rows() for s in segs])[o] for segs, o in groups]
            assert np.array_equal(np.concatenate(from_groups) if groups else got[:0], got)
        order = dataloader_order(per_worker)
        assert len(order) == plan.batches_per_rank  # the same for every rank
        rr = [per_worker[k % len(workers)][k // len(workers)] for k in range(len(order))]
        assert all(np.array_equal(a, b) for a, b in zip(order, rr, strict=True))
        assert all(
            np.array_equal(a, b) for a, b in zip(order, iter_rank_batches(plan, r), strict=True)
        )
        assert all(len(b) == plan.batch_size for b in order[:-1])  # only the last may be short
        if plan.drop_last and order:
            assert len(order[-1]) == plan.batch_size
        ranks.append(order)
    return ranks


def all_rows(ranks: list[list[np.ndarray]]) -> np.ndarray:
    flat = [b for batches in ranks for b in batches]
    return np.concatenate(flat) if flat else np.zeros(0, int)


# -- plan_epoch --------------------------------------------------------------------------------


@st.composite
def configs(draw):
    length = draw(st.integers(1, 5000))
    chunk_rows = draw(st.one_of(st.integers(1, 700), st.integers(50, 700)))
    keep = draw(st.sampled_from([1.0, 0.5, 0.05]))
    return dict(
        split=(length, chunk_rows, keep, draw(st.integers(0, 2**16))),
        world_size=draw(st.integers(1, 16)),
        num_workers=draw(st.integers(0, 8)),
        batch_size=draw(st.one_of(st.integers(1, 300), st.integers(1, 8))),
        seed=draw(st.integers(0, 2**32)),
        epoch=draw(st.integers(0, 50)),
        shuffle=draw(st.booleans()),
        mode=draw(st.sampled_from(["drop", "pad"])),
        drop_last=draw(st.booleans()),
        shuffle_chunks=draw(st.integers(1, 6)),
    )


def make(cfg: dict):
    sizes, ids, starts, rows = split(*cfg["split"])
    opts = {k: v for k, v in cfg.items() if k != "split"}
    return sizes, ids, starts, rows, opts


def check_epoch(sizes, ids, starts, rows, opts) -> EpochPlan | None:
    n, world, b = len(rows), opts["world_size"], opts["batch_size"]
    if expected_error(n, world, b, opts["mode"], opts["drop_last"]):
        with pytest.raises(PlanError, match=str(world)):
            plan_epoch(sizes, chunk_ids=ids, chunk_starts=starts, **opts)
        return None
    plan = plan_epoch(sizes, chunk_ids=ids, chunk_starts=starts, **opts)
    got = all_rows(check_plan(plan))
    distinct = set(got.tolist())
    assert distinct <= set(rows.tolist())
    assert plan.num_dropped == n - len(distinct)  # exact
    assert plan.num_padded == len(got) - len(distinct)  # exact: no row twice except padding
    n_r = -(-n // world) if opts["mode"] == "pad" else n // world
    partial = n_r % b if opts["drop_last"] else 0
    if opts["mode"] == "drop":  # minimal
        assert plan.num_padded == 0
        assert plan.num_dropped == n % world + world * partial
    else:
        assert plan.num_padded <= (world - n % world) % world < world
        if not opts["drop_last"]:
            assert plan.num_dropped == 0
            assert plan.num_padded == (world - n % world) % world
        else:
            assert plan.num_dropped <= world * partial
    assert plan.num_rows == n
    return plan


@SETTINGS
@given(configs())
def test_plan_invariants(cfg):
    check_epoch(*make(cfg))


SWEEP = list(
    itertools.product(
        [(1, 1), (7, 3), (100, 700), (1000, 64), (4999, 700), (600, 1)],  # (length, chunk rows)
        [1, 3, 16],  # ranks
        [0, 3, 8],  # workers
        [1, 7, 300],  # batch
        ["drop", "pad"],
        [False, True],  # drop_last
    )
)


@pytest.mark.parametrize("shuffle", [False, True])
def test_plan_sweep(shuffle):
    for (length, rows_per_chunk), world, workers, batch, mode, drop_last in SWEEP:
        sizes, ids, starts, rows = split(length, rows_per_chunk)
        opts = dict(
            world_size=world,
            num_workers=workers,
            batch_size=batch,
            mode=mode,
            drop_last=drop_last,
            shuffle=shuffle,
            seed=3,
            epoch=1,
        )
        check_epoch(sizes, ids, starts, rows, opts)


def test_no_shuffle_is_natural_order():
    plan = plan_epoch([5, 5, 3], batch_size=4, num_workers=0, shuffle=False)
    assert worker_rows(plan, 0, 0).tolist() == list(range(13))


def test_same_seed_same_plan_and_epochs_differ():
    sizes = [100] * 60 + [7]
    kw = dict(world_size=4, num_workers=3, batch_size=32, seed=11)
    a, b = plan_epoch(sizes, epoch=2, **kw), plan_epoch(sizes, epoch=2, **kw)
    for r, w in itertools.product(range(4), range(3)):
        assert np.array_equal(worker_rows(a, r, w), worker_rows(b, r, w))
    c = plan_epoch(sizes, epoch=3, **kw)
    d = plan_epoch(sizes, epoch=2, **{**kw, "seed": 12})

    def chunk_order(p):
        return [s.chunk for ws in p.workers for wp in ws for s in wp.segments]

    assert chunk_order(a) != chunk_order(c)
    assert chunk_order(a) != chunk_order(d)
    # chunks move between ranks from one epoch to the next
    assert {s.chunk for wp in a.workers[0] for s in wp.segments} != {
        s.chunk for wp in c.workers[0] for s in wp.segments
    }


def test_batches_mix_chunks():
    plan = plan_epoch([100] * 200, world_size=2, num_workers=2, batch_size=64, shuffle_chunks=4)
    chunks = [np.unique(b // 100).size for r in range(2) for b in iter_rank_batches(plan, r)]
    assert np.mean(chunks) > 3
    one = plan_epoch([100] * 200, world_size=2, num_workers=2, batch_size=64, shuffle_chunks=1)
    assert np.mean([np.unique(b // 100).size for b in iter_rank_batches(one, 0)]) < 1.7


def test_fewer_chunks_than_readers():
    plan = plan_epoch([10, 10, 3], world_size=4, num_workers=8, batch_size=1, mode="pad")
    assert plan.batches_per_rank == 6 and plan.num_padded == 1
    got = all_rows(check_plan(plan))
    assert sorted(set(got.tolist())) == list(range(23))


def test_plan_errors():
    with pytest.raises(PlanError, match="empty"):
        plan_epoch([], batch_size=1)
    with pytest.raises(PlanError, match="chunk #1 has 0 rows"):
        plan_epoch([3, 0], batch_size=1)
    with pytest.raises(PlanError, match="mode"):
        plan_epoch([3], batch_size=1, mode="wrap")
    with pytest.raises(PlanError, match="num_workers"):
        plan_epoch([3], batch_size=1, num_workers=-1)
    with pytest.raises(PlanError, match="chunk_starts has 1 entries for 2"):
        plan_epoch([3, 3], batch_size=1, chunk_starts=[0])
    with pytest.raises(PlanError, match="3 rows over world_size=4"):
        plan_epoch([3], world_size=4, batch_size=1)
    with pytest.raises(PlanError, match=r"gets 5 rows \(10 in all\), fewer than batch_size=6"):
        plan_epoch([10], world_size=2, batch_size=6, drop_last=True)
    plan_epoch([3], world_size=4, batch_size=1, mode="pad")  # pad always gives every rank rows


def test_doctests():
    for mod in (epoch_mod, groups_mod, shuffles_mod, resume_mod, spans_mod):
        assert doctest.testmod(mod).failed == 0


# -- resume ------------------------------------------------------------------------------------


def rank_batches(plan: EpochPlan) -> list[list[np.ndarray]]:
    return [list(iter_rank_batches(plan, r)) for r in range(plan.world_size)]


def check_resume(old: EpochPlan, k: int, world: int, workers: int) -> EpochPlan:
    before = rank_batches(old)
    seen = all_rows([b[:k] for b in before])
    unseen = all_rows([b[k:] for b in before])
    new = plan_resume(old, k, world_size=world, num_workers=workers)
    after = check_plan(new)
    if world == old.world_size and max(1, workers) == max(1, old.num_workers):
        for a, b in zip(after, before, strict=True):  # exact continuation
            assert len(a) == len(b) - k
            assert all(np.array_equal(x, y) for x, y in zip(a, b[k:], strict=True))
        assert new.num_dropped == new.num_padded == 0
    got = all_rows(after)
    assert len(got) == len(unseen) - new.num_dropped + new.num_padded
    assert new.num_rows == len(unseen)
    extra, missing = Counter(got.tolist()), Counter(unseen.tolist())
    extra.subtract(unseen.tolist())
    missing.subtract(got.tolist())
    assert sum(v for v in extra.values() if v > 0) <= new.num_padded
    assert sum(v for v in missing.values() if v > 0) <= new.num_dropped
    if new.num_padded == 0:
        assert not set(got.tolist()) & set(seen.tolist()) - set(unseen.tolist())
    # the saved state rebuilds the same plan
    state = plan_state(old, k)
    assert EpochState.from_dict(state.to_dict()) == state
    return new


@SETTINGS
@given(configs(), st.data())
def test_resume(cfg, data):
    sizes, ids, starts, rows, opts = make(cfg)
    if expected_error(
        len(rows), opts["world_size"], opts["batch_size"], opts["mode"], opts["drop_last"]
    ):
        return
    old = plan_epoch(sizes, chunk_ids=ids, chunk_starts=starts, **opts)
    k = data.draw(st.integers(0, old.batches_per_rank))
    same = data.draw(st.booleans())
    world = old.world_size if same else data.draw(st.integers(1, 16))
    workers = old.num_workers if same else data.draw(st.integers(0, 8))
    new = check_resume(old, k, world, workers)
    rebuilt = plan_from_state(
        plan_state(old, k),
        sizes,
        chunk_ids=ids,
        chunk_starts=starts,
        world_size=world,
        num_workers=workers,
        **{o: v for o, v in opts.items() if o not in ("world_size", "num_workers", "epoch")},
    )
    for a, b in zip(rank_batches(new), rank_batches(rebuilt), strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    # resume the resumed plan again (chains of resumes)
    if new.batches_per_rank:
        k2 = data.draw(st.integers(0, new.batches_per_rank))
        world2, workers2 = data.draw(st.integers(1, 16)), data.draw(st.integers(0, 8))
        last = check_resume(new, k2, world2, workers2)
        again = plan_from_state(
            plan_state(new, k2),
            sizes,
            chunk_ids=ids,
            chunk_starts=starts,
            world_size=world2,
            num_workers=workers2,
            **{o: v for o, v in opts.items() if o not in ("world_size", "num_workers", "epoch")},
        )
        assert again.history == last.history and len(again.history) == 2
        for a, b in zip(rank_batches(last), rank_batches(again), strict=True):
            assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_elastic_resume_exactly_unseen_rows(mode):
    sizes = [97] * 40 + [13]
    old = plan_epoch(sizes, world_size=4, num_workers=3, batch_size=16, mode=mode, seed=5)
    k = old.batches_per_rank // 3 + 1  # inside shuffle groups: explicit row arrays
    seen = all_rows([b[:k] for b in rank_batches(old)])
    new = plan_resume(old, k, world_size=6, num_workers=2)
    assert any(s.rows is not None for ws in new.workers for wp in ws for s in wp.segments)
    got = all_rows(check_plan(new))
    union = Counter(seen.tolist()) + Counter(got.tolist())
    assert sum(union.values()) == len(seen) + len(got)
    total = sum(sizes)
    assert len(set(union)) == total - old.num_dropped - new.num_dropped
    assert sum(v - 1 for v in union.values()) == old.num_padded + new.num_padded


def test_resume_end_of_epoch_and_bigger_world():
    old = plan_epoch([10, 10], world_size=2, batch_size=3, mode="drop")
    done = plan_resume(old, old.batches_per_rank, world_size=3, num_workers=2)
    assert done.batches_per_rank == 0 and done.num_rows == 0
    # 2 unseen rows per rank, 4 rows over 8 ranks: dropped, not an error
    late = plan_resume(old, old.batches_per_rank - 1, world_size=8)
    assert late.batches_per_rank == 0 and late.num_dropped == late.num_rows == 2


def test_state_errors():
    sizes = [10] * 5
    plan = plan_epoch(sizes, world_size=2, batch_size=4, seed=1)
    with pytest.raises(StateError, match=r"not within 0\.\.7"):
        plan_resume(plan, 8)
    with pytest.raises(StateError, match="not within"):
        plan_state(plan, -1)
    state = plan_state(plan, 3)
    plan_from_state(state, sizes, batch_size=4, seed=1, world_size=1, num_workers=2)
    with pytest.raises(StateError, match="seed=2"):
        plan_from_state(state, sizes, batch_size=4, seed=2, world_size=2, num_workers=1)
    with pytest.raises(StateError, match="fingerprint"):
        plan_from_state(state, [10] * 4 + [9], batch_size=4, seed=1, world_size=2, num_workers=1)
    with pytest.raises(StateError, match="batch_size=5"):
        plan_from_state(state, sizes, batch_size=5, seed=1, world_size=2, num_workers=1)
    with pytest.raises(StateError, match="not an epoch state"):
        EpochState.from_dict({"epoch": 1})


def test_shuffle_order_spreads_the_pieces_of_each_chunk():
    """Pieces come in rounds of one piece per chunk: the order is a permutation, each round
    holds distinct chunks, it changes with the seed, and a shuffle group of pieces nearly
    always holds distinct chunks."""
    from shardload.plan.groups import iter_worker_groups
    from shardload.plan.shuffles import shuffle_order

    rng = np.random.default_rng(1)
    for _ in range(50):
        pieces = rng.integers(1, 5, size=rng.integers(1, 30))
        ids = np.repeat(np.arange(len(pieces)) * 7, pieces)
        order = shuffle_order(ids, np.random.default_rng(int(rng.integers(1 << 30))))
        assert sorted(order.tolist()) == list(range(len(ids)))
        seq = ids[order]
        at = 0
        for k in range(int(pieces.max())):
            n = int((pieces > k).sum())
            assert sorted(seq[at : at + n].tolist()) == sorted(
                (np.flatnonzero(pieces > k) * 7).tolist()
            )
            at += n
    ids = np.repeat(np.arange(64), 4)
    a, b = (shuffle_order(ids, np.random.default_rng(s)) for s in (0, 1))
    assert not np.array_equal(a, b)
    plan = plan_epoch(
        np.full(256, 1024),
        chunk_ids=ids,
        chunk_starts=np.arange(256) * 1024,
        batch_size=256,
        num_workers=2,
        seed=3,
    )
    groups = [
        [s.chunk for s in segs] for w in range(2) for segs, _ in iter_worker_groups(plan, 0, w)
    ]
    assert np.mean([len(set(g)) for g in groups]) > 3.95


# -- the small-piece and uniform shuffles --------------------------------------------------------


@st.composite
def new_shuffle_configs(draw):
    """Chunks cut into small pieces (the loader's default on raw local chunks) or
    ``shuffle="uniform"`` (one-row segments), with big groups of pieces."""
    cfg = draw(configs())
    length, chunk_rows, keep, seed = cfg["split"]
    cfg["split"] = (min(length, 1500), chunk_rows, keep, seed)
    cfg["shuffle"] = draw(st.sampled_from([True, "uniform"]))
    cfg["shuffle_chunks"] = draw(st.integers(1, 64))
    cfg["piece_rows"] = draw(st.integers(1, 8))
    return cfg


def make_pieces(cfg: dict):
    from shardload.load.select import Selection, split_pieces

    cfg = dict(cfg)
    piece_rows = cfg.pop("piece_rows")
    sizes, ids, starts, rows, opts = make(cfg)
    cut = split_pieces(Selection(("x",), sizes, ids, starts), piece_rows)
    return cut.sizes, cut.ids, cut.starts, rows, opts


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(new_shuffle_configs(), st.data())
def test_small_pieces_and_uniform_keep_every_guarantee(cfg, data):
    """Exact coverage, equal batches per rank, same-shape and elastic resume (and the saved
    state rebuilding it) hold for small pieces and for the uniform shuffle too."""
    sizes, ids, starts, rows, opts = make_pieces(cfg)
    plan = check_epoch(sizes, ids, starts, rows, opts)
    if plan is None:
        return
    k = data.draw(st.integers(0, plan.batches_per_rank))
    world, workers = data.draw(st.integers(1, 16)), data.draw(st.integers(0, 8))
    new = check_resume(plan, k, world, workers)
    rebuilt = plan_from_state(
        plan_state(plan, k),
        sizes,
        chunk_ids=ids,
        chunk_starts=starts,
        world_size=world,
        num_workers=workers,
        **{o: v for o, v in opts.items() if o not in ("world_size", "num_workers", "epoch")},
    )
    for a, b in zip(rank_batches(new), rank_batches(rebuilt), strict=True):
        assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


def test_uniform_shuffle_is_a_uniform_permutation_of_rows():
    """``shuffle="uniform"``: every row once, a new order every epoch, and each row lands at
    every position about equally often (the per-position chunk counts of a uniform draw)."""
    sizes = [50] * 8 + [17]
    n = sum(sizes)
    firsts = []
    for e in range(300):
        plan = plan_epoch(sizes, batch_size=16, shuffle="uniform", epoch=e, shuffle_chunks=40)
        rows = worker_rows(plan, 0, 0)
        assert sorted(rows.tolist()) == list(range(n))
        firsts.append(rows[0])
    counts = np.bincount(np.array(firsts) // 50, minlength=9)
    expected = np.array(sizes) / n * 300
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected) + 1)
    with pytest.raises(PlanError, match="uniform"):
        plan_epoch(sizes, batch_size=4, shuffle="random")


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 40), min_size=1, max_size=60),
    st.integers(0, 10_000),
    st.integers(1, 64),
    st.integers(0, 2**32 - 1),
    st.booleans(),
)
def test_deal_order_puts_a_segments_rows_in_different_batches(lengths, at, batch, seed, draw_whole):
    """A shuffle group's order (``deal_order``) is a permutation of its rows, whatever the
    group's place in the stream; where the group's batches are whole, the rows of a segment
    are dealt round the batches (a batch gets at most ``ceil(rows / batches)`` of them: one,
    for a piece no longer than the batch count); and it is seeded."""
    from shardload.plan.shuffles import deal_order

    if sum(lengths) % batch and draw_whole:  # make the batches whole, for the check below
        lengths = [*lengths, batch - sum(lengths) % batch]
    lengths_a = np.array(lengths)
    n = int(lengths_a.sum())
    for start in (at, at - at % batch):
        order = deal_order(lengths_a, start, n, batch, np.random.default_rng(seed))
        assert sorted(order.tolist()) == list(range(n))
    seg = np.repeat(np.arange(len(lengths)), lengths)[order]  # segment of each position
    if n % batch == 0:  # whole batches (the last ``start`` is a batch boundary)
        per_batch = np.zeros((len(lengths), n // batch), np.int64)
        np.add.at(per_batch, (seg, np.arange(n) // batch), 1)
        assert (per_batch.max(axis=1) <= -(-lengths_a // (n // batch))).all()
    again = deal_order(lengths_a, start, n, batch, np.random.default_rng(seed))
    assert np.array_equal(order, again)


def _deal_order_before(lengths, at, n, batch_size, rng):
    """``shuffles.deal_order`` as of GROUP_ORDER_VERSION ``|groups-dealt`` (2026-11-27),
    before the positions were dealt without a sort: the reference a faster one must equal."""
    lengths = np.asarray(lengths, np.int64)
    small = lambda k: np.uint8 if k <= 1 << 8 else np.uint16 if k <= 1 << 16 else np.int64  # noqa: E731
    perm = rng.permutation(n)
    rank = rng.permutation(len(lengths)).astype(small(len(lengths)))
    seg_rank = rank[np.repeat(np.arange(len(lengths)), lengths)[perm]]
    listed = perm[np.argsort(seg_rank, kind="stable")]
    b = int(batch_size)
    first = min(n, b - at % b)
    pos = np.arange(n, dtype=np.int64)
    place = np.where(pos < first, pos, (pos - first) % b).astype(small(b))
    order = np.empty(n, np.int64)
    order[np.argsort(place, kind="stable")] = listed
    return order


@settings(max_examples=400, deadline=None)
@given(
    st.lists(st.integers(0, 300), min_size=0, max_size=300),
    st.integers(0, 100_000),
    st.integers(1, 5_000),
    st.integers(0, 2**32 - 1),
)
def test_deal_order_is_the_order_it_was(lengths, at, batch, seed):
    """Planned orders are fingerprinted (``GROUP_ORDER_VERSION``): a faster ``deal_order``
    gives the very order of the one it replaced, for any segments (257 and more: 16-bit ranks;
    empty ones), group start, batch size (above and below the group's rows) and seed."""
    from shardload.plan.shuffles import deal_order

    n = int(sum(lengths))
    for start in (at, at - at % batch, at + batch - 1):
        got = deal_order(np.array(lengths, np.int64), start, n, batch, np.random.default_rng(seed))
        want = _deal_order_before(lengths, start, n, batch, np.random.default_rng(seed))
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_deal_order_is_the_order_it_was_on_the_default_groups():
    """As above on the default's own shapes: groups of 257 pieces of up to 16 rows, batches
    of 256, every group start of 40 seeds."""
    from shardload.plan.shuffles import deal_order

    rng = np.random.default_rng(0)
    for seed in range(40):
        lengths = rng.integers(1, 17, 257)
        n = int(lengths.sum())
        for at in rng.integers(0, 10**6, 5).tolist():
            got = deal_order(lengths, at, n, 256, np.random.default_rng((seed, at)))
            want = _deal_order_before(lengths, at, n, 256, np.random.default_rng((seed, at)))
            assert np.array_equal(got, want)


def test_deal_order_sorts_only_the_segment_ranks():
    """A group's order costs one sort (its rows by their segment's rank), not two: the
    positions it deals to follow from the batch size (``deal_positions``), where a stable
    sort of each position's place was a third of its time (3,500 rows, 19 groups an epoch of
    the raw store)."""
    import sys

    from shardload.plan.shuffles import deal_order

    sorts: list[str] = []

    def prof(frame, event, arg):
        if event == "call" and frame.f_code.co_name in ("argsort", "sort", "lexsort"):
            sorts.append(frame.f_code.co_name)
        elif event == "c_call" and getattr(arg, "__name__", "") in ("argsort", "sort", "lexsort"):
            sorts.append(arg.__name__)

    lengths = np.full(257, 14)
    sys.setprofile(prof)
    try:
        deal_order(lengths, 1000, int(lengths.sum()), 256, np.random.default_rng(0))
    finally:
        sys.setprofile(None)
    assert len([s for s in sorts if s == "argsort"]) <= 2, sorts  # np.argsort -> ndarray.argsort


@pytest.mark.parametrize("skip", [0, 1, 2, 4])
@pytest.mark.parametrize("shuffle_chunks", [1, 2, 3])
def test_worker_spans_are_the_groups_spans_without_dealing_them(
    skip, shuffle_chunks, monkeypatch
) -> None:
    """``worker_spans`` (what a planner of reads needs: where a worker's rows lie) is the
    concatenation of ``iter_worker_spans``' groups, resumed ones included, and deals no
    group's rows (the loop deals each group once, as it reads it)."""
    from shardload.plan.resume import skip_worker_batches

    plan = plan_epoch(
        [5, 3, 6, 2, 7, 4], batch_size=3, num_workers=2, shuffle_chunks=shuffle_chunks
    )
    plans = [skip_worker_batches(plan, 0, w, skip) for w in range(2)]
    want = [[s for s, _ in groups_mod.iter_worker_spans(p, 0, w)] for w, p in enumerate(plans)]
    dealt: list[int] = []
    real = groups_mod._group_order
    monkeypatch.setattr(groups_mod, "_group_order", lambda *a: dealt.append(1) or real(*a))
    for w, p in enumerate(plans):
        got = groups_mod.worker_spans(p, 0, w)
        for col in ("chunk", "base", "lo", "hi", "ex"):
            cat = [getattr(s, col) for s in want[w]]
            expect = np.concatenate(cat).tolist() if cat else []
            assert getattr(got, col).tolist() == expect, col
    assert dealt == []
