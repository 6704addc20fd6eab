"""A batch run: submit, wait (bounded, with a progress line), watch, cancel. See the package
docs (``shardload.prep.jobqueue``)."""

from __future__ import annotations

import contextlib
import logging
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor
from typing import Any

from shardload.errors import ClusterError, ConfigError, require
from shardload.prep.jobqueue.executor import CHATTY_LOGGERS, FailingExecutor, QuietSubmissionErrors
from shardload.prep.jobqueue.jobs import (
    cluster_classes,
    describe_jobs,
    job_states,
    recording_job_class,
    split_options,
)
from shardload.prep.jobqueue.signals import signals_unwind

log = logging.getLogger("shardload.jobqueue")

DEFAULT_TIMEOUT_S = 300.0


class JobqueueRun:
    """A dask-jobqueue cluster for one run: ``start`` submits, ``wait_for_workers`` waits with
    a timeout, ``watch`` replaces dead workers, ``close`` cancels every job."""

    def __init__(
        self,
        cluster: Mapping[str, Any],
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        poll_s: float = 1.0,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.kind, self.jobs, self.opts = split_options(cluster)
        self.timeout_s = float(timeout_s)
        self.poll_s = poll_s
        self.report = report or log.info
        self.errors: list[str] = []
        self.job_ids: list[str] = []
        self.cluster: Any = None
        self.client: Any = None
        self.executor: FailingExecutor | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.timings: dict[str, float] = {}
        self._filter = QuietSubmissionErrors()
        self._levels: dict[str, int] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        distributed = require("distributed", "hpc")
        cluster_cls, job_cls = cluster_classes(self.kind)
        t0 = time.perf_counter()
        logging.getLogger("tornado.application").addFilter(self._filter)
        if not logging.getLogger("shardload").isEnabledFor(logging.DEBUG):
            for name in CHATTY_LOGGERS:
                lg = logging.getLogger(name)
                self._levels[name] = lg.level
                lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
        recording = recording_job_class(job_cls, self.errors, self.job_ids)
        try:
            self.cluster = cluster_cls(job_cls=recording, **self.opts)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"execution.cluster ({self.kind}): {exc}") from exc
        self.client = distributed.Client(self.cluster)
        self.cluster.scale(jobs=self.jobs)
        self.timings["scheduler_up_s"] = time.perf_counter() - t0
        job = self.cluster._dummy_job
        self.processes, self.threads = int(job.worker_processes), int(job.worker_process_threads)
        log.info(
            "dask-jobqueue %s: %d job(s) x %d worker process(es) x %d thread(s); scheduler %s",
            self.kind,
            self.jobs,
            self.processes,
            self.threads,
            self.cluster.scheduler_address,
        )
        log.debug("job script:\n%s", self.cluster.job_script())

    @property
    def expected_workers(self) -> int:
        return self.jobs * self.processes

    @property
    def parallelism(self) -> int:
        """Worker threads of the whole cluster: jobs x processes x threads per process."""
        return self.jobs * self.processes * self.threads

    def workers_up(self) -> tuple[int, int]:
        """(worker processes connected, their threads)."""
        info = self.client.scheduler_info(n_workers=-1).get("workers", {})
        return len(info), sum(int(w.get("nthreads", 0)) for w in info.values())

    def _raise_submission_error(self) -> None:
        if self.errors:
            first = self.errors[0]
            more = (
                f" ({len(self.errors) - 1} more submission(s) failed)"
                if len(self.errors) > 1
                else ""
            )
            raise ClusterError(
                f"execution.cluster ({self.kind}): submitting a batch job failed{more}: {first}"
            )

    def wait_for_workers(self) -> None:
        """Wait until every worker is up (return), or ``timeout_s`` passed: with some workers
        up, go on with them (a warning names the missing ones); with none, raise. A failed
        submission raises at once, quoting the batch system."""
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        last_line, last_time = "", 0.0
        n = ended_polls = 0
        while True:
            self._raise_submission_error()
            n, _ = self.workers_up()
            if n >= self.expected_workers:
                self.timings["workers_up_s"] = time.perf_counter() - t0
                self.report(
                    f"jobqueue: {n}/{self.expected_workers} workers up after "
                    f"{self.timings['workers_up_s']:.1f} s ({self.parallelism} worker threads)"
                )
                return
            states = job_states(self.kind, list(self.job_ids))
            if n == 0 and self._all_ended(states):
                ended_polls += 1
                if ended_polls >= 3:  # not a race with a worker connecting right now
                    raise ClusterError(
                        f"execution.cluster ({self.kind}): every job ended before its worker "
                        f"connected (jobs {', '.join(self.job_ids)}); "
                        f"{self._job_output()}"
                    )
            else:
                ended_polls = 0
            line = (
                f"jobqueue: {n}/{self.expected_workers} workers up, "
                f"{describe_jobs(list(self.job_ids), states)}"
            )
            now = time.monotonic()
            if line != last_line or now - last_time >= 30:
                self.report(f"{line} (waiting up to {max(0.0, deadline - now):.0f} s more)")
                last_line, last_time = line, now
            if now >= deadline:
                break
            time.sleep(self.poll_s)
        self._raise_submission_error()
        states = job_states(self.kind, list(self.job_ids))
        what = describe_jobs(list(self.job_ids), states)
        if n > 0:
            log.warning(
                "jobqueue: only %d/%d workers up after %.0f s (%s); going on with them, the "
                "others join when their jobs start",
                n,
                self.expected_workers,
                self.timeout_s,
                what,
            )
            self.timings["workers_up_s"] = time.perf_counter() - t0
            return
        raise ClusterError(
            f"execution.cluster ({self.kind}): no worker arrived within execution.timeout_s = "
            f"{self.timeout_s:g} s ({what}). Check the queue, the job output "
            f"({self._log_hint()}) and that the jobs can reach this machine "
            f"({self.cluster.scheduler_address}; the interface key picks the network)."
        )

    def _all_ended(self, states: dict[str, str] | None) -> bool:
        submitted = len(set(self.job_ids))
        return states is not None and submitted >= self.jobs and not states

    def _job_output(self, limit: int = 1500) -> str:
        """The end of the first ended job's output files, or where to look for them."""
        from pathlib import Path

        folder = Path(self.opts.get("log_directory") or ".")
        for jid in self.job_ids:
            # SLURM/LSF: NAME-ID.err / .out; PBS/SGE: NAME.eID / .oID; SLURM default slurm-ID.out
            own = re.compile(rf"(?<![0-9]){re.escape(jid)}(?![0-9])")
            found = sorted(p for p in folder.glob(f"*{jid}*") if p.is_file() and own.search(p.name))
            texts = []
            for p in found:
                text = p.read_text(errors="replace").strip()
                if text:
                    texts.append(f"{p}:\n{text[-limit:]}")
            if texts:
                return "the job output says:\n" + "\n".join(texts)
        return f"see the job output ({self._log_hint()})"

    def _log_hint(self) -> str:
        d = self.opts.get("log_directory")
        if d:
            return f"log_directory {d}"
        return {
            "slurm": "slurm-JOBID.out in the folder prepare ran in",
            "pbs": "JOBNAME.oJOBID / .eJOBID in the folder prepare ran in",
            "lsf": "set log_directory to keep it",
        }.get(self.kind, "the batch system's default output file")

    def open_executor(self) -> FailingExecutor:
        self.executor = FailingExecutor(self.client.get_executor())
        self._watcher = threading.Thread(target=self._watch, name="shardload-jobqueue", daemon=True)
        self._watcher.start()
        return self.executor

    def _watch(self) -> None:
        """While tasks run: re-scale when workers went missing (dask-jobqueue closes the job of a
        lost worker and ``scale`` submits a new one); fail the run when no worker is left for
        ``timeout_s`` or a replacement cannot be submitted."""
        alone_since: float | None = None
        last_rescale = 0.0
        seen_errors = len(self.errors)
        while not self._stop.wait(max(self.poll_s, 2.0)):
            try:
                n, _ = self.workers_up()
            except Exception:  # the client is closing
                return
            now = time.monotonic()
            if n < self.expected_workers and now - last_rescale > 5:
                last_rescale = now
                with contextlib.suppress(Exception):
                    self._forget_ended_multiprocess_jobs()
                    self.cluster.scale(jobs=self.jobs)
            if len(self.errors) > seen_errors and n == 0:
                try:
                    self._raise_submission_error()
                except ClusterError as exc:
                    assert self.executor is not None
                    self.executor.fail(exc)
                    return
            if n > 0:
                alone_since = None
                continue
            alone_since = alone_since or now
            if now - alone_since > self.timeout_s:
                assert self.executor is not None
                self.executor.fail(
                    ClusterError(
                        f"execution.cluster ({self.kind}): every worker left and none came back "
                        f"within execution.timeout_s = {self.timeout_s:g} s "
                        f"({describe_jobs(list(self.job_ids), job_states(self.kind, list(self.job_ids)))}); "
                        "the finished blocks are kept: run again to resume"
                    )
                )
                return

    def _forget_ended_multiprocess_jobs(self) -> None:
        """A job of several worker processes whose processes all left and that the batch system
        no longer lists is dropped from the cluster, so that ``scale`` submits a replacement.
        (dask's SpecCluster does this itself only for jobs of one process: it matches a lost
        worker's name with the job's, and the processes of a job are named ``JOB-0``, ``JOB-1``.)
        """
        if self.processes < 2:
            return
        jobs = {
            name: str(getattr(job, "job_id", "") or "")
            for name, job in self.cluster.workers.items()
        }
        states = job_states(self.kind, [j for j in jobs.values() if j])
        if states is None:
            return
        info = self.client.scheduler_info(n_workers=-1).get("workers", {})
        names = {str(w.get("name", "")) for w in info.values()}
        for name, jid in jobs.items():
            if not jid or jid in states or any(n.startswith(f"{name}-") for n in names):
                continue
            log.warning(
                "jobqueue: job %s ended and its workers left; submitting a replacement", jid
            )
            self.cluster.loop.add_callback(self.cluster.workers.pop, name, None)

    def close(self) -> None:
        """Stop watching, close the client and the cluster (which cancels its jobs), then
        cancel every job id ever submitted, whatever state dask-jobqueue was left in."""
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(timeout=10)
        if self.client is not None:
            with contextlib.suppress(Exception):
                self.client.close(timeout=10)
        if self.cluster is not None:
            with contextlib.suppress(Exception):
                self.cluster.close(timeout=30)
        self.cancel_jobs()
        logging.getLogger("tornado.application").removeFilter(self._filter)
        for name, level in self._levels.items():
            logging.getLogger(name).setLevel(level)

    def cancel_jobs(self) -> None:
        ids = sorted(set(self.job_ids))
        if not ids or self.cluster is None:
            return
        cancel = getattr(self.cluster.job_cls, "cancel_command", None)
        if not cancel:
            return
        try:
            r = subprocess.run([*cancel.split(), *ids], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("jobqueue: could not cancel jobs %s: %s", ", ".join(ids), exc)
            return
        if r.returncode != 0 and self.kind == "slurm" and "Invalid job id" not in r.stderr:
            log.warning(
                "jobqueue: `%s %s` failed: %s", cancel, " ".join(ids), r.stderr.strip()[-500:]
            )


@contextlib.contextmanager
def open_jobqueue(
    cluster: Mapping[str, Any], *, timeout_s: float = DEFAULT_TIMEOUT_S
) -> Iterator[tuple[Executor, int]]:
    """Yield ``(executor, worker threads)`` of a dask-jobqueue cluster whose workers arrived;
    every job is cancelled on the way out, whatever the way out."""
    run = JobqueueRun(cluster, timeout_s=timeout_s)
    with signals_unwind():
        try:
            run.start()
            run.wait_for_workers()
            yield run.open_executor(), run.parallelism
        finally:
            run.close()
