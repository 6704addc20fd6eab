"""PyTorch Lightning integration: :class:`ShardloadDataModule`.

Train / val / test loaders over a store's splits, built on
:class:`~shardload.torch.StreamingDataset` and :class:`~shardload.torch.StreamingDataLoader`.
Under ``Trainer(strategy="ddp")`` every rank reads its own share of each epoch (rank and world
from ``torch.distributed``, which Lightning initialises before it asks for loaders), every rank
gets the same number of batches, and the order changes every epoch: the train loader starts
epoch ``trainer.current_epoch`` each time Lightning iterates it.

Mid-epoch resume: Lightning saves ``datamodule.state_dict()`` in every checkpoint (and the
train loader's own ``state_dict()`` in the fit loop's state). Lightning's training loop fetches
one batch ahead of the step it runs, so the loader has yielded more batches than were trained
when a checkpoint is written mid-epoch; the train loader counts the batches the training loop
actually took (the DataModule's ``on_before_batch_transfer`` hook, called once per step) and
its state leaves the fetched-ahead batches unseen. Resuming from such a checkpoint yields
exactly the rows not yet trained on in that epoch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from shardload.errors import ShardloadError
from shardload.store.core import Store, open_store

try:
    import lightning.pytorch as pl
    from lightning.pytorch.utilities.model_helpers import is_overridden
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "shardload.torch.lightning needs PyTorch Lightning: pip install 'shardload[train]'"
    ) from exc

from shardload.torch import StreamingDataLoader, StreamingDataset

__all__ = ["ShardloadDataModule"]

_BATCHES_KEY = "batches_consumed"


class _EpochLoader(StreamingDataLoader):
    """A :class:`StreamingDataLoader` that starts the trainer's current epoch on each
    iteration (unless a resume for that epoch is pending) and whose state counts only the
    batches the training loop took, not those fetched ahead."""

    def __init__(
        self, dataset: StreamingDataset, *, epoch_of: Callable[[], int], **kwargs: Any
    ) -> None:
        super().__init__(dataset, **kwargs)
        self._epoch_of = epoch_of
        self._resume: Mapping[str, Any] | None = None
        self._yielded = 0  # batches yielded in the current iteration
        self._taken = 0  # of them, batches the training loop took
        self._full_len: int | None = None

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        epoch = int(self._epoch_of())
        ds: StreamingDataset = self.dataset  # type: ignore[assignment]
        pending, self._resume = self._resume, None
        if pending is None or int(pending["dataset"]["epoch"]) != epoch:
            ds.set_epoch(epoch)  # a resume of another (finished) epoch is dropped
        self._yielded = self._taken = 0
        for batch in super().__iter__():
            self._yielded += 1
            yield batch

    def took_batch(self) -> None:
        self._taken += 1

    def __len__(self) -> int:
        # Lightning compares the batches of the whole epoch it counted (restored ones included)
        # with len(): report the epoch's full length, also while a resume is pending.
        ds: StreamingDataset = self.dataset  # type: ignore[assignment]
        if self._resume is None:
            return len(ds)
        state = self._resume["dataset"]
        return len(ds) + int(state[_BATCHES_KEY])

    def state_dict(self) -> dict[str, Any]:
        if self._resume is not None:
            return {"dataset": dict(self._resume["dataset"])}
        state = super().state_dict()
        ahead = self._yielded - self._taken
        if ahead > 0:
            ds = dict(state["dataset"])
            ds[_BATCHES_KEY] = int(ds[_BATCHES_KEY]) - ahead
            state["dataset"] = ds
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        super().load_state_dict(state)
        self._resume = {"dataset": dict(state["dataset"])}


class ShardloadDataModule(pl.LightningDataModule):
    """Train / val / test loaders over a store's splits.

    Parameters
    ----------
    store
        A path, URL or :class:`~shardload.store.core.Store`.
    batch_size
        Rows per batch (per rank).
    num_workers
        DataLoader workers per rank.
    train_split, val_split, test_split
        Split names in the store (``None``: no such loader).
    seed
        Shuffle seed (the same on every rank; the epoch is mixed in by the dataset).
    mode
        ``"drop"`` or ``"pad"``: how ranks are evened out (see
        :class:`~shardload.torch.StreamingDataset`); ``eval_mode`` for val / test.
    transform
        A callable on a batch (a dict of tensors) run in the DataLoader workers, e.g.
        :class:`shardload.train.transforms.Normalize`; it should work in place.
    persistent_workers
        Keep workers between epochs (default: when ``num_workers > 0``).
    pin_memory
        Page-locked batches (the DataLoader's pin thread), so that Lightning's copies to the
        GPU (``non_blocking=True``) run asynchronously. Default: when CUDA is available. For
        a loop of your own, :class:`shardload.torch.DevicePrefetcher` also copies ahead on a
        side stream.
    dataset_options
        More keyword options of :class:`~shardload.torch.StreamingDataset` (``arrays``,
        ``shuffle_chunks``, ``prefetch``, ``bucket`` (train loader only),
        ``read_group_size`` / ``read_group_axis`` (read groups for model parallelism), ...).
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Store,
        *,
        batch_size: int,
        num_workers: int = 0,
        train_split: str | None = "train",
        val_split: str | None = "val",
        test_split: str | None = "test",
        seed: int = 0,
        mode: str = "drop",
        eval_mode: str = "drop",
        transform: Callable[[Any], Any] | None = None,
        persistent_workers: bool | None = None,
        pin_memory: bool | None = None,
        storage_options: Mapping[str, Any] | None = None,
        **dataset_options: Any,
    ) -> None:
        super().__init__()
        self._owns_store = not isinstance(store, Store)  # a path or URL: opened, closed here
        self.store = open_store(store, storage_options=storage_options)
        self.batch_size, self.num_workers = int(batch_size), int(num_workers)
        self.splits = {"train": train_split, "val": val_split, "test": test_split}
        have = set(self.store.manifest.splits)
        for stage, split in self.splits.items():
            if split is not None and split not in have:
                raise ShardloadError(
                    f"{stage}_split={split!r}: the store {self.store.url} has splits "
                    f"{sorted(have) or 'none'}"
                )
        self.seed, self.mode, self.eval_mode = int(seed), mode, eval_mode
        self.transform = transform
        self.persistent_workers = (
            self.num_workers > 0 if persistent_workers is None else bool(persistent_workers)
        )
        self.pin_memory = _cuda_available() if pin_memory is None else bool(pin_memory)
        self.dataset_options = dataset_options
        self._train: _EpochLoader | None = None
        self._train_state: Mapping[str, Any] | None = None

    def teardown(self, stage: str) -> None:
        """Lightning's end of ``fit`` / ``validate`` / ``test`` / ``predict``: the store this
        module opened from a path or URL is closed (by URL: its connections; a Store passed in
        stays open). The module stays usable: a later stage opens what it reads anew."""
        if self._owns_store:
            self.store.close()

    # -- loaders ---------------------------------------------------------------------------------
    def _dataset(self, split: str, *, shuffle: bool, mode: str) -> StreamingDataset:
        opts = dict(self.dataset_options)
        if not shuffle:  # length buckets re-deal shuffled groups: the train loader's only
            opts.pop("bucket", None)
        return StreamingDataset(
            self.store,
            batch_size=self.batch_size,
            split=split,
            shuffle=shuffle,
            seed=self.seed,
            mode=mode,
            **opts,
        )

    def _loader_options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {"num_workers": self.num_workers}
        if self.num_workers > 0:
            opts["persistent_workers"] = self.persistent_workers
        if self.transform is not None:
            opts["collate_fn"] = self.transform
        if self.pin_memory:
            opts["pin_memory"] = True
        return opts

    def _current_epoch(self) -> int:
        trainer = getattr(self, "trainer", None)
        return int(trainer.current_epoch) if trainer is not None else 0

    def train_dataloader(self) -> StreamingDataLoader:
        split = self._need("train")
        ds = self._dataset(split, shuffle=True, mode=self.mode)
        self._train = _EpochLoader(ds, epoch_of=self._current_epoch, **self._loader_options())
        if self._train_state is not None:
            self._train.load_state_dict(self._train_state)
            self._train_state = None
        return self._train

    def val_dataloader(self) -> StreamingDataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> StreamingDataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, stage: str) -> StreamingDataLoader:
        ds = self._dataset(self._need(stage), shuffle=False, mode=self.eval_mode)
        return StreamingDataLoader(ds, **self._loader_options())

    def _need(self, stage: str) -> str:
        split = self.splits[stage]
        if split is None:
            raise ShardloadError(
                f"no {stage} loader: the DataModule was made with {stage}_split=None"
            )
        return split

    # -- counting the batches the training loop took ---------------------------------------------
    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        trainer = getattr(self, "trainer", None)
        if self._train is not None and trainer is not None and trainer.training:
            self._train.took_batch()
        # Lightning calls only the DataModule's hook when both define it: run the model's too
        model = getattr(trainer, "lightning_module", None)
        if model is not None and is_overridden("on_before_batch_transfer", model):
            batch = model.on_before_batch_transfer(batch, dataloader_idx)
        return batch

    # -- resume ------------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._train is None:
            return {} if self._train_state is None else {"train": dict(self._train_state)}
        return {"train": self._train.state_dict()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        train = state_dict.get("train")
        if train is None:
            return
        if self._train is not None:
            self._train.load_state_dict(train)
        else:  # Lightning restores the DataModule before it asks for loaders
            self._train_state = train


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())
