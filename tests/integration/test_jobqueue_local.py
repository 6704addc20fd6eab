"""The jobqueue executor against a fake batch system that runs each job script on this machine
(``sbatch`` = start the script in the background, ``scancel`` = kill it): real dask workers
from dask-jobqueue's own scripts, without SLURM or root, so it runs everywhere."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

pytest.importorskip("dask_jobqueue")
pytest.importorskip("distributed")

from shardload.prep.config import ExecutionConfig
from shardload.prep.executor import open_executor

pytestmark = [pytest.mark.integration, pytest.mark.distributed]


def local_batch_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    scripts = {
        # the job id is the pid of the job's process group leader
        # (a copy of the script: dask-jobqueue removes its file once sbatch returns)
        "sbatch": f'cp "$1" {jobs}/script.$$\n'
        f"setsid sh {jobs}/script.$$ > {jobs}/out.$$ 2>&1 < /dev/null &\n"
        f'echo $! > {jobs}/$!\necho "Submitted batch job $!"\n',
        "squeue": f'for f in {jobs}/[0-9]*; do [ -e "$f" ] || continue; j=$(basename "$f"); '
        'kill -0 "$j" 2>/dev/null && echo "$j RUNNING None"; done; true\n',
        "scancel": f'for j in "$@"; do kill -TERM -- -"$j" 2>/dev/null; rm -f {jobs}/"$j"; '
        f'echo "$j" >> {tmp_path}/cancelled.txt; done; true\n',
    }
    for name, body in scripts.items():
        p = bin_dir / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return jobs


def test_tasks_in_flight_are_worker_threads_and_jobs_are_cancelled(tmp_path, monkeypatch):
    """One job of 2 cores as 1 worker process of 2 threads: 2 tasks in flight (the old code
    counted jobs x processes = 1). On the way out the job is cancelled and its worker ends."""
    jobs = local_batch_system(tmp_path, monkeypatch)
    cfg = ExecutionConfig(
        scheduler="jobqueue",
        timeout_s=120,
        cluster={
            "kind": "slurm",
            "jobs": 1,
            "cores": 2,
            "processes": 1,
            "memory": "1GB",
            "interface": "lo",
            "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
        },
    )
    with open_executor(cfg) as (ex, parallelism):
        assert parallelism == 2
        assert ex.submit(sum, [2, 3]).result(timeout=60) == 5
        job_ids = [p.name for p in jobs.iterdir() if p.name.isdigit()]
        assert len(job_ids) == 1
    assert (tmp_path / "cancelled.txt").read_text().split()[0] == job_ids[0]
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(int(job_ids[0]), 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        pytest.fail(f"the job's process {job_ids[0]} still runs after the executor closed")


@pytest.mark.slow
def test_a_lost_job_of_two_worker_processes_is_replaced(tmp_path, monkeypatch):
    """The job (2 worker processes) dies: dask's SpecCluster does not forget a lost job whose
    processes are named JOB-0, JOB-1 (so re-scaling alone submitted nothing and the task
    timed out); shardload drops the ended job, a replacement is submitted, work goes on."""
    import signal

    jobs = local_batch_system(tmp_path, monkeypatch)
    cfg = ExecutionConfig(
        scheduler="jobqueue",
        timeout_s=120,
        cluster={
            "kind": "slurm",
            "jobs": 1,
            "cores": 2,
            "processes": 2,
            "memory": "1GB",
            "interface": "lo",
            "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
        },
    )
    with open_executor(cfg) as (ex, parallelism):
        assert parallelism == 2
        assert ex.submit(sum, [1, 1]).result(timeout=60) == 2
        (first,) = [p.name for p in jobs.iterdir() if p.name.isdigit()]
        os.killpg(int(first), signal.SIGKILL)  # the node died
        (jobs / first).unlink()
        assert ex.submit(sum, [2, 3]).result(timeout=120) == 5  # on the replacement's workers
        now = [p.name for p in jobs.iterdir() if p.name.isdigit()]
        assert now and first not in now
    cancelled = (tmp_path / "cancelled.txt").read_text().split()
    assert set(now) <= set(cancelled)
