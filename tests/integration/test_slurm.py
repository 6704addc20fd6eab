"""prepare and compute on a real SLURM through dask-jobqueue, and what happens when it fails.

Each test starts its own single-node SLURM (the ``slurm`` fixture: a few seconds) and checks that
no job is left in the queue afterwards. Skipped where slurm-wlm / munge are missing or not root.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

import shardload
from shardload.errors import ClusterError, NaNError

from .slurm_cluster import SlurmCluster

pytestmark = [pytest.mark.integration, pytest.mark.distributed]

#: generous for a 2-core machine shared with other jobs; the issue's bound is 3 minutes
FAIL_WITHIN_S = 180


def make_dataset(n: int, *, seed: int = 0, nan_at: tuple[int, int] | None = None) -> Any:
    import xarray as xr

    rng = np.random.default_rng(seed)
    b = rng.normal(size=(n, 3)).astype("float32")
    if nan_at is not None:
        b[nan_at] = np.nan
    return xr.Dataset(
        {
            "a": (("sample",), rng.normal(size=n).astype("float32")),
            "b": (("sample", "feat"), b),
            "c": (("level", "sample"), rng.normal(size=(4, n))),
        }
    )


def cluster_options(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "kind": "slurm",
        "jobs": 2,
        "cores": 1,
        "processes": 1,
        "memory": "1GB",
        "walltime": "00:10:00",
        "interface": "lo",
        "log_directory": str(tmp_path / "logs"),
        "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
        **extra,
    }


def prepare_config(tmp_path: Path, out: str, execution: Any, n: int = 400) -> dict[str, Any]:
    src = tmp_path / "small.nc"
    if not src.exists():
        make_dataset(n, seed=3).to_netcdf(src)
    return {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "arrays": {"x": ["a", "b"], "y": ["c"]},
        "chunk_rows": 20,
        "out": str(tmp_path / out),
        "execution": execution,
    }


def jobqueue(tmp_path: Path, timeout_s: float = 60, **extra: Any) -> dict[str, Any]:
    return {
        "scheduler": "jobqueue",
        "cluster": cluster_options(tmp_path, **extra),
        "timeout_s": timeout_s,
    }


def comparable(store_dir: Path) -> dict[str, Any]:
    """The manifest less what differs between two runs of one config: time, out, execution."""
    m = json.loads((store_dir / "shardload.json").read_text())
    prov = m["provenance"]
    prov.pop("created")
    prov["config"].pop("out")
    prov["config"].pop("execution")
    prov["config"].pop("overwrite", None)
    return m


def assert_no_jobs(slurm: SlurmCluster) -> None:
    deadline = time.monotonic() + 30  # a cancelled job may show as CG for a moment
    while slurm.jobs() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert slurm.jobs() == []


def test_prepare_on_slurm_equals_threads(tmp_path, slurm, capsys, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="shardload.jobqueue")
    t0 = time.perf_counter()
    jq = shardload.prepare(prepare_config(tmp_path, "jq", jobqueue(tmp_path)), progress=False)
    t_jq = time.perf_counter() - t0
    t0 = time.perf_counter()
    th = shardload.prepare(prepare_config(tmp_path, "th", "threads"), progress=False)
    t_th = time.perf_counter() - t0
    for name in th.arrays:
        np.testing.assert_array_equal(jq.read(name), th.read(name))
    assert comparable(tmp_path / "jq") == comparable(tmp_path / "th")
    assert (tmp_path / "jq" / "checksums.npz").read_bytes() == (
        tmp_path / "th" / "checksums.npz"
    ).read_bytes()
    assert_no_jobs(slurm)
    up = [r.getMessage() for r in caplog.records if "workers up after" in r.getMessage()]
    assert up, caplog.text
    with capsys.disabled():
        print(
            f"\n[slurm] cluster up {slurm.timings['cluster_up_s']:.1f} s; {up[0]}; prepare on "
            f"SLURM {t_jq:.1f} s, threads {t_th:.1f} s"
        )


def test_compute_on_slurm_equals_threads(tmp_path, slurm):
    zarr = pytest.importorskip("zarr")
    data = np.random.default_rng(1).standard_normal((13, 11, 9)).astype("f4")
    g = zarr.open_group(store=str(tmp_path / "cube.zarr"), mode="w", zarr_format=3)
    g.create_array("amp", shape=data.shape, chunks=(4, 11, 9), dtype=data.dtype)[...] = data

    def config(out: str, execution: Any) -> dict[str, Any]:
        return {
            "source": {"paths": [str(tmp_path / "cube.zarr")], "variable": "amp"},
            "attributes": {"box": {"function": "compute_funcs:box", "depth": {0: 1}}},
            "chunks": {0: 4},
            "out": str(tmp_path / out),
            "execution": execution,
        }

    shardload.compute(config("jq", jobqueue(tmp_path)), progress=False)
    shardload.compute(config("th", {"scheduler": "threads"}), progress=False)
    a, b = shardload.open_store(tmp_path / "jq"), shardload.open_store(tmp_path / "th")
    np.testing.assert_array_equal(a.read("box"), b.read("box"))
    assert_no_jobs(slurm)


def test_parallelism_is_the_clusters_worker_threads(tmp_path, slurm):
    """1 job of 2 cores as 2 worker processes: 2 tasks in flight, one per worker thread."""
    from shardload.prep.config import ExecutionConfig
    from shardload.prep.executor import open_executor

    ex_cfg = ExecutionConfig(
        scheduler="jobqueue",
        timeout_s=60,
        cluster=cluster_options(tmp_path, jobs=1, cores=2, processes=2),
    )
    with open_executor(ex_cfg) as (ex, parallelism):
        info = ex.inner._client.scheduler_info(n_workers=-1)["workers"]  # type: ignore[attr-defined]
        assert parallelism == 2 == sum(w["nthreads"] for w in info.values())
        assert len(info) == 2
        assert ex.submit(sum, [1, 2]).result(timeout=60) == 3
        assert len(slurm.jobs()) == 1
    assert_no_jobs(slurm)


@pytest.mark.slow
def test_a_killed_job_is_replaced_and_its_blocks_rerun(tmp_path, slurm):
    """scancel one of the two jobs while blocks are in flight: its tasks run elsewhere, a new
    job replaces it, the store equals a threads run, and no job is left."""
    import dask

    zarr = pytest.importorskip("zarr")
    data = np.arange(12 * 3 * 2, dtype="f4").reshape(12, 3, 2)
    g = zarr.open_group(store=str(tmp_path / "cube.zarr"), mode="w", zarr_format=3)
    g.create_array("amp", shape=data.shape, chunks=(1, 3, 2), dtype=data.dtype)[...] = data

    def config(out: str, execution: Any) -> dict[str, Any]:
        return {
            "source": {"paths": [str(tmp_path / "cube.zarr")], "variable": "amp"},
            "attributes": {
                "d": {"function": "integration.slow_funcs:slow_double", "kwargs": {"seconds": 1.0}}
            },
            "chunks": {0: 1},
            "out": str(tmp_path / out),
            "execution": execution,
        }

    import threading

    seen: set[str] = set()
    killed: list[str] = []

    def kill_one_when_running() -> None:
        progress = tmp_path / "jq.partial" / "_progress"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            running = [j.split()[0] for j in slurm.jobs() if j.endswith("RUNNING")]
            seen.update(running)
            if len(running) == 2 and progress.is_dir() and any(progress.glob("block-*")):
                slurm.run("scancel", running[0])
                killed.append(running[0])
            time.sleep(0.3)
        while time.monotonic() < deadline and (tmp_path / "jq.partial").exists():
            seen.update(j.split()[0] for j in slurm.jobs())
            time.sleep(0.3)

    killer = threading.Thread(target=kill_one_when_running, daemon=True)
    killer.start()
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "1s"}):
        shardload.compute(config("jq", jobqueue(tmp_path)), progress=False)
    killer.join(timeout=30)
    assert killed, "the test never saw both jobs running"
    np.testing.assert_array_equal(shardload.open_store(tmp_path / "jq").read("d"), data * 2)
    assert len(seen) >= 3, f"no replacement job was submitted (jobs seen: {sorted(seen)})"
    assert_no_jobs(slurm)


@pytest.mark.slow
def test_task_error_cancels_the_jobs(tmp_path, slurm):
    """An error inside a task (NaN with nan: fail) reaches the caller; the jobs are cancelled."""
    src = tmp_path / "small.nc"
    make_dataset(100, nan_at=(57, 1)).to_netcdf(src)
    cfg = prepare_config(tmp_path, "jq", jobqueue(tmp_path))
    cfg["nan"] = "fail"
    with pytest.raises(NaNError, match="NaN"):
        shardload.prepare(cfg, progress=False)
    assert_no_jobs(slurm)


def _bad_partition(s: SlurmCluster) -> dict[str, Any]:
    return {"queue": "nosuchqueue"}


def _munge_down(s: SlurmCluster) -> dict[str, Any]:
    s.stop_daemon("munged")
    return {}


def _controller_down(s: SlurmCluster) -> dict[str, Any]:
    s.stop_daemon("slurmctld")
    return {}


def _worker_cannot_start(s: SlurmCluster) -> dict[str, Any]:
    return {"python": "/nonexistent/python"}


def _node_down(s: SlurmCluster) -> dict[str, Any]:
    s.stop_daemon("slurmd")
    return {}


FAILURES = {
    "bad_partition": (_bad_partition, r"sbatch.*invalid partition"),
    "munge_down": (_munge_down, r"sbatch.*(Munge|munge|authentication)"),
    "controller_down": (_controller_down, r"sbatch.*Unable to contact slurm controller"),
    "worker_cannot_start": (
        _worker_cannot_start,
        r"(?s)ended before its worker.*nonexistent/python",
    ),
    "node_down": (_node_down, r"(?s)no worker arrived within execution.timeout_s = 8 s.*jobs 1, 2"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_failure_is_a_clear_error_and_leaves_no_job(tmp_path, slurm, case, capsys):
    breaks, message = FAILURES[case]
    extra = breaks(slurm)
    cfg = prepare_config(
        tmp_path, "jq", jobqueue(tmp_path, timeout_s=8 if case == "node_down" else 15, **extra)
    )
    t0 = time.perf_counter()
    with pytest.raises(ClusterError, match=message) as err:
        shardload.prepare(cfg, progress=False)
    took = time.perf_counter() - t0
    assert took < FAIL_WITHIN_S
    # bring the stopped daemon back to ask the queue
    if "munged" not in slurm.procs:
        slurm.start_munge()
    if "slurmctld" not in slurm.procs:
        slurm.start_slurmctld()
        slurm._wait(lambda: slurm.run("squeue").returncode == 0, 30, "slurmctld back")
    if "slurmd" not in slurm.procs:
        slurm.start_slurmd()
    assert_no_jobs(slurm)
    assert not (tmp_path / "jq").exists()
    with capsys.disabled():
        first = str(err.value).splitlines()[0][:160]
        print(f"\n[slurm failure] {case}: {took:.1f} s: {first}")


def _run_cli(tmp_path: Path, execution: Any) -> subprocess.Popen[str]:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(prepare_config(tmp_path, "jq", execution)))
    return subprocess.Popen(
        [sys.executable, "-m", "shardload", "prepare", str(path), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ.copy(),
    )


def test_sigterm_while_waiting_cancels_the_jobs(tmp_path, slurm):
    """SIGTERM (e.g. the driver's own job killed) while the jobs wait in the queue: the command
    exits with 143 and no job is left."""
    # jobs that cannot start for an hour: the run is waiting for workers
    proc = _run_cli(
        tmp_path, jobqueue(tmp_path, timeout_s=120, job_extra_directives=["--begin=now+3600"])
    )
    try:
        deadline = time.monotonic() + 60
        while len(slurm.jobs()) < 2:
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "the jobs never reached the queue"
            time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out
    assert_no_jobs(slurm)


@pytest.mark.slow
def test_ctrl_c_while_blocks_run_cancels_the_jobs(tmp_path, slurm):
    """Ctrl-C (SIGINT) while blocks run on the workers: exit 130 (not the 0 of dask_jobqueue's
    own SIGINT handler), no job left, the finished blocks kept for a resume."""
    zarr = pytest.importorskip("zarr")
    data = np.arange(12 * 3 * 2, dtype="f4").reshape(12, 3, 2)
    g = zarr.open_group(store=str(tmp_path / "cube.zarr"), mode="w", zarr_format=3)
    g.create_array("amp", shape=data.shape, chunks=(1, 3, 2), dtype=data.dtype)[...] = data
    path = tmp_path / "attrs.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "source": {"paths": [str(tmp_path / "cube.zarr")], "variable": "amp"},
                "attributes": {
                    "d": {
                        "function": "integration.slow_funcs:slow_double",
                        "kwargs": {"seconds": 2.0},
                    }
                },
                "chunks": {0: 1},
                "out": str(tmp_path / "jq"),
                "execution": jobqueue(tmp_path),
            }
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "shardload", "compute", str(path), "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=os.environ.copy(),
    )
    progress = tmp_path / "jq.partial" / "_progress"
    try:
        deadline = time.monotonic() + 120
        while not (progress.is_dir() and any(progress.glob("block-*"))):
            assert proc.poll() is None, proc.communicate()[0]
            assert time.monotonic() < deadline, "no block finished"
            time.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert_no_jobs(slurm)
    assert not (tmp_path / "jq").exists() and any(progress.glob("block-*"))
