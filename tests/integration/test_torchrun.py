"""Real DDP: torchrun, 2 ranks x 2 DataLoader workers, gloo on CPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stores import make_store, split_rows

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.timeout(400)]
SCRIPT = Path(__file__).with_name("ddp_script.py")
SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    # 1009 rows, chunks of 37, batch 16: nothing divides anything
    return make_store(tmp_path_factory.mktemp("ddp"), fmt="npy", n=1009, chunk_rows=37)


def torchrun(store, out: Path, mode: str, *extra: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        str(SCRIPT),
        store.root,
        str(out),
        mode,
        *extra,
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.parametrize("mode", ["drop", "pad"])
def test_ddp_epoch_covers_the_split(store, tmp_path, mode):
    ranks = torchrun(store, tmp_path / "full", mode)
    counts = [len(r["batches"]) for r in ranks]
    assert counts[0] == counts[1] > 0
    seen = [i for r in ranks for b in r["batches"] for i in b]
    rows = split_rows(store, "train")
    n = len(rows)
    if mode == "drop":
        assert len(seen) == len(set(seen)) == n - n % 2
    else:
        assert set(seen) == set(rows.tolist()) and len(seen) == n + n % 2
    assert set(seen) <= set(rows.tolist())


@pytest.mark.slow  # spawn / forkserver workers import torch: ~30 s of CPU
def test_ddp_workers_of_every_start_method_split_by_rank(store, tmp_path):
    """A dataset built before init_process_group, plain DataLoaders whose workers are started
    by forkserver (rank from torchrun's environment), fork and spawn: each rank reads its own
    half, the ranks' rows are disjoint and cover the split, len(ds) is what each rank yields,
    and each pass is the next epoch (a new order)."""
    ranks = torchrun(store, tmp_path / "ctx", "drop", "--contexts")
    rows = split_rows(store, "train")
    n = len(rows)
    names = [run["name"] for run in ranks[0]["runs"]]
    assert names == ["forkserver-env", "fork", "fork-again", "spawn"]
    orders, wrong = [], []
    for i, name in enumerate(names):
        runs = [r["runs"][i] for r in ranks]
        per_rank = [[row for b in run["batches"] for row in b] for run in runs]
        seen = per_rank[0] + per_rank[1]
        checks = {
            "len(ds) == batches yielded": all(len(r["batches"]) == r["len"] > 0 for r in runs),
            "ranks disjoint": not set(per_rank[0]) & set(per_rank[1]),
            "every row once": len(seen) == len(set(seen)) == n - n % 2,  # drop: 1 row left
            "rows of the split": set(seen) <= set(rows.tolist()),
        }
        wrong += [f"{name}: {check}" for check, ok in checks.items() if not ok]
        orders.append(per_rank[0])
    assert not wrong, wrong
    assert len({tuple(o) for o in orders}) == len(orders)  # every pass a new epoch


def test_ddp_stop_and_resume(store, tmp_path):
    full = torchrun(store, tmp_path / "full", "drop")
    k = 5
    head = torchrun(store, tmp_path / "head", "drop", "--stop-after", str(k))
    state = tmp_path / "state.json"
    state.write_text(json.dumps(head[0]["state"]))
    assert head[0]["state"] == head[1]["state"]  # every rank saves the same position
    assert head[0]["state"]["dataset"]["batches_consumed"] == k
    tail = torchrun(store, tmp_path / "tail", "drop", "--resume", str(state))
    for r in range(2):
        assert head[r]["batches"] + tail[r]["batches"] == full[r]["batches"]
    got = np.sort([i for part in (head, tail) for rr in part for b in rr["batches"] for i in b])
    want = np.sort([i for rr in full for b in rr["batches"] for i in b])
    np.testing.assert_array_equal(got, want)
