"""One resume check for every read path (imported by the test modules).

:func:`assert_resumes_exactly` reads an epoch fresh, then resumes it mid-epoch the two ways a
training job does: from the state a rank saves after ``k`` batches (``state=``, what
``shardload.torch`` saves and torchdata's ``StatefulDataLoader`` restores through) and per
worker with ``skip_batches=`` (a worker's own position). Each resumed run must yield exactly
the remaining batches of the fresh run, bit for bit: the same ``index`` and the same values of
every array, in the same order. Any store, any read kind (gather, scatter, ragged, window).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

import shardload
from shardload.load.spec import LoadSpec
from shardload.plan.resume import plan_state

Batch = dict[str, np.ndarray]


def rank_batches(store: Any, *, rank: int, world: int, workers: int, **kw: Any) -> list[Batch]:
    """A rank's batches as a DataLoader yields them: batch ``j`` is worker ``j % W``'s next."""
    its: list[Iterator[Batch]] = [
        shardload.iter_batches(
            store, rank=rank, world_size=world, worker=w, num_workers=workers, **kw
        )
        for w in range(max(1, workers))
    ]
    out: list[Batch] = []
    while (b := next(its[len(out) % len(its)], None)) is not None:  # short workers come last
        out.append(b)
    return out


def assert_same_batches(got: Sequence[Batch], want: Sequence[Batch]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert sorted(g) == sorted(w)
        for key in w:
            np.testing.assert_array_equal(g[key], w[key], err_msg=key)


def assert_resumes_exactly(
    store: Any,
    *,
    world: int = 2,
    workers: int = 2,
    consumed: Sequence[int] = (1, 3),
    epoch: int = 1,
    **kw: Any,
) -> None:
    """Resuming after ``k`` batches (each of ``consumed``) yields exactly the rest of the epoch,
    per rank from a saved state and per worker with ``skip_batches``; ``kw`` go to
    ``iter_batches`` (``batch_size`` is needed)."""
    spec_kw = {k: v for k, v in kw.items() if k not in ("padding_stats",)}
    spec = LoadSpec.build(store, **spec_kw)
    plan = spec.plan(world_size=world, num_workers=workers, epoch=epoch)
    assert plan.batches_per_rank > max(consumed), "too few batches to resume mid-epoch"
    for rank in range(world):
        fresh = rank_batches(store, rank=rank, world=world, workers=workers, epoch=epoch, **kw)
        assert len(fresh) == plan.batches_per_rank
        for k in consumed:
            state = plan_state(plan, k).to_dict()
            state["dataset"] = spec.fingerprint
            rest = rank_batches(store, rank=rank, world=world, workers=workers, state=state, **kw)
            assert_same_batches(rest, fresh[k:])
        readers = max(1, workers)
        for w in range(readers):  # a worker's own position (torchdata restores workers so)
            mine = fresh[w::readers]
            for skip in (1, len(mine) - 1):
                got = list(
                    shardload.iter_batches(
                        store,
                        rank=rank,
                        world_size=world,
                        worker=w,
                        num_workers=workers,
                        epoch=epoch,
                        skip_batches=skip,
                        **kw,
                    )
                )
                assert_same_batches(got, mine[skip:])
