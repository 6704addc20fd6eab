"""ShardloadDataModule under a real ``Trainer(strategy="ddp", devices=2, accelerator="cpu")``:
each rank's batches are recorded by the LightningModule (lightning_script.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("lightning")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _stores import make_store, split_rows

pytestmark = [pytest.mark.integration, pytest.mark.distributed, pytest.mark.timeout(400)]

SCRIPT = Path(__file__).with_name("lightning_script.py")
REPO = Path(__file__).resolve().parents[2]


def _run(*args: object, cwd: Path) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{REPO}"}
    res = subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=360,
    )
    assert res.returncode == 0, res.stderr[-3000:]


def _seen(out: Path, tag: str) -> dict[int, list[tuple[int, int, list[int]]]]:
    """rank -> [(epoch, global_step, rows)] in training order."""
    got = {}
    for rank in (0, 1):
        lines = (out / f"seen-{tag}-rank{rank}.txt").read_text().splitlines()
        got[rank] = [
            (int(e), int(s), [int(r) for r in rows.split()])
            for e, s, rows in (ln.split(" ", 2) for ln in lines)
        ]
    return got


def test_ddp_epochs_and_mid_epoch_resume(tmp_path):
    store = make_store(tmp_path, n=203, chunk_rows=7)
    train = set(split_rows(store, "train").tolist())
    _run(store.url, tmp_path, "full", 2, 2, 4, cwd=tmp_path)  # checkpoints every 4 steps
    full = _seen(tmp_path, "full")

    orders = []
    for epoch in (0, 1):
        per_rank = [[r for e, _, rows in full[k] if e == epoch for r in rows] for k in (0, 1)]
        counts = [sum(1 for e, _, _ in full[k] if e == epoch) for k in (0, 1)]
        assert counts[0] == counts[1] > 0, f"epoch {epoch}: batches per rank {counts}"
        rows = per_rank[0] + per_rank[1]
        assert len(rows) == len(set(rows)), f"epoch {epoch}: a row was seen twice"
        assert set(rows) <= train
        assert len(train) - len(rows) < 2 * 8  # drop mode: less than a batch per rank dropped
        orders.append(per_rank[0])
    assert orders[0] != orders[1], "the order did not change between epochs"

    # resume from the checkpoint written in the middle of epoch 1 (after global step 12)
    steps_per_epoch = sum(1 for e, _, _ in full[0] if e == 0)
    ckpt = tmp_path / "ckpt" / "epoch=1-step=12.ckpt"
    assert ckpt.exists() and steps_per_epoch < 12 < 2 * steps_per_epoch, sorted(
        p.name for p in (tmp_path / "ckpt").iterdir()
    )
    _run(store.url, tmp_path, "resumed", 2, 2, ckpt, cwd=tmp_path)
    resumed = _seen(tmp_path, "resumed")
    for rank in (0, 1):
        expected = [b for b in full[rank] if b[0] == 1 and b[1] >= 12]
        assert resumed[rank] == expected, f"rank {rank}: the resumed run saw other batches"
    before = [r for k in (0, 1) for e, s, rows in full[k] if e == 1 and s < 12 for r in rows]
    after = [r for k in (0, 1) for _, _, rows in resumed[k] for r in rows]
    both = np.array(before + after)
    assert len(np.unique(both)) == len(both), "a row was trained twice across the resume"
