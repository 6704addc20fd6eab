"""What starting StreamingDataLoader workers costs (issue 25): no process beside the workers,
and the epoch planned once, in the main process, for the workers a pass starts."""

from __future__ import annotations

import multiprocessing
import subprocess
import sys

import pytest

from _stores import make_store
from conftest import SRC

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader, get_worker_info  # noqa: E402

from shardload.load.spec import LoadSpec  # noqa: E402
from shardload.torch import StreamingDataLoader, StreamingDataset  # noqa: E402

pytestmark = [
    pytest.mark.timeout(180),
    pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="fork workers"),
]


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("w"), fmt="zarr", compression="lz4", n=331, chunk_rows=9
    )


def test_fork_workers_start_no_resource_tracker(store):
    """A spawn-context lock starts multiprocessing's resource tracker (a Python process of its
    own) in any program that builds a dataset; fork workers need none."""
    code = (
        "import multiprocessing.resource_tracker as rt\n"
        "from shardload.torch import StreamingDataLoader, StreamingDataset\n"
        f"ds = StreamingDataset({str(store.url)!r}, batch_size=16, split='train', seed=1)\n"
        "dl = StreamingDataLoader(ds, num_workers=2, multiprocessing_context='fork')\n"
        "n = [sum(1 for _ in dl) for _ in range(2)]\n"
        "print(n, rt._resource_tracker._pid)\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=150,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stderr
    ds = StreamingDataset(store.url, batch_size=16, split="train", seed=1)
    counts, tracker = res.stdout.strip().splitlines()[-1].rsplit(" ", 1)
    assert counts == f"[{len(ds)}, {len(ds)}]"
    assert tracker == "None"


@pytest.mark.slow  # spawned workers import torch: 10-20 s on 2 cores
def test_spawn_workers_after_fork_workers_share_the_epoch(store):
    """The channel's lock becomes a spawn-context one when spawned workers need it: set_epoch
    still reaches them, and they read what fork workers read."""
    ds = StreamingDataset(store.url, batch_size=16, split="train", seed=2)
    fork = [b["index"].tolist() for b in StreamingDataLoader(ds, num_workers=2)]
    ds2 = StreamingDataset(store.url, batch_size=16, split="train", seed=2)
    dl = StreamingDataLoader(ds2, num_workers=2, multiprocessing_context="spawn")
    ds2.set_epoch(0)
    assert [b["index"].tolist() for b in dl] == fork
    ds2.set_epoch(0)  # persistent spawned workers: the epoch set again reaches them
    assert [b["index"].tolist() for b in dl] == fork


class _Counter:
    """Calls of LoadSpec.plan in DataLoader workers (a fork-shared counter)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.value = multiprocessing.get_context("fork").Value("i", 0)
        plan = LoadSpec.plan

        def counted(spec, **kw):  # type: ignore[no-untyped-def]
            if get_worker_info() is not None:
                with self.value.get_lock():
                    self.value.value += 1
            return plan(spec, **kw)

        monkeypatch.setattr(LoadSpec, "plan", counted)

    def take(self) -> int:
        n, self.value.value = self.value.value, 0
        return n


@pytest.mark.parametrize("persistent", [True, False])
def test_new_workers_take_the_main_process_plan(store, monkeypatch, persistent):
    """Workers a pass starts plan nothing: the main process planned the pass before forking
    them (before: each worker planned the whole world's epoch again). Values and order are
    those of a plain DataLoader over the same dataset."""
    plans = _Counter(monkeypatch)
    ds = StreamingDataset(store.url, batch_size=16, split="train", seed=3)
    dl = StreamingDataLoader(ds, num_workers=2, persistent_workers=persistent)
    first = [b["index"].tolist() for b in dl]
    assert plans.take() == 0
    second = [b["index"].tolist() for b in dl]
    plans.take()  # persistent workers plan later epochs themselves
    ref = StreamingDataset(store.url, batch_size=16, split="train", seed=3)
    plain = DataLoader(ref, batch_size=None, num_workers=2, persistent_workers=True)
    assert [b["index"].tolist() for b in plain] == first
    assert [b["index"].tolist() for b in plain] == second
    assert first != second


def test_unbundled_fresh_workers_take_the_main_process_plan(store, monkeypatch):
    """A collate_fn of one's own (no bundles): fresh workers still find the pass planned."""
    plans = _Counter(monkeypatch)
    ds = StreamingDataset(store.url, batch_size=16, split="train", seed=4)
    dl = StreamingDataLoader(ds, num_workers=2, collate_fn=lambda b: b)
    got = [b["index"].tolist() for b in dl]
    assert plans.take() == 0
    assert sorted(i for b in got for i in b) == sorted(set(i for b in got for i in b))
    assert len(got) == len(ds)


def test_a_plan_of_other_arguments_is_refused(store):
    """read_batches(plan=...) checks the plan is of its world, workers and epoch: a plan of
    another epoch would serve other rows without a word."""
    from shardload.errors import PlanError
    from shardload.load.batches import read_batches

    spec = StreamingDataset(store.url, batch_size=16, split="train").spec
    other = spec.plan(world_size=1, num_workers=2, epoch=1)
    with pytest.raises(PlanError, match="epoch 1; this read is of 1, 2, epoch 0"):
        read_batches(spec, num_workers=2, epoch=0, plan=other)
    same = spec.plan(world_size=1, num_workers=2, epoch=0)
    got = [b["index"].tolist() for b in read_batches(spec, num_workers=2, epoch=0, plan=same)]
    assert got == [b["index"].tolist() for b in read_batches(spec, num_workers=2, epoch=0)]


def test_persistent_workers_start_before_the_main_process_plans(store, monkeypatch):
    """New workers wait for the main process's plan (they take it); persistent ones, whose
    later passes they plan themselves, are sent on first (not delayed by that plan)."""
    events: list[str] = []
    start = DataLoader.__iter__

    def started(self):  # type: ignore[no-untyped-def]
        events.append("workers")
        return start(self)

    monkeypatch.setattr(DataLoader, "__iter__", started)
    ds = StreamingDataset(store.url, batch_size=16, split="train", seed=5)
    n, plan = len(ds), ds._plan

    def planned(*a):  # type: ignore[no-untyped-def]
        events.append("plan")
        return plan(*a)

    monkeypatch.setattr(ds, "_plan", planned)
    dl = StreamingDataLoader(ds, num_workers=2)
    for _ in range(2):
        assert sum(1 for _ in dl) == n
        events.append("|")
    assert events == ["plan", "workers", "|", "workers", "plan", "|"]
