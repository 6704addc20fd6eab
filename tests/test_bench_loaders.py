"""``shardload bench loaders``: emulated accelerators, their utilisation, the report files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _stores import make_store
from shardload.bench.loaders import PEERS, probe_peers
from shardload.bench.loaders_report import summarize

pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(300)
SRC = str(Path(__file__).resolve().parents[1] / "src")


def row(loader, workers, n, au, error=None):
    return dict(loader=loader, workers=workers, accelerators=n, au_min=au, error=error)


def test_summary_counts_up_to_the_first_failure():
    rows = [
        row("a", 0, 1, 0.95),
        row("a", 0, 2, 0.91),
        row("a", 0, 4, 0.89),
        row("a", 2, 1, 0.5),
        row("b", 0, 1, 0.99),
        row("b", 0, 2, 0.0, error="boom"),
    ]
    got = {(s["loader"], s["workers"]): s for s in summarize(rows)}
    assert got["a", 0]["max_accelerators"] == 2 and got["a", 0]["tried"] == [1, 2, 4]
    assert got["a", 2]["max_accelerators"] == 0
    assert got["b", 0]["max_accelerators"] == 1  # an error is a failure, never a pass
    passed_all = summarize([row("c", 0, 1, 0.99), row("c", 0, 2, 0.98)])[0]
    assert passed_all["max_accelerators"] == 2 and ">= 2" in passed_all["bound"]


def test_peers_are_probed_not_faked(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    status = probe_peers("zarr")
    assert set(status) == set(PEERS)
    assert all(s.startswith("not installed (pip install ") for s in status.values())


def run_bench(store: Path, out: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        sys.executable,
        "-m",
        "shardload",
        "-q",
        "bench",
        "loaders",
        str(store),
        "--emulate-compute",
        "0.01",
        "--batch-size",
        "16",
        "--out",
        str(out),
        *extra,
    ]
    return subprocess.run(
        cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": SRC}
    )


def test_cli_writes_results_report_and_plot(tmp_path):
    store = make_store(tmp_path, fmt="npy", n=400, chunk_rows=32)
    res = run_bench(
        Path(store.url),
        tmp_path / "out",
        "--workers",
        "0",
        "--accelerators",
        "1",
        "--loaders",
        "all",
    )
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    (r,) = doc["rows"]
    assert r["error"] is None and r["loader"] == "shardload" and r["accelerators"] == 1
    assert r["batches_per_accelerator"] == 400 // 16  # one epoch of the (only) rank's shard
    assert 0 < r["au_min"] <= 1.0 and r["samples_per_s"] > 0
    # an npy store: zarr-torch-dataset is never run on it, and says why
    assert (
        "Zarr" in doc["peers"]["zarr-torch-dataset"]
        or "not installed" in doc["peers"]["zarr-torch-dataset"]
    )
    report = (tmp_path / "out" / "report.md").read_text()
    assert "accelerators >= 90% busy" in report and "Machine:" in report
    assert (tmp_path / "out" / "au.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_shards_are_disjoint_and_peers_run_on_zarr(tmp_path):
    store = make_store(tmp_path, fmt="zarr", n=1024, chunk_rows=64)
    res = run_bench(Path(store.url), tmp_path / "out", "--workers", "0,1", "--accelerators", "1,2")
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    two = [r for r in doc["rows"] if r["loader"] == "shardload" and r["accelerators"] == 2]
    for r in two:  # two ranks: each reads half the rows
        assert [a["rows"] for a in r["per_accelerator"]] == [512, 512]
    if doc["peers"]["zarr-torch-dataset"] == "ok":
        assert any(r["loader"] == "zarr-torch-dataset" and r["error"] is None for r in doc["rows"])


def test_goal_and_windows_on_a_dated_store(tmp_path):
    import shardload
    from dated_fixtures import dated_store

    store = dated_store(tmp_path, n=40, chunk_rows=4, missing=(10,))
    windows = sum(len(b["index"]) for b in shardload.iter_batches(store, batch_size=4, window=3))
    assert 0 < windows < 40 - 2  # a window never touches the missing date
    res = run_bench(
        store.root, tmp_path / "out", "--workers", "0", "--accelerators", "1",
        "--goal", "0.95", "--window", "3", "--batch-size", "4", "--epochs", "2",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["goal"] == 0.95 and doc["window"] == 3
    assert "--goal 0.95 --window 3 --epochs 2" in doc["command"]
    (r,) = doc["rows"]
    # windows, not rows, two epochs of them
    assert r["error"] is None and r["per_accelerator"][0]["rows"] == 2 * windows
    assert r["bytes_per_s"] == pytest.approx(r["samples_per_s"] * 3 * doc["row_bytes"])
    assert r["per_accelerator"][0]["cpu_s"] > 0
    assert r["cpu_s_per_batch"] == pytest.approx(
        r["per_accelerator"][0]["cpu_s"] / r["batches_per_accelerator"]
    )
    assert doc["summary"] == summarize(doc["rows"], 0.95)
    report = (tmp_path / "out" / "report.md").read_text()
    assert "accelerators >= 95% busy" in report and "a window of 3 states" in report
    assert "loader CPU s a batch" in report
    assert "accelerators >= 95% busy" in res.stdout or "accelerators >= 95% busy" in res.stderr


def test_summary_uses_the_goal():
    rows = [row("a", 0, 1, 0.97), row("a", 0, 2, 0.93), row("a", 0, 4, 0.8)]
    assert summarize(rows)[0]["max_accelerators"] == 2
    assert summarize(rows, 0.95)[0]["max_accelerators"] == 1


@pytest.mark.parametrize(
    "bad, why",
    [
        (["--goal", "1.5"], "in (0, 1]"),
        (["--goal", "0"], "in (0, 1]"),
        (["--window", "0"], "K >= 1"),
    ],
)
def test_bad_goal_or_window_is_refused(tmp_path, bad, why):
    res = run_bench(tmp_path / "no-store", tmp_path / "out", *bad)
    assert res.returncode != 0
    assert f"{bad[0]} {bad[1]}" in res.stderr and why in res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # about 15 s: two consumer processes start
def test_sigterm_stops_the_consumers_too(tmp_path):
    """`bench loaders` stopped with SIGTERM leaves no consumer process running."""
    import signal
    import time

    store = make_store(tmp_path, fmt="npy", n=400, chunk_rows=32)
    cmd = [sys.executable, "-m", "shardload", "-q", "bench", "loaders", str(store.url)]
    cmd += ["--emulate-compute", "5", "--batch-size", "16", "--workers", "0"]
    cmd += ["--accelerators", "2", "--out", str(tmp_path / "out")]
    p = subprocess.Popen(cmd, env={**os.environ, "PYTHONPATH": SRC})
    children: set[int] = set()
    deadline = time.monotonic() + 60
    while len(children) < 2 and time.monotonic() < deadline:  # both consumers started
        children = {  # children of any of its threads
            int(c)
            for t in Path(f"/proc/{p.pid}/task").glob("*/children")
            for c in t.read_text().split()
        }
        time.sleep(0.1)
    assert len(children) == 2, children
    time.sleep(1.0)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) != 0
    time.sleep(0.5)
    alive = [c for c in children if _running(c)]
    assert not alive, f"consumers left running: {alive}"


def _running(pid: int) -> bool:
    try:  # a zombie (not reaped by this container's init) has stopped running
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
