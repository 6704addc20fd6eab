"""Batch-system workers through dask-jobqueue: submit, wait (bounded), watch, cancel.

dask-jobqueue starts a dask scheduler in this process and submits one batch job per
``cluster.scale(jobs=N)`` slot; each job runs ``processes`` dask workers of
``cores / processes`` threads. What it leaves to its caller, and this module does:

- **Bounded waiting.** ``wait_for_workers`` waits forever by default; here the wait is at most
  ``execution.timeout_s``, with a progress line ("2/4 workers up, jobs 1234, 1235 pending").
- **Submission errors are errors.** ``cluster.scale()`` only *logs* a failing ``sbatch`` /
  ``qsub`` / ``bsub``; a job class that records the error of its own submission lets the wait
  raise a :class:`~shardload.errors.ClusterError` that quotes the batch system's message.
- **Jobs are cancelled on every exit path**: success, error, Ctrl-C and (while a run holds the
  cluster, from the main thread) SIGTERM, which is turned into ``SystemExit(143)`` for the
  duration. After dask-jobqueue's own close, every job id it ever submitted is cancelled again
  with the cancel command (``scancel``, ``qdel``, ``bkill``), so none is left queued.
- **Workers that die are replaced** (the cluster is re-scaled to ``jobs``) and the scheduler
  re-runs their tasks elsewhere; a block is recorded once, by the driver, when its task returns.
  If no worker is left for ``timeout_s``, the run fails instead of waiting forever.
- **Dry run**: :func:`job_script` is the script dask-jobqueue would submit, made without a
  scheduler, a submission or a file written.
"""

from shardload.prep.jobqueue.jobs import (
    CLUSTER_CLASSES,
    dry_run_text,
    job_script,
    job_shape,
    job_states,
    split_options,
)
from shardload.prep.jobqueue.run import DEFAULT_TIMEOUT_S, JobqueueRun, open_jobqueue
from shardload.prep.jobqueue.signals import signals_unwind

__all__ = [
    "CLUSTER_CLASSES",
    "DEFAULT_TIMEOUT_S",
    "JobqueueRun",
    "dry_run_text",
    "job_script",
    "job_shape",
    "job_states",
    "open_jobqueue",
    "signals_unwind",
    "split_options",
]
