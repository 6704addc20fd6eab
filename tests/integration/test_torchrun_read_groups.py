"""Read groups under torchrun: 4 ranks in 2 groups of 2, gloo on CPU, one DataLoader worker
each (docs/loading.md, "Read groups")."""

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
from test_read_groups import N, states

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.timeout(400)]
SCRIPT = Path(__file__).with_name("read_groups_script.py")
TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"
WORLD = 4


def torchrun(store, out: Path, *extra: str) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
    }
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={WORLD}",
        str(SCRIPT),
        store.root,
        str(out),
        *extra,
    ]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = []
    for r in range(WORLD):
        got = json.loads((out / f"rank{r}.json").read_text())
        with np.load(out / f"rank{r}.npz") as z:
            got.update(index=z["index"], a=z["a"])
        ranks.append(got)
    return ranks


@pytest.mark.slow  # three torchrun launches of 4 processes that import torch: ~50 s of CPU
def test_torchrun_four_ranks_in_two_read_groups(tmp_path):
    st, a, _ = states(tmp_path / "data")
    full = torchrun(st, tmp_path / "full")
    # the ranks of a group: the same samples in the same order; the groups: disjoint, covering
    assert np.array_equal(full[0]["index"], full[1]["index"])
    assert np.array_equal(full[2]["index"], full[3]["index"])
    assert not set(full[0]["index"].tolist()) & set(full[2]["index"].tolist())
    assert sorted([*full[0]["index"].tolist(), *full[2]["index"].tolist()]) == list(range(N))
    for r, got in enumerate(full):  # each rank: its slice of the cells of its rows
        axis, lo, hi = got["slices"]["a"]
        assert (axis, lo, hi) == (1, 5 * (r % 2), 5 * (r % 2) + 5)
        np.testing.assert_array_equal(got["a"], a[got["index"]][..., lo:hi])
        assert got["len"] == len(got["sizes"]) == N // 2 // 4
    # stop after 2 batches, resume from the saved state: the same rest of the epoch
    head = torchrun(st, tmp_path / "head", "--stop-after", "2")
    states_ = [h["state"] for h in head]
    assert all(s == states_[0] for s in states_)  # every rank saves the same position
    assert states_[0]["dataset"]["batches_consumed"] == 2
    assert states_[0]["dataset"]["world_size"] == 2  # two data-parallel groups
    path = tmp_path / "state.json"
    path.write_text(json.dumps(states_[0]))
    tail = torchrun(st, tmp_path / "tail", "--resume", str(path))
    for r in range(WORLD):
        np.testing.assert_array_equal(
            np.concatenate([head[r]["index"], tail[r]["index"]]), full[r]["index"]
        )
        np.testing.assert_array_equal(np.concatenate([head[r]["a"], tail[r]["a"]]), full[r]["a"])
