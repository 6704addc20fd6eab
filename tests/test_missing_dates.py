"""A dated store's missing dates never reach a batch (issue #27), whatever store it is: the
loaders cut them out of the selection (:mod:`shardload.plan.missing_dates`) unless
``missing_dates="include"``; ``"error"`` refuses them at plan time naming the first.

Stores in the layout anemoi-datasets writes are made here with zarr-python (fast, no anemoi
needed); tests/test_anemoi.py checks the same reads against stores anemoi-datasets builds.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shardload
from shardload.errors import PlanError
from shardload.manifest.time import TimeAxis
from shardload.plan.missing_dates import cut_missing_rows

MISSING = (0, 6, 7, 8, 20, 39)
KEPT = [i for i in range(40) if i not in MISSING]


def _dated_store(tmp_path: Path) -> shardload.Store:
    """A store of shardload's own (40 rows, chunks of 7) made dated: hourly, MISSING rows."""
    from _stores import make_store

    store = make_store(tmp_path, fmt="npy", n=40, chunk_rows=7, splits={"train": 1.0})
    manifest = Path(store.root) / "shardload.json"
    d = json.loads(manifest.read_text())
    d["time"] = TimeAxis(
        start=np.datetime64("2021-03-01T00", "s"),
        frequency=np.timedelta64(3600, "s"),
        length=40,
        missing=MISSING,
    ).to_dict()
    manifest.write_text(json.dumps(d))
    return shardload.open_store(store.root)


def test_shardload_dated_store_leaves_missing_rows_out(tmp_path):
    """The exclusion is the loaders', not anemoi's: any store whose manifest has a time axis
    with missing rows (here one of shardload's own) never yields them."""
    dated = _dated_store(tmp_path)
    assert dated.time is not None and dated.time.missing == MISSING
    for world in (1, 2):
        rows = [
            i
            for r in range(world)
            for b in shardload.iter_batches(dated, batch_size=4, rank=r, world_size=world)
            for i in b["index"].tolist()
        ]
        assert not set(rows) & set(MISSING)
        assert len(rows) == len(set(rows))
        assert len(KEPT) - len(rows) < world
    with pytest.raises(PlanError, match=r"2021-03-01T00:00:00 \(row 0\)"):
        shardload.iter_batches(dated, batch_size=4, missing_dates="error")
    everything = shardload.iter_batches(dated, batch_size=4, missing_dates="include")
    assert sorted(i for b in everything for i in b["index"].tolist()) == list(range(40))


@pytest.mark.slow  # about 16 s: torch, Lightning and two DataLoader workers
def test_torch_loaders_leave_missing_rows_out(tmp_path):
    """StreamingDataset (two DataLoader workers), MapDataset and the Lightning module: the
    same exclusion, from the one selection they share."""
    from types import SimpleNamespace

    from torch.utils.data import DataLoader

    from shardload.torch import MapDataset, StreamingDataset
    from shardload.torch.lightning import ShardloadDataModule

    dated = _dated_store(tmp_path)
    ds = StreamingDataset(dated, batch_size=4, seed=2)
    rows = [i for b in DataLoader(ds, batch_size=None, num_workers=2) for i in b["index"].tolist()]
    assert sorted(rows) == KEPT
    m = MapDataset(dated)
    assert [int(m[i]["index"]) for i in range(len(m))] == KEPT
    dm = ShardloadDataModule(dated, batch_size=4, val_split=None, test_split=None)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True)
    rows = [i for b in dm.train_dataloader() for i in b["index"].tolist()]
    assert sorted(rows) == KEPT
    with pytest.raises(PlanError, match="missing_dates='error'"):
        ShardloadDataModule(dated, batch_size=4, val_split=None, test_split=None,
                            missing_dates="error").train_dataloader()  # fmt: skip


@settings(max_examples=200, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    gaps=st.lists(st.integers(0, 3), min_size=8, max_size=8),
    missing=st.sets(st.integers(0, 120), max_size=30),
)
def test_cut_missing_rows_keeps_exactly_the_other_rows(sizes, gaps, missing):
    starts = np.cumsum([0] + [s + g for s, g in zip(sizes[:-1], gaps, strict=False)])
    ids = np.arange(len(sizes)) * 10
    rows = [(s + k, i) for s, n, i in zip(starts, sizes, ids, strict=True) for k in range(n)]
    out_sizes, out_ids, out_starts = cut_missing_rows(
        np.array(sizes), ids, starts, tuple(sorted(missing))
    )
    got = [(s + k, i) for s, n, i in zip(out_starts, out_sizes, out_ids, strict=True)
           for k in range(n)]  # fmt: skip
    assert got == [(r, i) for r, i in rows if r not in missing]
    assert (out_sizes > 0).all()
