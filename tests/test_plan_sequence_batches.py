"""``iter_worker_batches`` of a plan whose groups keep their rows' order (``shuffle=False``,
``"uniform"``): the worker's rows cut into batches a block at a time, not a group at a time.
Windows of dates plan one window per group, so a group at a time cost numpy calls per window."""

from __future__ import annotations

import numpy as np
import pytest

from shardload.plan import groups
from shardload.plan.epoch import plan_epoch
from shardload.plan.groups import iter_worker_batches, worker_rows
from shardload.plan.resume import plan_resume, skip_worker_batches


def _expected(plan, rank: int, worker: int) -> list[list[int]]:
    """The worker's rows group by group (``worker_rows``), cut into batches."""
    rows = worker_rows(plan, rank, worker).tolist()
    b = plan.batch_size
    return [rows[i : i + b] for i in range(0, len(rows), b)]


def _plans():
    rng = np.random.default_rng(0)
    for shuffle in (False, "uniform"):
        for case in range(12):
            sizes = rng.integers(1, 9, size=int(rng.integers(1, 40))).tolist()
            world, workers = int(rng.integers(1, 4)), int(rng.integers(0, 3))
            b = int(rng.integers(1, 7))
            try:
                plan = plan_epoch(
                    sizes,
                    world_size=world,
                    num_workers=workers,
                    batch_size=b,
                    shuffle=shuffle,
                    seed=case,
                    shuffle_chunks=int(rng.integers(1, 4)),
                )
            except Exception:  # too few rows for the world: not what this test is about
                continue
            yield plan
            k = plan.batches_per_rank // 2
            yield plan_resume(plan, k)  # exact resume (skip_rows)
            if world > 1:
                yield plan_resume(plan, k, world_size=world - 1)  # elastic: explicit rows
            wp = plan.workers[0][0]
            if wp.num_batches > 1:
                yield skip_worker_batches(plan, 0, 0, 1)


@pytest.mark.parametrize("block_rows", [3, 1 << 16])
def test_sequence_batches_equal_the_groups_rows(monkeypatch, block_rows):
    """Every worker's batches equal its rows group by group, cut into batches, whether a
    block ends inside a segment, a batch or neither."""
    monkeypatch.setattr(groups, "BLOCK_ROWS", block_rows, raising=False)
    checked = 0
    for plan in _plans():
        for rank in range(plan.world_size):
            for w in range(len(plan.workers[rank])):
                got = [b.tolist() for b in iter_worker_batches(plan, rank, w)]
                assert got == _expected(plan, rank, w)
                assert len(got) == plan.workers[rank][w].num_batches
                checked += 1
    assert checked > 50


def test_sequence_batches_cost_no_call_per_group(monkeypatch):
    """A plan of 2,000 one-row groups in storage order (windows of dates in date order: a
    window a group) is cut into batches with a few ``spans_rows`` calls, not one per group."""
    calls = []
    real = groups.spans_rows

    def counted(spans):
        calls.append(len(spans))
        return real(spans)

    monkeypatch.setattr(groups, "spans_rows", counted)
    plan = plan_epoch([1] * 2000, batch_size=8, num_workers=0, shuffle=False, shuffle_chunks=1)
    batches = list(iter_worker_batches(plan, 0, 0))
    assert len(batches) == 250
    assert np.array_equal(np.concatenate(batches), np.arange(2000))
    assert len(calls) <= 2, f"{len(calls)} spans_rows calls for 2,000 one-row groups"


def test_sequence_batches_refuse_a_plan_shorter_than_its_rows():
    """A worker plan promising more rows than its spans hold ends in a PlanError, never in a
    short batch."""
    import dataclasses

    from shardload.errors import PlanError

    plan = plan_epoch([4, 4], batch_size=3, num_workers=0, shuffle=False)
    wp = plan.workers[0][0]
    bad = dataclasses.replace(wp, num_rows=wp.num_rows + 2, num_batches=wp.num_batches + 1)
    plan = dataclasses.replace(plan, workers=((bad,),))
    with pytest.raises(PlanError, match="ended inside a batch"):
        list(iter_worker_batches(plan, 0, 0))
