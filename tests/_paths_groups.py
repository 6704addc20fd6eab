"""The equivalence harness over read groups and elastic resume (see :mod:`_paths_more`):
ranks of a read group get the same batches, each its slice; a state saved on one world shape
resumed on another serves every row not yet consumed, once (less reported drops, plus padding).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

import _paths as P
import _paths_more as M
from shardload.load.spec import LoadSpec
from shardload.plan.resume import plan_state


def check_read_groups(seed: int, root: Path, url: str | None = None) -> int:
    """States read by read groups of 2 or 4 (members slice the last axis or an ensemble axis):
    ranks of a group the same batches, groups disjoint and covering, each rank its slice of
    the source; the same through forked workers and by URL (``url``: ``root`` served, ending
    in ``/``). Returns epochs checked."""
    from test_read_groups import states

    rng = np.random.default_rng(seed)
    group = int(rng.choice([2, 4]))
    world = group * int(rng.choice([1, 2]))
    fmt, comp, extra = [("npy", "none", {}), ("zarr", "lz4", {}), ("hdf5", "none", {}),
                        ("zarr", "zstd", {"shard_chunks": 2})][int(rng.integers(4))]  # fmt: skip
    st, a, b = states(root, fmt=fmt, compression=comp, name=f"rg{seed}", **extra)
    st.close()
    axis: Any = -1 if rng.random() < 0.5 else {"a": None, "b": 1}
    axes = {"a": axis, "b": axis} if not isinstance(axis, dict) else axis
    mode = "pad" if rng.random() < 0.3 else "drop"
    kw: dict[str, Any] = dict(
        batch_size=int(rng.choice([1, 3, 4])), shuffle=bool(rng.random() < 0.7), seed=seed % 5,
        mode=mode, read_group_size=group, read_group_axis=axis,
        drop_last=mode == "drop" and bool(rng.random() < 0.3),
    )  # fmt: skip
    epoch = int(rng.integers(0, 3))
    path = root / f"rg{seed}"

    def check_rank(r: int) -> M.Check:
        def check(bt: P.Batch) -> None:
            idx = np.asarray(bt["index"])
            for name, full in (("a", a), ("b", b)):
                rows, ax = full[idx], axes[name]
                if ax is not None:
                    rows = np.array_split(rows, group, axis=1 + ax % (rows.ndim - 1))[r % group]
                np.testing.assert_array_equal(np.asarray(bt[name]), rows, err_msg=f"{name} r{r}")

        return check

    spec = LoadSpec.build(str(path), **kw)
    M.COUNT["read groups"] += 1
    if M.refused(path, kw, spec, world, epoch, plan_world=world // group):
        return 0
    every = list(range(len(a)))
    n = 0
    for workers in (0, 2):
        ranks = [
            P.rank_batches(str(path), kw, rank=r, world=world, workers=workers, epoch=epoch)
            for r in range(world)
        ]
        for r, mine in enumerate(ranks):
            for bt in mine:
                check_rank(r)(bt)
            lead = ranks[r - r % group]
            assert [x["index"].tolist() for x in mine] == [x["index"].tolist() for x in lead]
        M.COUNT["batches"] += sum(len(m) for m in ranks)
        plan = spec.plan(world_size=world // group, num_workers=workers, epoch=epoch)
        M.check_once(ranks, every, plan, mode, group=group)
        n += 1
        if workers == 2:
            for r in range(world):
                got, _ = P.torch_batches(
                    str(path), kw, rank=r, world=world, workers=2, epoch=epoch, context="fork"
                )
                P.assert_same(got[0], ranks[r], f"read groups torch rank {r}")
            n += 1
        if workers == 0 and url is not None:
            for r in range(world):
                got_url = P.rank_batches(
                    f"{url}{path.name}", kw, rank=r, world=world, workers=0, epoch=epoch
                )
                P.assert_same(got_url, ranks[r], f"read groups by URL rank {r}")
            n += 1
    return n


# -- elastic resume -----------------------------------------------------------------------------


def check_elastic(
    case: P.Case,
    root: Path,
    new_world: int,
    new_workers: int,
    frac: float,
    then: tuple[int, int, float] | None = None,
    url: str | None = None,
) -> int:
    """A plain case read ``k`` batches a rank on its world (0 workers), its state resumed on
    ``new_world`` ranks x ``new_workers``: first leg plus the rest is every row once (less the
    resumed plan's reported drops, plus padding); values the source's; the rest the same
    in-process and through ``StreamingDataLoader``. ``then``: a third leg (world, workers,
    fraction of the second leg read before its state is saved), the chain checked likewise.
    ``url`` (``root`` served, ending in ``/``): the resumed leg read by URL too, the same.
    Returns the epochs checked."""
    path, want = P.make_case_store(case, root)
    kw = case.load_kw()
    spec = LoadSpec.build(str(path), **kw)
    arrays = list(spec.selection.arrays)
    plan = spec.plan(world_size=case.world, num_workers=0, epoch=case.epoch)
    k = int(plan.batches_per_rank * frac)
    if not 0 < k < plan.batches_per_rank:
        return 0
    head = [
        P.rank_batches(str(path), kw, rank=r, world=case.world, workers=0, epoch=case.epoch, take=k)
        for r in range(case.world)
    ]
    M.COUNT["elastic"] += 1
    state = plan_state(plan, k).to_dict()
    state["dataset"] = spec.fingerprint
    rest = [
        P.rank_batches(
            str(path), kw, rank=r, world=new_world, workers=new_workers, epoch=case.epoch,
            state=state,
        )
        for r in range(new_world)
    ]  # fmt: skip
    for part in (*head, *rest):
        P.check_values(part, want, arrays)
        M.COUNT["batches"] += len(part)
    resumed = spec.plan(
        world_size=new_world, num_workers=new_workers, epoch=case.epoch, state=state
    )
    assert len({len(m) for m in rest}) <= 1, "unequal batch counts after an elastic resume"
    assert all(len(m) == resumed.batches_per_rank for m in rest)
    ids = np.concatenate([bt["index"] for m in (*head, *rest) for bt in m])
    counts = Counter(ids.tolist())
    every = spec.selection.global_rows().tolist()
    assert set(counts) <= set(every), "a row outside the selection"
    # drops and padding: the first plan's (its rows never planned) plus the re-plan's
    dropped, padded = plan.num_dropped + resumed.num_dropped, plan.num_padded + resumed.num_padded
    if case.mode == "drop":
        assert max(counts.values()) == 1, "a row served twice over the two legs"
        assert len(ids) == len(every) - dropped, (len(ids), len(every), dropped)
    else:
        assert set(counts) == set(every), "a row never served over the two legs"
        assert len(ids) == len(every) + padded, (len(ids), len(every), padded)
    if url is not None:  # the state taken locally resumes by URL to the same batches
        for r in range(new_world):
            got_url = P.rank_batches(
                f"{url}{path.name}", kw, rank=r, world=new_world, workers=new_workers,
                epoch=case.epoch, state=state,
            )  # fmt: skip
            P.assert_same(got_url, rest[r], f"elastic by URL rank {r}")
    if then is not None:
        _check_chain(path, kw, spec, resumed, head, rest, state, then, case, want, arrays)
    # a StreamingDataLoader stopped after k batches (its own state), resumed on the new shape
    (first,), saved = P.torch_batches(
        str(path), kw, rank=0, world=case.world, workers=0, epoch=case.epoch, take=k
    )
    P.assert_same(first, head[0], "elastic torch first leg")
    holder = P.Holder()
    for r in range(new_world):
        got, _ = P.torch_batches(
            str(path), kw, rank=r, world=new_world, workers=new_workers, epoch=case.epoch,
            context="fork" if new_workers else None, state=saved, holder=holder,
        )  # fmt: skip
        P.assert_same(got[0], rest[r], f"elastic torch rank {r}")
    return 2


def _check_chain(path, kw, spec, resumed, head, rest, state, then, case, want, arrays) -> None:
    """A second elastic resume, from a state saved ``k2`` batches into the resumed leg."""
    world3, workers3, frac = then
    k2 = int(resumed.batches_per_rank * frac)
    if not 0 < k2 < resumed.batches_per_rank:
        return
    state2 = plan_state(resumed, k2).to_dict()
    state2["dataset"] = spec.fingerprint
    third = [
        P.rank_batches(
            str(path), kw, rank=r, world=world3, workers=workers3, epoch=case.epoch,
            state=state2,
        )
        for r in range(world3)
    ]  # fmt: skip
    M.COUNT["elastic chained"] += 1
    for part in third:
        P.check_values(part, want, arrays)
    plan3 = spec.plan(world_size=world3, num_workers=workers3, epoch=case.epoch, state=state2)
    # the second leg in DataLoader order: its first k2 batches a rank
    legs = [*head, *(m[:k2] for m in rest), *third]
    ids = np.concatenate([bt["index"] for m in legs for bt in m] or [np.zeros(0, "i8")])
    counts = Counter(ids.tolist())
    every = spec.selection.global_rows().tolist()
    first = spec.plan(world_size=case.world, num_workers=0, epoch=case.epoch)
    dropped = first.num_dropped + resumed.num_dropped + plan3.num_dropped
    padded = first.num_padded + resumed.num_padded + plan3.num_padded
    if case.mode == "drop":
        assert max(counts.values(), default=1) == 1, "a row served twice over three legs"
        assert len(ids) == len(every) - dropped, (len(ids), len(every), dropped)
    else:
        assert set(counts) == set(every), "a row never served over three legs"
        assert len(ids) == len(every) + padded, (len(ids), len(every), padded)
