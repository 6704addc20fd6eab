"""Can a ring slot be reused while a numpy view of its batch lives? (issue 26, row 12)

The fault campaign's harness kept ``tensor.numpy()`` views of batches (not the batches, not
the tensors) across iterations, once saw rows twice, and asked whether the shared-memory ring
(:mod:`shardload.load.ring`) frees a slot while such a view still reads it. Here a loop keeps
only numpy views of some batches (``tensor.numpy()``, ``np.asarray(tensor)``, slices of
those), drops every tensor and dict, and runs far more batches than the ring has slots, so
that every slot is reused many times while views of its earlier batches live; each view must
still hold the rows it held when it arrived. Under fork (the ring) and spawn (the stock
hand-off, which the ring does not reach), with plain DataLoader and StreamingDataLoader.
"""

from __future__ import annotations

import gc
from collections import deque

import numpy as np
import pytest

from _stores import check_values, make_store

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shardload.torch import StreamingDataLoader, StreamingDataset  # noqa: E402

pytestmark = [pytest.mark.timeout(240), pytest.mark.usefixtures("young_gc")]
SLOTS = 8  # far fewer than the batches of an epoch: every slot is reused while views live
HOLD = 5  # batches whose views the loop holds at once (fewer than the slots: slots free)
EPOCHS = 1


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("views"), fmt="zarr", compression="none", n=331, chunk_rows=9
    )


def _views(batch, k: int) -> dict[str, np.ndarray]:
    """Numpy views only (no tensor, no dict of tensors kept), made three ways."""
    how = k % 3
    if how == 0:
        return {name: t.numpy() for name, t in batch.items()}
    if how == 1:
        return {name: np.asarray(t) for name, t in batch.items()}
    return {name: t.numpy()[:] for name, t in batch.items()}  # a view of a view


@pytest.mark.parametrize(
    ("ctx", "loader"),
    [
        ("fork", "DataLoader"),
        ("fork", "StreamingDataLoader"),
        pytest.param("spawn", "StreamingDataLoader", marks=pytest.mark.slow),  # ~60 s
    ],
)
def test_numpy_views_of_batches_never_change_while_held(store, ctx, loader):
    ds = StreamingDataset(store, batch_size=4, seed=5, ring_slots=SLOTS)
    kw = dict(num_workers=2, multiprocessing_context=ctx)
    if loader == "DataLoader":
        dl = DataLoader(ds, batch_size=None, **kw)
    else:
        dl = StreamingDataLoader(ds, bundle=2, **kw)  # bundles of 2: fit the few slots
    held: deque[tuple[dict[str, np.ndarray], dict[str, np.ndarray]]] = deque()
    seen = in_slots = checked = 0
    lo = hi = 0
    if ds._ring is not None:
        base = np.frombuffer(ds._ring._mm, np.uint8)
        lo, hi = base.ctypes.data, base.ctypes.data + base.nbytes
    for epoch in range(EPOCHS):
        ds.set_epoch(epoch)
        for batch in dl:
            seen += 1
            in_slots += lo <= batch["x"].data_ptr() < hi
            views = _views(batch, seen)
            held.append((views, {k: v.copy() for k, v in views.items()}))
            del batch  # only the numpy views are left
            if seen % 5 == 0:
                gc.collect()  # the finalizers of dropped views run: their slots are reused now
            for views, snapshot in held:  # every live view: as it arrived
                for k, v in views.items():
                    np.testing.assert_array_equal(v, snapshot[k], err_msg=f"{k} changed")
            if len(held) > HOLD:  # the oldest views go: their slot frees while others live
                views, _ = held.popleft()
                check_values(store, views)
                checked += 1
    assert seen > 10 * SLOTS and checked == seen - HOLD
    if ctx == "fork":  # the ring was in use: every slot was reused under held views
        assert in_slots > 2 * SLOTS, in_slots
