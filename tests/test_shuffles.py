"""Shuffles by name (``plan.shuffles.SHUFFLES``): every registered shuffle plans a permutation
of the selected rows, the same for the same seed, and ``True`` / ``False`` are names of it."""

from __future__ import annotations

import numpy as np
import pytest

from shardload.errors import PlanError
from shardload.plan.epoch import plan_epoch, plan_fingerprint
from shardload.plan.groups import worker_rows
from shardload.plan.shuffles import ALIASES, SHUFFLES, get_shuffle

SIZES = [7, 7, 7, 3]


@pytest.mark.parametrize("name", sorted(SHUFFLES))
@pytest.mark.parametrize("world, workers", [(1, 0), (2, 3)])
def test_every_shuffle_plans_each_row_once_and_repeats_with_the_seed(name, world, workers):
    def rows(seed: int, epoch: int) -> list[int]:
        plan = plan_epoch(
            SIZES,
            batch_size=3,
            shuffle=name,
            seed=seed,
            epoch=epoch,
            world_size=world,
            num_workers=workers,
            mode="pad",
            shuffle_chunks=2,
        )
        readers = max(1, workers)
        parts = [worker_rows(plan, r, w) for r in range(world) for w in range(readers)]
        return np.concatenate(parts).tolist()

    got = rows(1, 0)
    assert set(got) == set(range(sum(SIZES)))  # pads repeat rows, none is left out
    assert rows(1, 0) == got
    if name != "none":
        assert rows(1, 1) != got and rows(2, 0) != got
    else:
        assert rows(1, 1) == got


@pytest.mark.parametrize("flag", [True, False])
def test_booleans_are_names_of_registered_shuffles(flag):
    name = ALIASES[flag]
    opts = dict(batch_size=4, seed=3, shuffle_chunks=2)
    a = plan_epoch(SIZES, shuffle=flag, **opts)
    b = plan_epoch(SIZES, shuffle=name, **opts)
    assert a.fingerprint == b.fingerprint == plan_fingerprint(SIZES, shuffle=flag, **opts)
    assert worker_rows(a, 0, 0).tolist() == worker_rows(b, 0, 0).tolist()
    assert b.shuffle is flag  # plans carry the key, as before shuffles had names


def test_the_earlier_default_is_todays_plan_with_groups_of_four():
    chunks = get_shuffle("chunks")
    assert chunks.key is True and chunks.group == 4
    a = plan_epoch(SIZES, batch_size=4, shuffle="chunks", shuffle_chunks=4)
    b = plan_epoch(SIZES, batch_size=4, shuffle=True, shuffle_chunks=4)
    assert a.fingerprint == b.fingerprint


def test_an_unknown_shuffle_names_the_registered_ones():
    with pytest.raises(PlanError, match="'pieces', 'uniform'"):
        plan_epoch(SIZES, batch_size=4, shuffle="random")
