"""Batches to a device: DevicePrefetcher (CPU fallback here; the CUDA path is marked gpu)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from shardload.torch import DevicePrefetcher  # noqa: E402
from shardload.torch.device import plan_pinned_slots  # noqa: E402

CUDA = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="no CUDA device here (no GPU lent to this machine)"
)


def _batches(n=5):
    return [
        {"x": torch.full((4, 3), float(i)), "index": torch.arange(4) + 4 * i, "meta": "b"}
        for i in range(n)
    ]


def test_cpu_fallback_yields_the_same_batches_in_order():
    src = _batches()
    pre = DevicePrefetcher(src, "cpu", depth=2)
    assert not pre.uses_streams
    got = list(pre)
    assert len(got) == len(src) == len(pre)
    for a, b in zip(got, src, strict=True):
        assert torch.equal(a["x"], b["x"]) and torch.equal(a["index"], b["index"])
        assert a["meta"] == "b"  # what is not a tensor passes through
    assert pre.stats.batches == 5 and pre.stats.bytes == 5 * (4 * 3 * 4 + 4 * 8)


def test_a_cuda_device_without_cuda_falls_back(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert not DevicePrefetcher(_batches(), "cuda").uses_streams


def test_pinned_slots_and_bad_depth():
    assert plan_pinned_slots(1) == 2 and plan_pinned_slots(4) == 5
    with pytest.raises(ValueError, match="depth"):
        DevicePrefetcher([], "cpu", depth=0)


def test_datamodule_pins_batches_when_cuda_is_there(monkeypatch, tmp_path):
    pytest.importorskip("lightning")
    from _stores import make_store
    from shardload.torch.lightning import ShardloadDataModule

    store = make_store(tmp_path, n=40, chunk_rows=8)
    assert "pin_memory" not in ShardloadDataModule(store, batch_size=4)._loader_options()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert ShardloadDataModule(store, batch_size=4)._loader_options()["pin_memory"] is True
    assert (
        "pin_memory"
        not in ShardloadDataModule(store, batch_size=4, pin_memory=False)._loader_options()
    )


@pytest.mark.gpu
@CUDA
def test_cuda_copies_through_reused_pinned_buffers_on_a_side_stream():
    src = _batches(8)
    pre = DevicePrefetcher(src, "cuda", depth=2)
    assert pre.uses_streams
    got = [{k: v for k, v in b.items()} for b in pre]
    for a, b in zip(got, src, strict=True):
        assert a["x"].is_cuda and torch.equal(a["x"].cpu(), b["x"])
    # every batch staged through pinned buffers, allocated once per slot
    assert pre.stats.staged_bytes == pre.stats.bytes
    assert sum(len(s) for s in pre._pinned) == 2 * plan_pinned_slots(2)
    pinned = [{"x": b["x"].pin_memory()} for b in src]
    again = DevicePrefetcher(pinned, "cuda")
    list(again)
    assert again.stats.staged_bytes == 0  # already pinned: copied from where they are
