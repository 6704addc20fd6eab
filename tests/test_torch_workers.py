"""What starting StreamingDataLoader workers costs (issue 25): no process beside the workers."""

from __future__ import annotations

import subprocess
import sys

import pytest

from _stores import make_store
from conftest import SRC

torch = pytest.importorskip("torch")

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
