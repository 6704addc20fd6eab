"""The load benchmark's bookkeeping (shuffle quality, epoch completeness) and a smoke run.

Rates are never asserted: the benchmark measures, the docs report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from loadbench_cases import parse_case, quality_stats, shuffle_stats  # noqa: E402


def test_shuffle_stats_counts_distinct_chunks_and_checks_the_epoch() -> None:
    n, chunk, batch = 64, 8, 16
    sequential = [np.arange(k, k + batch) for k in range(0, n, batch)]
    s = shuffle_stats(sequential, length=n, chunk_rows=chunk, batch_size=batch, truncated=False)
    assert s["chunks_per_batch"] == 2.0
    assert s["chunks_per_batch_max_possible"] == 8
    assert s["complete_epoch"] is True

    perm = np.random.default_rng(0).permutation(n)
    mixed = [perm[k : k + batch] for k in range(0, n, batch)]
    s = shuffle_stats(mixed, length=n, chunk_rows=chunk, batch_size=batch, truncated=False)
    assert 2.0 < s["chunks_per_batch"] <= 8.0
    assert s["complete_epoch"] is True

    repeated = [*sequential[:-1], sequential[0]]
    s = shuffle_stats(repeated, length=n, chunk_rows=chunk, batch_size=batch, truncated=False)
    assert s["complete_epoch"] is False
    assert (s["duplicates"], s["missing"]) == (batch, batch)

    s = shuffle_stats(sequential[:1], length=n, chunk_rows=chunk, batch_size=batch, truncated=True)
    assert s["complete_epoch"].startswith("n/a")


def test_quality_stats_of_a_sequential_and_a_uniform_epoch() -> None:
    n, chunk, batch = 4096, 256, 64
    seq = [np.arange(k, k + batch) for k in range(0, n, batch)]
    q = quality_stats(seq, seq, length=n, chunk_rows=chunk)
    assert q["chunks_per_batch_ratio"] < 0.1 and q["vif_pos"] > batch / 2
    assert q["recurrence"] > 10
    perm = np.random.default_rng(0).permutation(n)
    uni = [perm[k : k + batch] for k in range(0, n, batch)]
    q = quality_stats(uni, [], length=n, chunk_rows=chunk)
    assert q["chunks_per_batch_ratio"] > 0.95 and q["vif_pos"] < 1.6
    assert np.isnan(q["recurrence"])  # no second epoch


def test_case_names_are_checked() -> None:
    assert parse_case("shardload-dl:zstd:w2") == ("shardload-dl", "zstd", 2)
    assert parse_case("shardload-sdl-r4:none:w2") == ("shardload-sdl-r4", "none", 2)
    for bad in ("shardload-dl:lz4:w2", "nope:none:w0", "shardload-dl:none:2"):
        with pytest.raises(ValueError, match="bad case name"):
            parse_case(bad)


@pytest.mark.slow
@pytest.mark.integration
def test_smoke_run_writes_complete_epochs(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    pytest.importorskip("psutil")
    out = tmp_path / "r.json"
    cases = ("shardload-iter:none:w0,shardload-dl:none:w2,naive-npy:none:w0,shardload-iter:zstd:w0,"
             "shardload-iter-legacy:none:w0,shardload-iter-uniform:none:w0")  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [sys.executable, str(REPO / "benchmarks" / "bench_load.py"), "--rows", "2048",
           "--features", "16", "--chunk-rows", "256", "--max-seconds", "60", "--cases", cases,
           "--workdir", str(tmp_path / "work"), "--out", str(out), "--no-plot"]  # fmt: skip
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    assert {"read_Bps", "memcpy_Bps", "zstd_Bps"} <= set(res["limits"])
    recs = {r["case"]: r for r in res["cases"] if not r.get("reference")}
    assert set(recs) == set(cases.split(","))
    for name, r in recs.items():
        assert "error" not in r, (name, r.get("error"))
        assert r["samples"] == 2048 and r["complete_epoch"] is True, name
        assert r["ratio_to_limit"] > 0 and r["peak_rss_MiB"] > 0, name
    assert recs["naive-npy:none:w0"]["chunks_per_batch"] > 4  # uniform sampling over 8 chunks
    for name in ("shardload-iter:none:w0", "shardload-iter-uniform:none:w0"):
        assert recs[name]["chunks_per_batch_ratio"] > 0.9 and recs[name]["recurrence"] < 1.5
    assert recs["shardload-iter-legacy:none:w0"]["vif_pos"] > 3
    refs = [r for r in res["cases"] if r.get("reference")]
    assert len(refs) == 2 and all("vif_ar" in r for r in refs)
    assert "shuffle quality" in p.stdout
    assert "in-process shardload / read limit" in p.stdout


def test_peer_cases_get_the_quality_figures_from_the_indices_they_write(tmp_path: Path) -> None:
    """A peer runs in another interpreter (``--peer-python``) and writes the sample indices of
    its batches; bench_load computes the five figures from them as for its own loaders. Here
    the "peer" is a stand-in script that yields a uniform permutation, two epochs."""
    import bench_load

    n, chunk, batch = 4096, 256, 64
    fake = tmp_path / "fake_peer.py"
    fake.write_text(
        "import json, sys, numpy as np\n"
        "a = sys.argv[sys.argv.index('--indices') + 1]\n"
        f"r = [np.random.default_rng(e).permutation({n}) for e in (0, 1)]\n"
        f"np.savez(a, **{{f'e{{e}}_{{k}}': r[e][k * {batch}:(k + 1) * {batch}] "
        f"for e in (0, 1) for k in range({n // batch})}})\n"
        "print(json.dumps({'case': 'litdata:none:w2', 'samples': "
        f"{n}, 'seconds': 1.0, 'truncated': False}}))\n"
    )
    wrapper = tmp_path / "peer-python"
    wrapper.write_text(f'#!/bin/sh\nshift\nexec "{sys.executable}" "{fake}" "$@"\n')
    wrapper.chmod(0o755)
    args = bench_load.parse_args(
        ["--rows", str(n), "--chunk-rows", str(chunk), "--batch-size", str(batch),
         "--workdir", str(tmp_path), "--peer-python", str(wrapper)]
    )  # fmt: skip
    rec = bench_load.run_peer_case("litdata:none:w2", args)
    assert "error" not in rec, rec
    assert rec["complete_epoch"] is True
    assert rec["chunks_per_batch_ratio"] > 0.95 and rec["vif_pos"] < 1.6
    assert 0.5 < rec["recurrence"] < 1.5
    args.peer_python = None
    assert "needs --peer-python" in bench_load.run_peer_case("litdata:none:w2", args)["error"]
