"""A real Lightning DDP fit (2 ranks on CPU, gloo) over a StreamingDataset: epochs advance by
themselves (Lightning calls set_epoch only on samplers), every rank gets the same number of
batches, and no row is seen twice in an epoch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("lightning")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stores import make_store, split_rows

pytestmark = [
    pytest.mark.integration,
    pytest.mark.distributed,
    pytest.mark.slow,  # 2 Lightning imports
    pytest.mark.timeout(300),
]
SCRIPT = Path(__file__).with_name("lightning_plain_script.py")
SRC = Path(__file__).resolve().parents[2] / "src"


def test_lightning_ddp_fit_two_epochs(tmp_path):
    store = make_store(tmp_path, fmt="npy", n=1009, chunk_rows=37)
    out = tmp_path / "out"
    out.mkdir()
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
    }
    res = subprocess.run(
        [sys.executable, str(SCRIPT), store.root, str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    rows = set(split_rows(store, "train").tolist())
    orders = []
    for epoch in ("0", "1"):
        batches = [r[epoch] for r in ranks]
        assert len(batches[0]) == len(batches[1]) > 0  # equal steps on every rank
        seen = [row for b in batches[0] + batches[1] for row in b]
        assert len(seen) == len(set(seen)) == len(rows) - len(rows) % 2  # no row twice
        assert set(seen) <= rows
        orders.append([row for b in batches[0] for row in b])
    assert orders[0] != orders[1]  # the second epoch is a new order
