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
    cases = (
        "shardload-iter:none:w0,shardload-dl:none:w2,naive-npy:none:w0,shardload-iter:zstd:w0,"
        "shardload-iter-legacy:none:w0,shardload-iter-uniform:none:w0"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_load.py"),
        "--rows",
        "2048",
        "--features",
        "16",
        "--chunk-rows",
        "256",
        "--max-seconds",
        "60",
        "--cases",
        cases,
        "--workdir",
        str(tmp_path / "work"),
        "--out",
        str(out),
        "--no-plot",
    ]
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
        [
            "--rows",
            str(n),
            "--chunk-rows",
            str(chunk),
            "--batch-size",
            str(batch),
            "--workdir",
            str(tmp_path),
            "--peer-python",
            str(wrapper),
        ]
    )
    rec = bench_load.run_peer_case("litdata:none:w2", args)
    assert "error" not in rec, rec
    assert rec["complete_epoch"] is True
    assert rec["chunks_per_batch_ratio"] > 0.95 and rec["vif_pos"] < 1.6
    assert 0.5 < rec["recurrence"] < 1.5
    args.peer_python = None
    assert "needs --peer-python" in bench_load.run_peer_case("litdata:none:w2", args)["error"]


def test_small_chunk_store_kinds_and_case_names() -> None:
    """``zstd-cR`` / ``zstd-sR`` name zstd stores of R-row chunks (alone, or in shards of the
    base chunk rows); anything else is refused."""
    from loadbench_data import small_chunk_kind, store_kind_options

    assert parse_case("shardload-iter-mem:zstd-c256:w0") == ("shardload-iter-mem", "zstd-c256", 0)
    assert parse_case("shardload-sdl:zstd-s32:w2") == ("shardload-sdl", "zstd-s32", 2)
    for bad in (
        "shardload-iter:zstd-x256:w0",
        "shardload-iter:zstd-c:w0",
        "shardload-iter:none-c256:w0",
    ):
        with pytest.raises(ValueError, match="bad case name"):
            parse_case(bad)
    assert small_chunk_kind("zarr-zstd") is None
    assert store_kind_options("zarr-zstd-c256", 4096) == {
        "format": "zarr",
        "compression": "zstd",
        "chunk_rows": 256,
    }
    assert store_kind_options("zarr-zstd-s256", 4096)["shard_chunks"] == 16
    assert store_kind_options("zarr-none", 4096)["compression"] == "none"
    with pytest.raises(ValueError, match="must divide"):
        store_kind_options("zarr-zstd-c300", 4096)


@pytest.mark.integration
def test_small_chunk_stores_hold_the_same_values_and_have_their_own_limits(tmp_path: Path) -> None:
    """The small-chunk stores hold the base store's values; each gets its own read + decode
    limit (chunk files, or shards whose inner chunks are decoded); ``-mem`` reads them with the
    decoded rows of the zstd default (4 base chunks) and covers the epoch exactly."""
    import bench_load
    import loadbench_data as data
    from loadbench_cases import equal_memory_chunks, run_case

    import shardload

    kinds = ["zarr-zstd", "zarr-zstd-c64", "zarr-zstd-s64"]
    data.build_stores(
        tmp_path, rows=1024, features=8, chunk_rows=256, kinds=kinds, log=lambda m: None
    )
    base = shardload.open_store(tmp_path / "zarr-zstd").reader.read("x", 0, 1024)
    for kind in kinds[1:]:
        st = shardload.open_store(tmp_path / kind)
        assert np.array_equal(st.reader.read("x", 0, 1024), base), kind
        assert list(st.manifest.chunk_bounds)[:3] == [0, 64, 128], kind
        lim = bench_load.zstd_store_limit(tmp_path / kind)
        assert lim["zstd_Bps"] > 0 and len(lim["zstd_rates_Bps"]) == 3, kind
        assert equal_memory_chunks(tmp_path / kind) == 16
    assert "shard" in bench_load.zstd_store_limit(tmp_path / "zarr-zstd-s64")["zstd_variant"]
    rec = run_case("shardload-iter-mem:zstd-s64:w0", tmp_path, batch_size=32, max_seconds=60)
    assert rec["complete_epoch"] is True and rec["shuffle_chunks"] == 16
    assert rec["chunk_rows"] == 64 and rec["store"] == "zarr-zstd-s64"


@pytest.mark.integration
def test_uniform_bigger_than_ram_measures_read_every_row(tmp_path: Path) -> None:
    """The helpers of bench_uniform_bigger_than_ram.py: the random-row limits read every row
    (threads, io_uring), the page cache of the store is dropped, a loader case checks coverage."""
    import bench_uniform_bigger_than_ram as big
    import loadbench_data as data

    assert big.parse_size("512M") == 512 << 20 and big.parse_size("1GiB") == 1 << 30
    data.build_stores(
        tmp_path, rows=1024, features=8, chunk_rows=256, kinds=["zarr-none"], log=lambda m: None
    )
    store = tmp_path / "zarr-none"
    files = data.zarr_chunk_files(store)
    kw = {
        "chunk_rows": 256,
        "row_bytes": 32,
        "rows": 1024,
        "batch": 64,
        "seed": 0,
        "max_seconds": 60.0,
    }
    assert big.random_rows(files, threads=4, **kw)[0] == 1024
    assert big.random_rows_uring(files, threads=2, **kw)[0] == 1024
    data.warm_page_cache(files)
    big.drop_cache(files)
    resident = big.resident_bytes(files)
    assert resident is None or resident < sum(p.stat().st_size for p in files)
    for name in ("uniform (io_uring)", "new default"):
        rec = big.run_case(name, store, batch_size=64, seed=0, max_seconds=60)
        assert rec["exact_coverage"] is True and rec["samples"] == 1024, name


RING_ROUNDS = "io_uring rounds of 256 (session 9) x 1 thread"
RING_DIRECT = "io_uring O_DIRECT continuous depth 1024 x 1 thread"


@pytest.mark.slow
@pytest.mark.integration
def test_uniform_bigger_than_ram_smoke_run(tmp_path: Path) -> None:
    """The whole benchmark under a memory cgroup (root and cgroup v1 only)."""
    if os.geteuid() != 0 or not Path("/sys/fs/cgroup/memory/cgroup.procs").exists():
        pytest.skip("needs root and the cgroup v1 memory controller")
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_uniform_bigger_than_ram.py"),
        "--workdir",
        str(tmp_path / "w"),
        "--rows",
        "4096",
        "--features",
        "64",
        "--chunk-rows",
        "512",
        "--mem-limit",
        "400M",
        "--random-threads",
        "4",
        "--ring-limits",
        f"{RING_ROUNDS},{RING_DIRECT}",
        "--fio",
        "",
        "--out",
        str(out),
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    res = json.loads(out.read_text())
    want = {
        "sequential_1",
        "random_4",
        f"random_ring: {RING_ROUNDS}",
        f"random_ring: {RING_DIRECT}",
    }
    assert want <= set(res["limits"])
    assert len(res["cases"]) == 5
    for r in res["cases"]:
        assert "error" not in r and r["exact_coverage"] is True, r
    assert not list(Path("/sys/fs/cgroup/memory").glob("shardload-bench-*"))


@pytest.mark.integration
def test_trees_ab_smoke_run_reports_every_epoch(tmp_path: Path) -> None:
    """``loadbench_trees_ab.py`` on tiny stores: every case and tree runs every round, with
    ``--epochs 2`` (persistent workers in one case) each run holds two complete epochs, and the
    table carries the first-batch and last-epoch columns."""
    import loadbench_data as data

    data.build_stores(
        tmp_path, rows=1024, features=8, chunk_rows=256, kinds=["zarr-zstd"], log=lambda m: None
    )
    out = tmp_path / "ab.json"
    src = str(REPO / "src")
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "loadbench_trees_ab.py"),
        "--workdir",
        str(tmp_path),
        "--trees",
        f"a={src},b={src}",
        "--rounds",
        "1",
        "--epochs",
        "2",
        "--batch-size",
        "64",
        "--out",
        str(out),
        "--cases",
        "iter:zarr-zstd;sdl:zarr-zstd:persistent_workers=1",
    ]
    env = {**os.environ, "PYTHONPATH": src}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=280, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| last epoch ÷ limit |" in p.stdout
    runs = json.loads(out.read_text())["runs"]
    assert sorted(runs) == sorted(
        f"{c} [{t}]" for c in ("iter:zarr-zstd", "sdl:zarr-zstd:persistent_workers=1") for t in "ab"
    )
    for rs in runs.values():
        (rec,) = rs
        assert [e["samples"] for e in rec["epochs"]] == [1024, 1024]
        assert rec["first_batch_s"] > 0 and rec["cpu_s"] > 0 and rec["last_ratio"] > 0


def test_fresh_memory_benchmark_runs(tmp_path: Path) -> None:
    """``bench_fresh_memory.py`` measures every step and prints the ratio (no rate asserted)."""
    cmd = [
        sys.executable,
        str(REPO / "benchmarks" / "bench_fresh_memory.py"),
        "--mib",
        "8",
        "--idle",
        "0",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = p.stdout.splitlines()
    assert sum("ms per 8 MiB" in ln for ln in lines) == 5
    assert "memory free for 0 s costs" in lines[-1]


def test_peak_rss_sums_a_child_from_its_second_scan_on() -> None:
    """A helper forked for a moment (``ldconfig`` from ``find_library``) holds its parent's
    RSS until it execs: summing it counted that process twice (issue 25). A descendant is
    summed once two consecutive scans saw it; the loader's workers live the whole run."""
    pytest.importorskip("psutil")
    from loadbench_cases import PeakRSS

    mem = PeakRSS()
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        mem.now()  # first scan that sees it
        assert child.pid not in [c.pid for c in mem._children]
        mem.now()  # the second: summed from now on (other lasting children of this test
        # process, e.g. a server another test of this worker started, are summed too)
        assert child.pid in [c.pid for c in mem._children]
    finally:
        child.kill()
        child.wait()
