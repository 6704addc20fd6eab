"""``StreamingDataset.close()`` and ``with StreamingDataset(...) as ds:`` (issue 28): the store a
dataset opened from a path or URL is closed at once (before, only ``ds.store.close()`` did,
or a garbage collection), a Store passed in stays open, and a DataLoader worker closes its own
copy of the store as it exits, never the main process's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import shardload
from shardload.store.core import Store
from test_url_connections import client_connections, no_collection, url  # noqa: F401 (fixtures)

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shardload.torch import MapDataset, StreamingDataLoader, StreamingDataset  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def test_close_ends_the_connections_of_the_store_it_opened(url, no_collection):  # noqa: F811
    ds = StreamingDataset(url + "npy", batch_size=8)
    first = [b["index"].tolist() for b in DataLoader(ds, batch_size=None)]
    assert client_connections(url) > 0
    ds.close()
    assert client_connections(url) == 0
    ds.close()  # again: nothing more to close
    ds.set_epoch(0)  # still usable: the next pass opens new connections
    assert [b["index"].tolist() for b in DataLoader(ds, batch_size=None)] == first
    ds.close()
    assert client_connections(url) == 0


def test_a_with_block_closes_the_dataset(url, no_collection):  # noqa: F811
    with StreamingDataset(url + "zarr", batch_size=8) as ds:
        assert isinstance(ds, StreamingDataset)
        assert sum(len(b["index"]) for b in StreamingDataLoader(ds)) == len(ds.store)
        assert client_connections(url) > 0
    assert client_connections(url) == 0


def test_a_map_dataset_closes_the_store_it_opened(url, no_collection):  # noqa: F811
    with MapDataset(url + "npy") as ds:
        assert int(ds[5]["index"]) == 5
        assert client_connections(url) > 0
    assert client_connections(url) == 0


def test_a_store_passed_in_stays_open(url):  # noqa: F811
    with shardload.open_store(url + "npy") as st:
        with StreamingDataset(st, batch_size=8) as ds:
            list(DataLoader(ds, batch_size=None))
        MapDataset(st).close()
        assert client_connections(url) > 0  # the caller's store: still its connections
        assert len(st.read("x")) == len(st)


def test_each_worker_closes_its_own_copy_of_the_store_at_exit(
    url,  # noqa: F811
    no_collection,  # noqa: F811
    monkeypatch,
    tmp_path,
):
    """Forked workers inherit the patched ``Store.close``, which notes the process closing.
    The main process's store keeps its connections: a worker's close is of its own copy."""
    closes = tmp_path / "closes"
    close = Store.close

    def noted(self: Store) -> None:
        with open(closes, "a") as f:
            f.write(f"{os.getpid()}\n")
        close(self)

    monkeypatch.setattr(Store, "close", noted)
    ds = StreamingDataset(url + "npy", batch_size=8)
    loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context="fork")
    assert sum(len(b["index"]) for b in loader) == len(ds.store)  # then the workers exit
    pids = Path(closes).read_text().split() if closes.exists() else []
    assert len(pids) == 2 and str(os.getpid()) not in pids  # each worker once, not the main's
    assert client_connections(url) > 0  # the main process's own session is open
    ds.close()
    assert client_connections(url) == 0


def test_a_lightning_data_module_closes_the_store_it_opened_at_teardown(tmp_path):
    """``ShardloadDataModule`` given a URL opened its store and never closed it (its
    connections lived until a garbage collection); Lightning's ``teardown`` now closes it, and
    a later stage opens it anew. A Store passed in stays open."""
    pytest.importorskip("lightning")
    from _stores import make_store
    from shardload.move.serve import serving
    from shardload.torch.lightning import ShardloadDataModule

    make_store(
        tmp_path,
        n=120,
        chunk_rows=15,
        fmt="npy",
        compression="none",
        splits={"train": 0.75, "val": 0.25},
    )
    local = ShardloadDataModule(tmp_path / "store", batch_size=8, test_split=None)
    rows = {
        k: sum(len(b["index"]) for b in f())
        for k, f in (("train", local.train_dataloader), ("val", local.val_dataloader))
    }
    with serving(tmp_path) as base:
        dm = ShardloadDataModule(f"{base}store", batch_size=8, test_split=None)
        assert sum(len(b["index"]) for b in dm.train_dataloader()) == rows["train"] > 0
        assert client_connections(base) > 0
        dm.teardown("fit")
        assert client_connections(base) == 0
        assert sum(len(b["index"]) for b in dm.val_dataloader()) == rows["val"]  # usable again
        dm.teardown("validate")
        assert client_connections(base) == 0
        with shardload.open_store(f"{base}store") as st:
            given = ShardloadDataModule(st, batch_size=8, test_split=None)
            list(given.val_dataloader())
            given.teardown("validate")
            assert client_connections(base) > 0  # the caller's store: still its connections
