"""dask-jobqueue's side of a batch run, without a scheduler: cluster options, the job script a
run would submit (``--dry-run-jobs``), the cluster's shape, job states from the batch system,
and a job class that records its own submission (error and id)."""

from __future__ import annotations

import signal
import subprocess
import threading
from collections.abc import Mapping
from typing import Any

from shardload.errors import ConfigError, require

#: kind -> dask_jobqueue class name
CLUSTER_CLASSES = {
    "slurm": "SLURMCluster",
    "pbs": "PBSCluster",
    "lsf": "LSFCluster",
    "sge": "SGECluster",
    "htcondor": "HTCondorCluster",
    "oar": "OARCluster",
    "moab": "MoabCluster",
}
#: keys of the cluster (its scheduler), not of a job
CLUSTER_ONLY = (
    "dashboard_address",
    "host",
    "scheduler_options",
    "shared_temp_directory",
    "silence_logs",
    "name",
)
#: a placeholder scheduler address for a job script shown before any scheduler exists
DRY_RUN_ADDRESS = "tcp://<scheduler-address>:8786"


def split_options(cluster: Mapping[str, Any]) -> tuple[str, int, dict[str, Any]]:
    """``(kind, jobs, keyword arguments of the dask-jobqueue class)`` of an ``execution.cluster``.

    ``dashboard_address`` and ``host`` go into ``scheduler_options`` (where dask-jobqueue wants
    them; given directly, its constructor refuses them).
    """
    opts = dict(cluster)
    kind = str(opts.pop("kind", "")).lower()
    if kind not in CLUSTER_CLASSES:
        raise ConfigError(
            f"execution.cluster.kind: {kind!r}; choose one of {', '.join(sorted(CLUSTER_CLASSES))}"
        )
    jobs = int(opts.pop("jobs", 1))
    sched = dict(opts.pop("scheduler_options", None) or {})
    for key in ("dashboard_address", "host"):
        if key in opts:
            sched[key] = opts.pop(key)
    if sched:
        opts["scheduler_options"] = sched
    return kind, jobs, opts


def _import_dask_jobqueue() -> Any:
    """``import dask_jobqueue``, keeping this process's SIGINT handler: its ``runner`` module
    sets one at import that calls ``sys.exit()``, which turned Ctrl-C into exit status 0."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGINT) if main else None
    jq = require("dask_jobqueue", "hpc")
    if main and before is not None and signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)
    return jq


def sigint_is_dask_jobqueues() -> bool:
    return getattr(signal.getsignal(signal.SIGINT), "__module__", "") == "dask_jobqueue.runner"


def cluster_classes(kind: str) -> tuple[Any, Any]:
    jq = _import_dask_jobqueue()
    cluster_cls = getattr(jq, CLUSTER_CLASSES[kind])
    return cluster_cls, cluster_cls.job_cls


def job_script(cluster: Mapping[str, Any]) -> str:
    """The batch script dask-jobqueue would submit for one job of ``cluster`` (with a
    placeholder scheduler address). Starts nothing, submits nothing, writes nothing."""
    kind, _, opts = split_options(cluster)
    _, job_cls = cluster_classes(kind)
    job_opts = {k: v for k, v in opts.items() if k not in CLUSTER_ONLY}
    try:
        job = job_cls(scheduler=DRY_RUN_ADDRESS, name="<worker-name>", **job_opts)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"execution.cluster ({kind}): {exc}") from exc
    return str(job.job_script())


def dry_run_text(execution: Any) -> str:
    """What ``--dry-run-jobs`` prints for an :class:`~shardload.prep.config.ExecutionConfig`: the
    jobs, workers and threads a run would ask for, then the job script."""
    if execution.scheduler != "jobqueue":
        raise ConfigError(
            f"--dry-run-jobs: execution.scheduler is {execution.scheduler!r}; it shows the batch "
            "job script of scheduler: jobqueue (set execution.cluster too)"
        )
    kind = split_options(execution.cluster)[0]
    cluster_cls, job_cls = cluster_classes(kind)
    script = job_script(execution.cluster)
    jobs, processes, threads = job_shape(execution.cluster)
    return (
        f"# dask-jobqueue {cluster_cls.__name__}: {jobs} job(s) x {processes} worker "
        f"process(es) x {threads} thread(s) = {jobs * processes * threads} tasks in flight\n"
        f"# each job is submitted with `{job_cls.submit_command} SCRIPT` and cancelled with "
        f"`{job_cls.cancel_command} JOBID`; workers must arrive within "
        f"execution.timeout_s = {execution.timeout_s:g} s\n"
        f"# nothing was submitted or written\n{script.rstrip()}\n"
    )


def job_shape(cluster: Mapping[str, Any]) -> tuple[int, int, int]:
    """``(jobs, worker processes per job, threads per worker process)`` of ``cluster``."""
    kind, jobs, opts = split_options(cluster)
    _, job_cls = cluster_classes(kind)
    job_opts = {k: v for k, v in opts.items() if k not in CLUSTER_ONLY}
    job = job_cls(scheduler=DRY_RUN_ADDRESS, name="<worker-name>", **job_opts)
    return jobs, int(job.worker_processes), int(job.worker_process_threads)


def recording_job_class(base: type, errors: list[str], job_ids: list[str]) -> type:
    """``base`` whose ``start`` records the batch system's error of a failed submission (which
    dask-jobqueue only logs) and the id of every job it submitted."""

    class RecordingJob(base):  # type: ignore[misc, valid-type]
        async def start(self) -> None:
            try:
                await super().start()
            except Exception as exc:
                errors.append(_submission_message(exc))
                raise
            finally:
                if getattr(self, "job_id", None):
                    job_ids.append(str(self.job_id))

    RecordingJob.__name__ = RecordingJob.__qualname__ = f"Recording{base.__name__}"
    return RecordingJob


def _submission_message(exc: BaseException) -> str:
    """The useful part of dask-jobqueue's ``Command exited with non-zero exit code`` error:
    the command and what it wrote to stderr (else stdout)."""
    text = str(exc)
    if "Command:" not in text:
        return f"{type(exc).__name__}: {text}".strip()
    parts: dict[str, str] = {}
    key = ""
    for line in text.splitlines():
        if line.rstrip(":") in ("Command", "stdout", "stderr", "Exit code") and line.endswith(":"):
            key = line[:-1]
            continue
        if line.startswith("Exit code:"):
            parts["Exit code"] = line.split(":", 1)[1].strip()
            continue
        if key:
            parts[key] = (parts.get(key, "") + "\n" + line).strip()
    said = parts.get("stderr") or parts.get("stdout") or "(no output)"
    cmd = parts.get("Command", "?").split()
    return f"`{cmd[0] if cmd else '?'}` exited with code {parts.get('Exit code', '?')}: {said}"


# -- job states ------------------------------------------------------------------------------------
def job_states(kind: str, job_ids: list[str], *, timeout_s: float = 15) -> dict[str, str] | None:
    """``{job id: state}`` for the jobs the batch system still lists (a job missing from the
    answer has ended); None when the states cannot be asked (unsupported kind or the command
    failed). SLURM (``squeue``) is tested for real; PBS/SGE (``qstat``) and LSF (``bjobs``) are
    parsed from their documented default columns."""
    if not job_ids:
        return {}
    if kind == "slurm":
        cmd = ["squeue", "-h", "-o", "%i %T %r", "-j", ",".join(job_ids)]
    elif kind == "lsf":
        cmd = ["bjobs", "-noheader", "-o", "jobid stat", *job_ids]
    elif kind in ("pbs", "sge"):
        cmd = ["qstat"]
    else:
        return None
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if r.returncode != 0 and not (kind == "slurm" and "Invalid job id" in r.stderr):
        return None
    wanted = set(job_ids)
    states: dict[str, str] = {}
    for line in r.stdout.splitlines():
        f = line.split()
        if len(f) < 2:
            continue
        jid = f[0].split(".")[0]  # PBS: 1234.server
        if jid not in wanted:
            continue
        state = f[1] if kind in ("slurm", "lsf") else (f[4] if len(f) > 4 else "?")
        why = f[2] if kind == "slurm" and len(f) > 2 and f[2] not in ("None", "(null)") else ""
        states[jid] = state.lower() + (f" ({why})" if why else "")
    return states


def describe_jobs(job_ids: list[str], states: dict[str, str] | None) -> str:
    job_ids = sorted(set(job_ids), key=lambda j: (len(j), j))  # numeric order for numeric ids
    if not job_ids:
        return "no job submitted yet"
    if states is None:
        return f"jobs {', '.join(job_ids)} submitted"
    groups: dict[str, list[str]] = {}
    for jid in job_ids:
        groups.setdefault(states.get(jid, "ended"), []).append(jid)
    return "; ".join(
        f"job{'s' if len(ids) > 1 else ''} {', '.join(ids)} {state}"
        for state, ids in groups.items()
    )
