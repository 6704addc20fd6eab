"""ShardloadDataModule without a Trainer (fast); the DDP runs with a real Trainer are in
tests/integration/test_lightning.py."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("lightning")

from _stores import make_store, split_rows
from shardload.errors import ShardloadError
from shardload.torch.lightning import ShardloadDataModule
from shardload.train.transforms import Normalize, plan_scale


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("dm"))


def _rows(batches) -> list[int]:
    return [int(i) for b in batches for i in b["index"]]


def test_train_loader_follows_the_trainer_epoch(store):
    dm = ShardloadDataModule(store, batch_size=8, seed=1)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True)
    loader = dm.train_dataloader()
    e0 = _rows(loader)
    e0_again = _rows(loader)
    dm.trainer.current_epoch = 1
    e1 = _rows(loader)
    assert e0 == e0_again  # same epoch, same order
    assert e0 != e1 and sorted(e0) == sorted(e1)
    assert set(e0) <= set(split_rows(store, "train").tolist())


def test_state_leaves_batches_fetched_ahead_unseen(store):
    """Lightning fetches one batch ahead of the step it runs: the state must count only the
    batches that reached a step (on_before_batch_transfer), so the fetched-ahead one is
    yielded again after resuming."""
    dm = ShardloadDataModule(store, batch_size=8, seed=1)
    dm.trainer = SimpleNamespace(current_epoch=2, training=True)
    it = iter(dm.train_dataloader())
    seen = []
    for _ in range(4):
        batch = next(it)
        seen.append(dm.on_before_batch_transfer(batch, 0))
    ahead = next(it)  # the fetcher's prefetch: never trained on
    state = dm.state_dict()
    assert state["train"]["dataset"]["batches_consumed"] == 4

    dm2 = ShardloadDataModule(store, batch_size=8, seed=1)
    dm2.trainer = SimpleNamespace(current_epoch=2, training=True)
    dm2.load_state_dict(state)  # Lightning restores the DataModule before making loaders
    loader = dm2.train_dataloader()
    full = len(loader)
    rest = list(loader)
    assert full == 4 + len(rest)  # len(): the whole epoch, as Lightning counts it
    assert np.array_equal(rest[0]["index"], ahead["index"])
    trained = _rows(seen) + _rows(rest)
    assert len(trained) == len(set(trained))
    dm3 = ShardloadDataModule(store, batch_size=8, seed=1)
    dm3.trainer = SimpleNamespace(current_epoch=2, training=True)
    assert sorted(trained) == sorted(_rows(dm3.train_dataloader()))


def test_the_models_own_batch_hook_still_runs(store):
    import lightning.pytorch as pl

    class Model(pl.LightningModule):
        def on_before_batch_transfer(self, batch, dataloader_idx):
            batch["seen_by_model"] = True
            return batch

    dm = ShardloadDataModule(store, batch_size=8)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True, lightning_module=Model())
    batch = next(iter(dm.train_dataloader()))
    assert dm.on_before_batch_transfer(batch, 0)["seen_by_model"] is True
    assert dm.state_dict()["train"]["dataset"]["batches_consumed"] == 1


def test_resume_of_a_finished_epoch_starts_the_current_one(store):
    dm = ShardloadDataModule(store, batch_size=8, seed=1)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True)
    for b in dm.train_dataloader():
        dm.on_before_batch_transfer(b, 0)
    state = dm.state_dict()
    dm2 = ShardloadDataModule(store, batch_size=8, seed=1)
    dm2.trainer = SimpleNamespace(current_epoch=1, training=True)
    dm2.load_state_dict(state)
    epoch1 = _rows(dm2.train_dataloader())
    dm3 = ShardloadDataModule(store, batch_size=8, seed=1)
    dm3.trainer = SimpleNamespace(current_epoch=1, training=True)
    assert epoch1 == _rows(dm3.train_dataloader())


def test_eval_loaders_and_bad_split(store):
    dm = ShardloadDataModule(store, batch_size=4)
    assert (
        sorted(_rows(dm.val_dataloader()))
        == sorted(split_rows(store, "val").tolist())[: len(_rows(dm.val_dataloader()))]
    )
    with pytest.raises(ShardloadError, match="val_split='valid'"):
        ShardloadDataModule(store, batch_size=4, val_split="valid")


def test_normalize_in_workers_matches_manifest_stats(store):
    m = store.manifest
    norm = Normalize(m, ["x"])
    dm = ShardloadDataModule(store, batch_size=8, num_workers=2, transform=norm)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True)
    shift, scale = plan_scale(m.stats["x"], "standardize")
    full = store.read("x")
    for batch in dm.train_dataloader():
        want = (full[np.asarray(batch["index"])] - shift) / scale
        np.testing.assert_allclose(np.asarray(batch["x"]), want, rtol=1e-6, atol=1e-6)
    back = norm.inverse("x", batch["x"])
    np.testing.assert_allclose(
        np.asarray(back), full[np.asarray(batch["index"])], rtol=1e-5, atol=1e-5
    )
    with pytest.raises(ShardloadError, match="dtype int64"):
        Normalize(m, ["y"])


def test_maxscale_guards_zero_features():
    stats = SimpleNamespace(mean=(0.0, 1.0), std=(0.0, 2.0), min=(0.0, -4.0), max=(0.0, 3.0))
    shift, scale = plan_scale(stats, "maxscale")
    assert shift.tolist() == [0.0, 0.0] and scale.tolist() == [1.0, 4.0]
    shift, scale = plan_scale(stats, "standardize")
    assert shift.tolist() == [0.0, 1.0] and scale.tolist() == [1.0, 2.0]
