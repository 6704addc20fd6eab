"""Elastic resume through the real reader: every format, both read paths, any world shapes.

A run reads ``k`` batches per rank on one world shape (ranks x DataLoader workers, simulated
in-process as a DataLoader does: rank batch ``j`` is worker ``j % W``'s next batch), saves the
state the torch layer would save, and resumes on another shape (possibly again, chained). The
rows consumed before plus the rows yielded after are exactly the epoch's rows, each once (less
what ``drop`` mode / ``drop_last`` report as dropped, plus what ``pad`` mode reports as padded),
every value equals the store's, and every worker yields exactly its plan's batches.
"""

from __future__ import annotations

from collections import Counter
from contextlib import nullcontext
from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shardload
from _stores import make_store
from shardload.load import kinds as kinds_mod
from shardload.load.scatter import raw_sources
from shardload.load.select import store_fingerprint
from shardload.load.spec import loader_selection, plan_for
from shardload.plan.groups import iter_worker_batches
from shardload.plan.resume import plan_state

#: (store, read path): scatter reads exist for raw local chunks only (npy, uncompressed Zarr).
CASES = [
    ("npy", "scatter"),
    ("npy", "gather"),
    ("zarr-none", "scatter"),
    ("zarr-none", "gather"),
    ("zarr-zstd", "gather"),
    ("zarr-sharded", "gather"),
    ("hdf5", "gather"),
]
STORES = {
    "npy": dict(fmt="npy"),
    "zarr-none": dict(fmt="zarr"),
    "zarr-zstd": dict(fmt="zarr", compression="zstd"),
    "zarr-sharded": dict(fmt="zarr", compression="zstd", shard_chunks=3),
    "hdf5": dict(fmt="hdf5"),
}


class _Stores(dict):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"<stores {sorted(self)}>"


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    out = _Stores()
    for name, kw in STORES.items():
        s = make_store(root / name, n=150, chunk_rows=4, name=name, **kw)  # type: ignore[arg-type]
        out[name] = (s, {a: s.read(a) for a in s.arrays})
    return out


shapes = st.tuples(st.integers(1, 3), st.integers(0, 3))
legs = st.lists(st.tuples(shapes, st.floats(0, 1)), min_size=1, max_size=2)


def _rank_batches(store, kw, state, rank, world, workers, take):
    """The first ``take`` batches of ``rank`` (all with None), in DataLoader order, and each
    worker's batches (to compare with the plan)."""
    readers = max(1, workers)
    its = [
        shardload.iter_batches(
            store, rank=rank, world_size=world, worker=w, num_workers=workers, state=state, **kw
        )
        for w in range(readers)
    ]
    got: list[dict] = []
    per_worker: list[list[dict]] = [[] for _ in range(readers)]
    try:
        j = 0
        while take is None or j < take:
            b = next(its[j % readers], None)
            if b is None:
                break
            b = {k: np.array(v) for k, v in b.items()}  # own copies: batch memory is recycled
            got.append(b)
            per_worker[j % readers].append(b)
            j += 1
    finally:
        for it in its:
            it.close()  # stopping mid-epoch, as a run that saves its state and exits
    return got, per_worker


def _check_values(batch, full):
    idx = batch["index"]
    for a, arr in full.items():
        np.testing.assert_array_equal(batch[a], arr[idx], err_msg=f"array {a}")


resume_cases = given(
    first=shapes,
    resumes=legs,
    batch_size=st.integers(2, 8),
    shuffle_chunks=st.sampled_from([None, 1, 2, 3, 4]),  # None: the default (small pieces)
    piece_rows=st.sampled_from([None, 0, 2, 5]),
    seed=st.integers(0, 3),
    shuffle=st.booleans(),
    mode_last=st.sampled_from([("drop", False), ("drop", True), ("pad", False)]),
)
fixture_ok = [HealthCheck.function_scoped_fixture]  # the stores are module-scoped, read-only


@pytest.mark.parametrize(("store_name", "path"), CASES)
@settings(max_examples=10, suppress_health_check=fixture_ok)
@resume_cases
def test_elastic_resume_reads_each_row_once(stores, store_name, path, **case):
    check_resume(stores, store_name, path, **case)


@pytest.mark.slow
@pytest.mark.parametrize(("store_name", "path"), CASES)
@settings(max_examples=200, suppress_health_check=fixture_ok)
@resume_cases
def test_elastic_resume_sweep(stores, store_name, path, **case):
    check_resume(stores, store_name, path, **case)


def check_resume(
    stores,
    store_name,
    path,
    *,
    first,
    resumes,
    batch_size,
    shuffle_chunks,
    piece_rows,
    seed,
    shuffle,
    mode_last,
):
    """Read ``first`` (ranks, workers) for a fraction of the epoch, resume on each shape of
    ``resumes`` in turn (chained states), the last to the end; check rows and values."""
    store, full = stores[store_name]
    mode, drop_last = mode_last
    sel, _, group = loader_selection(
        store,
        split="train",
        piece_rows=piece_rows,
        shuffle_chunks=shuffle_chunks,
        shuffle=shuffle,
    )
    raw = raw_sources(store, sel.arrays) is not None
    assert raw == (store_name in ("npy", "zarr-none"))  # where scatter reads exist; else gather
    kw = dict(
        batch_size=batch_size,
        split="train",
        seed=seed,
        epoch=2,
        shuffle=shuffle,
        mode=mode,
        drop_last=drop_last,
        shuffle_chunks=shuffle_chunks,
        piece_rows=piece_rows,
    )
    opts = {k: kw[k] for k in ("batch_size", "seed", "epoch", "shuffle", "mode", "drop_last")}
    gather = mock.patch.object(kinds_mod, "raw_sources", lambda *a: None)
    world_shapes = [first] + [shape for shape, _ in resumes]
    fractions = [frac for _, frac in resumes] + [None]  # the last leg reads to the end
    yielded: list[np.ndarray] = []
    dropped = padded = 0
    state = None
    with gather if path == "gather" else nullcontext():
        for (world, workers), frac in zip(world_shapes, fractions, strict=True):
            plan = plan_for(
                store,
                sel,
                world_size=world,
                num_workers=workers,
                state=state,
                shuffle_chunks=group,
                **opts,
            )
            take = None if frac is None else int(frac * plan.batches_per_rank)
            dropped, padded = dropped + plan.num_dropped, padded + plan.num_padded
            for rank in range(world):
                got, per_worker = _rank_batches(store, kw, state, rank, world, workers, take)
                assert len(got) == (plan.batches_per_rank if take is None else take)
                for w, mine in enumerate(per_worker):  # the reader follows the plan
                    want = list(iter_worker_batches(plan, rank, w))[: len(mine)]
                    assert [b["index"].tolist() for b in mine] == [x.tolist() for x in want]
                for b in got:
                    _check_values(b, full)
                    yielded.append(b["index"])
            if frac is not None:  # what the torch layer saves
                state = plan_state(plan, take).to_dict()
                state["dataset"] = store_fingerprint(store, sel)
    rows = np.concatenate(yielded) if yielded else np.zeros(0, np.int64)
    every = sel.global_rows()
    counts = Counter(rows.tolist())
    assert set(counts) <= set(every.tolist())
    if mode == "drop":  # each row once, and only reported drops missing
        assert max(counts.values(), default=1) == 1
        assert len(rows) == len(every) - dropped and padded == 0
    else:  # every row, and exactly the reported repeats
        assert set(counts) == set(every.tolist())
        assert len(rows) == len(every) + padded and dropped == 0


@pytest.fixture(scope="module")
def big_raw(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("issue12"), n=2000, chunk_rows=50, splits={"train": 1.0}
    )


@pytest.mark.parametrize("new", [(1, 0), (1, 1), (1, 3), (3, 1), (2, 3), (2, 0)])
def test_resume_after_49_batches_on_2x2(big_raw, new):
    """The reported case (issue 12): 49 batches per rank on 2 ranks x 2 workers of an
    uncompressed store, resumed on other shapes, crashed with ``IndexError: index -45 is out of
    bounds`` in the scatter reader (an unwanted row of a resumed group indexed ``bases[-k0]``)."""
    store = big_raw
    assert raw_sources(store, store.arrays) is not None  # the scatter path
    # shuffle_chunks=4: the default when the crash was reported (8 MiB pieces, 4 per group)
    kw = dict(batch_size=8, split="train", seed=3, epoch=0, shuffle_chunks=4)
    opts = dict(
        batch_size=8, seed=3, epoch=0, shuffle=True, mode="drop", drop_last=False, shuffle_chunks=4
    )
    sel, _, _ = loader_selection(store, split="train", shuffle_chunks=4)
    plan = plan_for(store, sel, world_size=2, num_workers=2, **opts)
    seen = []
    for r in range(2):
        got, _ = _rank_batches(store, kw, None, r, 2, 2, 49)
        seen += [b["index"] for b in got]
    state = plan_state(plan, 49).to_dict()
    rest = plan_for(store, sel, world_size=new[0], num_workers=new[1], state=state, **opts)
    full = {a: store.read(a) for a in store.arrays}
    for r in range(new[0]):
        got, _ = _rank_batches(store, kw, state, r, *new, None)
        for b in got:
            _check_values(b, full)
        seen += [b["index"] for b in got]
    rows = np.concatenate(seen)
    assert len(rows) == len(np.unique(rows)) == 2000 - rest.num_dropped
