"""The jobqueue scheduler without a real batch system: the job scripts dask-jobqueue generates
(``--dry-run-jobs``; PBS and LSF are not packaged in Debian, so their scripts are what we can
test), submission errors and timeouts against fake ``sbatch`` / ``squeue`` / ``scancel``
commands, and the shape of the cluster. The real SLURM tests are tests/integration/test_slurm.py.
"""

from __future__ import annotations

import logging
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from shardload.cli.app import main
from shardload.errors import ClusterError, ConfigError
from shardload.prep.config import ExecutionConfig, load_config

pytest.importorskip("dask_jobqueue")
pytest.importorskip("distributed")

from shardload.prep.jobqueue import JobqueueRun, job_shape, open_jobqueue

CLUSTERS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "slurm": (
        {
            "kind": "slurm",
            "jobs": 4,
            "cores": 8,
            "processes": 2,
            "memory": "32GB",
            "walltime": "02:00:00",
            "queue": "compute",
            "account": "clim42",
            "job_extra_directives": ["--gres=gpu:1"],
            "log_directory": "/scratch/logs",
        },
        [
            "#SBATCH -p compute",
            "#SBATCH -A clim42",
            "#SBATCH -n 1",
            "#SBATCH --cpus-per-task=8",
            "#SBATCH --mem=30G",
            "#SBATCH -t 02:00:00",
            "#SBATCH --gres=gpu:1",
            "#SBATCH -e /scratch/logs/dask-worker-%J.err",
            "--nworkers 2",
            "--nthreads 4",
        ],
    ),
    "pbs": (
        {
            "kind": "pbs",
            "jobs": 2,
            "cores": 24,
            "processes": 4,
            "memory": "100GB",
            "walltime": "01:00:00",
            "queue": "regular",
            "account": "P12345",
            "resource_spec": "select=1:ncpus=24:mem=100GB",
        },
        [
            "#PBS -q regular",
            "#PBS -A P12345",
            "#PBS -l select=1:ncpus=24:mem=100GB",
            "#PBS -l walltime=01:00:00",
            "--nworkers 4",
            "--nthreads 6",
        ],
    ),
    "lsf": (
        {
            "kind": "lsf",
            "jobs": 3,
            "queue": "normal",
            "project": "climate",
            "walltime": "02:00",
            "cores": 16,
            "processes": 4,
            "memory": "64GB",
            "job_extra_directives": ['-R "select[mem>64000]"'],
            "local_directory": "/scratch/$USER",
        },
        [
            "#BSUB -q normal",
            '#BSUB -P "climate"',
            "#BSUB -n 16",
            "#BSUB -W 02:00",
            '#BSUB -R "select[mem>64000]"',
            "--local-directory /scratch/$USER",
            "--nworkers 4",
            "--nthreads 4",
        ],
    ),
    "sge": (
        {
            "kind": "sge",
            "jobs": 2,
            "cores": 4,
            "processes": 1,
            "memory": "16GB",
            "queue": "all.q",
            "walltime": "01:00:00",
            "resource_spec": "h_vmem=16G",
        },
        ["#$ -q all.q", "#$ -l h_vmem=16G", "#$ -l h_rt=01:00:00", "--nthreads 4"],
    ),
}


def write_prepare_config(tmp_path: Path, execution: Any) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "source": {"paths": ["missing.nc"]},
                "sample_dims": ["sample"],
                "arrays": {"x": ["a"]},
                "out": "store",
                "execution": execution,
            }
        )
    )
    return path


@pytest.mark.parametrize("kind", list(CLUSTERS))
def test_dry_run_jobs_prints_the_script_and_writes_nothing(tmp_path, capsys, kind):
    cluster, expected = CLUSTERS[kind]
    path = write_prepare_config(tmp_path, {"scheduler": "jobqueue", "cluster": cluster})
    # the source does not exist: the dry run reads no source, submits and writes nothing
    assert main(["prepare", str(path), "--dry-run-jobs"]) == 0
    out = capsys.readouterr().out
    for line in expected:
        assert line in out, (line, out)
    jobs, processes, threads = job_shape(cluster)
    assert f"{jobs} job(s) x {processes} worker process(es) x {threads} thread(s)" in out
    assert f"= {jobs * processes * threads} tasks in flight" in out
    assert "distributed.cli.dask_worker tcp://<scheduler-address>:8786" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]


def test_dry_run_jobs_for_compute(tmp_path, capsys):
    cluster, expected = CLUSTERS["slurm"]
    path = tmp_path / "attrs.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "source": {"paths": ["cube.zarr"], "variable": "amp"},
                "attributes": {"a": {"function": "shardload.attributes:envelope"}},
                "out": "attrs",
                "execution": {"scheduler": "jobqueue", "cluster": cluster},
            }
        )
    )
    assert main(["compute", str(path), "--dry-run-jobs"]) == 0
    out = capsys.readouterr().out
    assert all(line in out for line in expected), out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attrs.yaml"]


def test_dry_run_jobs_needs_scheduler_jobqueue(tmp_path, capsys):
    path = write_prepare_config(tmp_path, "threads")
    assert main(["prepare", str(path), "--dry-run-jobs"]) == 2
    assert "scheduler is 'threads'" in capsys.readouterr().err


def test_parallelism_is_worker_threads():
    # 4 jobs x 2 processes x (8 cores / 2) threads: 32 tasks in flight, not jobs x processes
    assert job_shape(CLUSTERS["slurm"][0]) == (4, 2, 4)
    assert job_shape({"kind": "pbs", "jobs": 3, "cores": 6, "memory": "8GB"})[0] == 3


def test_timeout_and_cluster_keys_validated_before_any_io(tmp_path):
    with pytest.raises(ConfigError, match=r"execution.timeout_s"):
        load_config(
            write_prepare_config(
                tmp_path, {"scheduler": "jobqueue", "timeout_s": 0, "cluster": {"kind": "slurm"}}
            )
        )
    cfg = load_config(
        write_prepare_config(
            tmp_path, {"scheduler": "jobqueue", "timeout_s": 30, "cluster": {"kind": "slurm"}}
        )
    )
    assert cfg.execution.timeout_s == 30
    assert load_config(write_prepare_config(tmp_path, "threads")).execution.timeout_s == 300
    # compute: the same models, the same "did you mean"
    from shardload.blockwise.config import load_compute_config

    raw = {
        "source": {"paths": ["cube.zarr"], "variable": "amp"},
        "attributes": {"a": {"function": "shardload.attributes:envelope"}},
        "out": "attrs",
        "execution": {"scheduler": "jobqueue", "cluster": {"kind": "slurm", "queu": "x"}},
    }
    with pytest.raises(ConfigError, match=r"execution.cluster.queu.*did you mean 'queue'"):
        load_compute_config(raw)
    raw["execution"] = {"scheduler": "jobqueue"}
    with pytest.raises(ConfigError, match=r"execution.cluster.*needs a cluster"):
        load_compute_config(raw)
    raw["execution"] = {"num_workers": 2}
    assert load_compute_config(raw).execution.scheduler == "threads"


def test_importing_dask_jobqueue_keeps_ctrl_c_an_interrupt():
    """dask_jobqueue's runner module sets a SIGINT handler that calls sys.exit() (status 0)."""
    code = (
        "import signal\n"
        "from shardload.prep.jobqueue.jobs import cluster_classes\n"
        "from shardload.prep.jobqueue import signals_unwind\n"
        "before = signal.getsignal(signal.SIGINT)\n"
        "cluster_classes('slurm')\n"
        "assert signal.getsignal(signal.SIGINT) is before, signal.getsignal(signal.SIGINT)\n"
        "import dask_jobqueue.runner as r\n"
        "signal.signal(signal.SIGINT, lambda *_: __import__('sys').exit())\n"
        "signal.getsignal(signal.SIGINT).__module__ = 'dask_jobqueue.runner'\n"
        "with signals_unwind():\n"
        "    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler\n"
        "print('ok')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "ok", res.stderr


# -- fake batch commands -----------------------------------------------------------------------
def fake_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sbatch: str) -> Path:
    """``sbatch``, ``squeue`` and ``scancel`` shell scripts first on PATH; scancel appends its
    arguments to ``cancelled.txt``, squeue lists every submitted job as PENDING."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scripts = {
        "sbatch": sbatch,
        "squeue": f'cat {tmp_path}/submitted.txt 2>/dev/null | sed "s/$/ PENDING Priority/"\n',
        "scancel": f'echo "$@" >> {tmp_path}/cancelled.txt\n',
    }
    for name, body in scripts.items():
        p = bin_dir / name
        p.write_text("#!/bin/sh\n" + body)
        p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    return bin_dir


SLURM = {
    "kind": "slurm",
    "jobs": 2,
    "cores": 1,
    "memory": "1GB",
    "interface": "lo",
    "scheduler_options": {"dashboard_address": "127.0.0.1:0"},
}


def test_submission_error_quotes_the_batch_system(tmp_path, monkeypatch):
    fake_commands(
        tmp_path,
        monkeypatch,
        'echo "sbatch: error: Batch job submission failed: '
        'Invalid account or account/partition combination specified" >&2\nexit 1\n',
    )
    t0 = time.perf_counter()
    with (
        pytest.raises(ClusterError, match=r"sbatch.*exited with code 1.*Invalid account"),
        open_jobqueue(SLURM, timeout_s=60),
    ):
        pytest.fail("no worker can have arrived")
    assert time.perf_counter() - t0 < 30  # not the 60 s timeout


def test_timeout_names_the_jobs_and_cancels_them(tmp_path, monkeypatch, caplog):
    counter = tmp_path / "submitted.txt"
    fake_commands(
        tmp_path,
        monkeypatch,
        f"exec 9>{tmp_path}/lock; flock 9\n"
        f"n=$((7 + $(cat {counter} 2>/dev/null | wc -l)))\necho $n >> {counter}\n"
        'echo "Submitted batch job $n"\n',
    )
    caplog.set_level(logging.INFO, logger="shardload.jobqueue")
    run = JobqueueRun(SLURM, timeout_s=3, poll_s=0.2)
    t0 = time.perf_counter()
    with pytest.raises(
        ClusterError,
        match=r"no worker arrived within execution.timeout_s = 3 s "
        r"\(jobs 7, 8 pending \(Priority\)\)",
    ):
        try:
            run.start()
            run.wait_for_workers()
        finally:
            run.close()
    assert time.perf_counter() - t0 < 30
    assert "0/2 workers up, jobs 7, 8 pending (Priority)" in caplog.text
    cancelled = (tmp_path / "cancelled.txt").read_text().split()
    assert sorted(set(cancelled)) == ["7", "8"]


def test_execution_config_default_timeout():
    assert ExecutionConfig().timeout_s == 300


@pytest.mark.parametrize(
    ("kind", "command", "output", "expected"),
    [
        (
            "slurm",
            "squeue",
            "12 PENDING Priority\n13 RUNNING None\n",
            {"12": "pending (Priority)", "13": "running"},
        ),
        (
            "pbs",
            "qstat",
            "Job id            Name             User    Time Use S Queue\n"
            "----------------  ---------------- ------  -------- - -----\n"
            "12.pbs01          dask-worker      ana     0        Q workq\n"
            "99.pbs01          other            bob     0        R workq\n",
            {"12": "q"},
        ),
        ("lsf", "bjobs", "12 PEND\n13 RUN\n", {"12": "pend", "13": "run"}),
        (
            "sge",
            "qstat",
            "job-ID prior   name       user  state submit/start at     queue\n"
            "-----------------------------------------------------------------\n"
            "     12 0.55500 dask-worke ana   qw    11/23/2026 06:00:00\n",
            {"12": "qw"},
        ),
    ],
)
def test_job_states_from_the_batch_systems_listing(
    tmp_path, monkeypatch, kind, command, output, expected
):
    """A job missing from the listing has ended (13 for PBS/SGE); other users' jobs are ignored."""
    from shardload.prep.jobqueue import job_states

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    p = bin_dir / command
    p.write_text(f"#!/bin/sh\ncat <<'EOF'\n{output}EOF\n")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:{__import__('os').environ['PATH']}")
    assert job_states(kind, ["12", "13"]) == expected
    assert job_states("htcondor", ["12"]) is None  # not asked: the line says "submitted"
