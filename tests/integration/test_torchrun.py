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
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}  # fmt: skip
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(SCRIPT), store.root, str(out), mode, *extra]  # fmt: skip
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
