"""shardload.torch: DataLoader with workers, set_epoch, mid-epoch resume, errors, map-style."""

from __future__ import annotations

import numpy as np
import pytest

from _stores import check_values, make_store, split_rows

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, DistributedSampler  # noqa: E402

from shardload.errors import ChunkReadError, PlanError, StateError  # noqa: E402
from shardload.torch import MapDataset, StreamingDataLoader, StreamingDataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("t"), fmt="zarr", compression="lz4", n=311, chunk_rows=9
    )


def indices(batches):
    return [b["index"].tolist() for b in batches]


def flat(batches):
    """The rows of a list of batches (of row lists), in order."""
    return [row for batch in batches for row in batch]


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_yields_the_split(store, workers):
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1)
    batches = list(DataLoader(ds, batch_size=None, num_workers=workers))
    idx = np.concatenate([b["index"].numpy() for b in batches])
    np.testing.assert_array_equal(np.sort(idx), split_rows(store, "train"))
    assert all(isinstance(v, torch.Tensor) for v in batches[0].values())
    assert batches[0]["index"].dtype == torch.int64
    check_values(store, {k: v.numpy() for k, v in batches[3].items()})
    assert len(batches) == len(ds)


def epoch_of(store, epoch, workers, **kw):
    """The batches of epoch ``epoch`` with ``workers`` workers, from a fresh dataset."""
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1, **kw)
    ds.set_epoch(epoch)
    return indices(DataLoader(ds, batch_size=None, num_workers=workers))


def test_workers_give_the_same_set_and_epochs_reorder(store):
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1)
    a = indices(DataLoader(ds, batch_size=None, num_workers=0))
    b = indices(DataLoader(ds, batch_size=None, num_workers=2))
    assert sorted(flat(a)) == sorted(flat(b))
    loader = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    ds.set_epoch(1)
    e1 = indices(loader)  # persistent workers see the new epoch
    ds.set_epoch(1)
    assert indices(loader) == e1  # same epoch, same order
    assert e1 == epoch_of(store, 1, 2)
    ds.set_epoch(0)
    e0 = indices(loader)
    assert e1 != e0 and sorted(flat(e1)) == sorted(flat(e0))


def test_each_pass_is_the_next_epoch_unless_set_epoch(store):
    """Passes through any loader (no workers, fresh workers, persistent workers, a
    StreamingDataLoader) advance the epoch by one each; set_epoch(e) makes the next pass e."""
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1)
    assert indices(DataLoader(ds, batch_size=None, num_workers=0)) == epoch_of(store, 0, 0)
    assert indices(DataLoader(ds, batch_size=None, num_workers=2)) == epoch_of(store, 1, 2)
    persistent = DataLoader(ds, batch_size=None, num_workers=2, persistent_workers=True)
    assert indices(persistent) == epoch_of(store, 2, 2)
    assert indices(persistent) == epoch_of(store, 3, 2)
    for i, _ in enumerate(persistent):  # a pass left early still counts
        if i == 2:
            break
    ds.set_epoch(7)
    assert indices(persistent) == epoch_of(store, 7, 2)
    assert indices(DataLoader(ds, batch_size=None, num_workers=0)) == epoch_of(store, 8, 0)
    sdl = StreamingDataLoader(
        StreamingDataset(store, batch_size=8, split="train", seed=1), num_workers=2
    )
    first, second = indices(sdl), indices(sdl)
    assert first == epoch_of(store, 0, 2) and second == epoch_of(store, 1, 2)
    assert sorted(flat(first)) == sorted(flat(second)) and first != second
    assert sdl.state_dict()["dataset"]["epoch"] == 1


def test_streaming_dataloader_keeps_its_workers_across_epochs_by_default(store):
    """With workers, StreamingDataLoader's workers persist (DataLoader's default is new ones
    each epoch): the second epoch is served by the first epoch's worker processes, and is the
    next epoch; no workers or an explicit False stay as asked."""
    sdl = StreamingDataLoader(
        StreamingDataset(store, batch_size=8, split="train", seed=1), num_workers=2
    )
    assert sdl.persistent_workers
    first = indices(sdl)
    workers = sdl._iterator  # DataLoader keeps a persistent iterator (and its processes)
    assert workers is not None
    second = indices(sdl)
    assert sdl._iterator is workers
    assert first == epoch_of(store, 0, 2) and second == epoch_of(store, 1, 2)
    assert not StreamingDataLoader(
        StreamingDataset(store, batch_size=8), num_workers=0
    ).persistent_workers
    fresh = StreamingDataLoader(
        StreamingDataset(store, batch_size=8), num_workers=2, persistent_workers=False
    )
    assert not fresh.persistent_workers


def test_state_of_a_plain_dataloader_with_workers_is_refused(store):
    """The main process's dataset cannot see what DataLoader workers handed to the loop: its
    state_dict() raises, pointing to the loaders that count, instead of saying 0 batches."""
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1)
    it = iter(DataLoader(ds, batch_size=None, num_workers=2))
    for _ in range(10):
        next(it)
    with pytest.raises(StateError, match=r"StreamingDataLoader.*StatefulDataLoader"):
        ds.state_dict()
    del it
    ds.set_epoch(1)  # a known position again: the start of epoch 1
    assert ds.state_dict()["epoch"] == 1 and ds.state_dict()["batches_consumed"] == 0
    list(DataLoader(ds, batch_size=None, num_workers=0))  # the main process counts these
    assert ds.state_dict()["batches_consumed"] == len(ds)


@pytest.mark.parametrize(("workers", "new_workers"), [(2, 2), (2, 0), (0, 2), (1, 2)])
def test_mid_epoch_resume(store, workers, new_workers):
    def loader(w):
        return StreamingDataLoader(
            StreamingDataset(store, batch_size=8, split="train", seed=2), num_workers=w
        )

    first = loader(workers)
    first.dataset.set_epoch(3)
    full = indices(first)
    first.dataset.set_epoch(3)  # else this pass would be epoch 4
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(5)]
    state = first.state_dict()
    del it
    assert state["dataset"]["batches_consumed"] == 5 and state["dataset"]["epoch"] == 3
    second = loader(new_workers)
    second.load_state_dict(state)
    rest = indices(second)
    if new_workers == workers:
        assert head + rest == full  # identical continuation
    else:
        assert sorted(flat(head + rest)) == sorted(flat(full))
    # chained: resume the resumed run again after 2 more batches
    third = loader(workers)
    third.load_state_dict(state)
    it = iter(third)
    mid = [next(it)["index"].tolist() for _ in range(2)]
    state2 = third.state_dict()
    del it
    fourth = loader(new_workers)
    fourth.load_state_dict(state2)
    assert sorted(flat(head + mid + indices(fourth))) == sorted(flat(full))


def test_state_from_other_dataset_or_seed(store, tmp_path):
    ds = StreamingDataset(store, batch_size=8, split="train", seed=2)
    state = StreamingDataLoader(ds).state_dict()
    with pytest.raises(StateError, match="seed"):
        StreamingDataset(store, batch_size=8, split="train", seed=3).load_state_dict(
            state["dataset"]
        )
    with pytest.raises(StateError, match="another dataset"):
        StreamingDataset(store, batch_size=8, split="val", seed=2).load_state_dict(state["dataset"])
    other = make_store(tmp_path, fmt="zarr", compression="lz4", n=312, chunk_rows=9)
    with pytest.raises(StateError):
        StreamingDataset(other, batch_size=8, split="train", seed=2).load_state_dict(
            state["dataset"]
        )


def test_batch_larger_than_rank_share(store):
    with pytest.raises(PlanError):
        StreamingDataset(store, batch_size=64, split="val", rank=0, world_size=2, drop_last=True)


def test_missing_chunk_raises_in_main_process(tmp_path):
    make_store(tmp_path, fmt="npy", n=120, chunk_rows=10, splits={"train": 1.0})
    (tmp_path / "store" / "y" / "000005.npy").unlink()
    ds = StreamingDataset(str(tmp_path / "store"), batch_size=4)
    with pytest.raises(ChunkReadError, match=r"000005\.npy"):
        list(DataLoader(ds, batch_size=None, num_workers=2))


@pytest.mark.parametrize("fmt", ["npy", "zarr"])
def test_map_dataset(tmp_path, fmt):
    store = make_store(
        tmp_path, fmt=fmt, compression="none" if fmt == "npy" else "zstd", n=90, chunk_rows=8
    )
    ds = MapDataset(store, split="train")
    assert len(ds) == len(split_rows(store, "train"))
    rows = [ds[i] for i in range(len(ds))]
    assert [int(r["index"]) for r in rows] == split_rows(store, "train").tolist()
    sampler = DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=0)
    batch = next(iter(DataLoader(ds, batch_size=5, sampler=sampler, num_workers=2)))
    check_values(store, {k: v.numpy() for k, v in batch.items()})
    with pytest.raises(IndexError):
        ds[len(ds)]


def test_rank_and_world_from_torchrun_environment(store, monkeypatch):
    """No process group: torchrun's RANK / WORLD_SIZE decide (here and, carried in the pickle,
    in spawned workers); bad values are refused by name."""
    want = StreamingDataset(store, batch_size=8, split="train", seed=1, rank=1, world_size=2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1)
    assert ds.rank_world() == (1, 2)
    ours = sorted(flat(indices(DataLoader(ds, batch_size=None, num_workers=0))))
    assert ours == sorted(flat(indices(DataLoader(want, batch_size=None, num_workers=0))))
    assert len(ds) == len(want)
    other = StreamingDataset(store, batch_size=8, split="train", seed=1, rank=0, world_size=2)
    theirs = sorted(flat(indices(DataLoader(other, batch_size=None, num_workers=0))))
    assert not set(ours) & set(theirs)
    import pickle

    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    # what a spawned worker gets: the main process's answer, resolved when it was pickled
    assert pickle.loads(pickle.dumps(ds))._carried == (0, 1)
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(StateError, match="RANK=2"):
        ds.rank_world()


def test_a_worker_that_cannot_know_its_rank_raises(store, monkeypatch):
    """A dataset unpickled in a worker without the main process's rank/world (and no process
    group, no RANK/WORLD_SIZE there) refuses to guess (0, 1)."""
    import types

    import shardload.torch.dataset as dataset_mod

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ds = StreamingDataset(store, batch_size=8, split="train", seed=1)
    ds._carried = None  # as if unpickled here without the main process's answer
    info = types.SimpleNamespace(id=0, num_workers=2, seed=5)
    monkeypatch.setattr(dataset_mod, "get_worker_info", lambda: info)
    with pytest.raises(StateError, match="cannot know its rank"):
        iter(ds)
