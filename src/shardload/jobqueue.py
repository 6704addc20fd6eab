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

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Executor, Future
from typing import Any

from .errors import ClusterError, ConfigError, require

log = logging.getLogger(__name__)

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
CLUSTER_ONLY = ("dashboard_address", "host", "scheduler_options", "shared_temp_directory",
                "silence_logs", "name")  # fmt: skip
#: a placeholder scheduler address for a job script shown before any scheduler exists
DRY_RUN_ADDRESS = "tcp://<scheduler-address>:8786"
DEFAULT_TIMEOUT_S = 300.0


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


def _sigint_is_dask_jobqueues() -> bool:
    return getattr(signal.getsignal(signal.SIGINT), "__module__", "") == "dask_jobqueue.runner"


def _classes(kind: str) -> tuple[Any, Any]:
    jq = _import_dask_jobqueue()
    cluster_cls = getattr(jq, CLUSTER_CLASSES[kind])
    return cluster_cls, cluster_cls.job_cls


def job_script(cluster: Mapping[str, Any]) -> str:
    """The batch script dask-jobqueue would submit for one job of ``cluster`` (with a
    placeholder scheduler address). Starts nothing, submits nothing, writes nothing."""
    kind, _, opts = split_options(cluster)
    _, job_cls = _classes(kind)
    job_opts = {k: v for k, v in opts.items() if k not in CLUSTER_ONLY}
    try:
        job = job_cls(scheduler=DRY_RUN_ADDRESS, name="<worker-name>", **job_opts)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"execution.cluster ({kind}): {exc}") from exc
    return str(job.job_script())


def dry_run_text(execution: Any) -> str:
    """What ``--dry-run-jobs`` prints for an :class:`~shardload.config.ExecutionConfig`: the
    jobs, workers and threads a run would ask for, then the job script."""
    if execution.scheduler != "jobqueue":
        raise ConfigError(
            f"--dry-run-jobs: execution.scheduler is {execution.scheduler!r}; it shows the batch "
            "job script of scheduler: jobqueue (set execution.cluster too)"
        )
    kind = split_options(execution.cluster)[0]
    cluster_cls, job_cls = _classes(kind)
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
    _, job_cls = _classes(kind)
    job_opts = {k: v for k, v in opts.items() if k not in CLUSTER_ONLY}
    job = job_cls(scheduler=DRY_RUN_ADDRESS, name="<worker-name>", **job_opts)
    return jobs, int(job.worker_processes), int(job.worker_process_threads)


def _recording_job_class(base: type, errors: list[str], job_ids: list[str]) -> type:
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


def _describe_jobs(job_ids: list[str], states: dict[str, str] | None) -> str:
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


# -- the run -------------------------------------------------------------------------------------
class _QuietSubmissionErrors(logging.Filter):
    """Drops the traceback tornado logs for a failed submission (dask-jobqueue raises it in a
    callback nobody awaits): the run reports the same error once, as a ClusterError."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        return not (isinstance(exc, RuntimeError) and "Command exited with non-zero" in str(exc))


#: distributed's INFO chatter (scheduler start, client connections, worker retirement) drowns
#: the progress line; kept at WARNING during a run unless shardload logs at DEBUG (-vv)
_CHATTY = ("distributed.scheduler", "distributed.core", "distributed.http.proxy")


class _FailingExecutor(Executor):
    """The client's executor, with futures a watchdog can fail (so the driver never waits on a
    task no worker will ever run)."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.outstanding: set[Future[Any]] = set()
        self.lock = threading.Lock()
        self.failure: BaseException | None = None

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        outer: Future[Any] = Future()
        with self.lock:
            if self.failure is not None:
                outer.set_exception(self.failure)
                return outer
            self.outstanding.add(outer)
        inner = self.inner.submit(fn, *args, **kwargs)

        def done(f: Future[Any]) -> None:
            with self.lock:
                self.outstanding.discard(outer)
            if outer.done():
                return
            if f.cancelled():
                outer.cancel()
            elif f.exception() is not None:
                outer.set_exception(f.exception())
            else:
                outer.set_result(f.result())

        inner.add_done_callback(done)
        return outer

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            self.failure = exc
            pending = list(self.outstanding)
            self.outstanding.clear()
        for f in pending:
            if not f.done():
                with contextlib.suppress(Exception):
                    f.set_exception(exc)

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self.inner.shutdown(wait=wait, cancel_futures=cancel_futures)


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
        self.executor: _FailingExecutor | None = None
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self.timings: dict[str, float] = {}
        self._filter = _QuietSubmissionErrors()
        self._levels: dict[str, int] = {}

    # -- lifecycle --------------------------------------------------------------------------
    def start(self) -> None:
        distributed = require("distributed", "hpc")
        cluster_cls, job_cls = _classes(self.kind)
        t0 = time.perf_counter()
        logging.getLogger("tornado.application").addFilter(self._filter)
        if not logging.getLogger("shardload").isEnabledFor(logging.DEBUG):
            for name in _CHATTY:
                lg = logging.getLogger(name)
                self._levels[name] = lg.level
                lg.setLevel(max(lg.getEffectiveLevel(), logging.WARNING))
        recording = _recording_job_class(job_cls, self.errors, self.job_ids)
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
            self.kind, self.jobs, self.processes, self.threads, self.cluster.scheduler_address,
        )  # fmt: skip
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
                self.report(f"jobqueue: {n}/{self.expected_workers} workers up")
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
                f"{_describe_jobs(list(self.job_ids), states)}"
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
        what = _describe_jobs(list(self.job_ids), states)
        if n > 0:
            log.warning(
                "jobqueue: only %d/%d workers up after %.0f s (%s); going on with them, the "
                "others join when their jobs start", n, self.expected_workers, self.timeout_s, what,
            )  # fmt: skip
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
            found = sorted(
                p
                for p in folder.glob(f"*{jid}*")
                if p.is_file() and p.suffix in (".err", ".out", "")
            ) or sorted(p for p in folder.glob(f"slurm-{jid}.out") if p.is_file())
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

    def open_executor(self) -> _FailingExecutor:
        self.executor = _FailingExecutor(self.client.get_executor())
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
                        f"({_describe_jobs(list(self.job_ids), job_states(self.kind, list(self.job_ids)))}); "
                        "the finished blocks are kept: run again to resume"
                    )
                )
                return

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
def signals_unwind() -> Iterator[None]:
    """While inside, SIGTERM raises ``SystemExit(143)`` in the main thread so that ``finally``
    blocks run (and cancel the jobs), and Ctrl-C raises ``KeyboardInterrupt`` (not the
    ``sys.exit()`` of status 0 that importing dask_jobqueue installs); the previous handlers
    are put back on exit. Outside the main thread (no handlers there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous_int = signal.getsignal(signal.SIGINT)
    if _sigint_is_dask_jobqueues():
        signal.signal(signal.SIGINT, signal.default_int_handler)
    previous = signal.getsignal(signal.SIGTERM)

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise SystemExit(128 + signum)

    if previous is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        if previous is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, previous)
        if previous_int is not None:
            signal.signal(signal.SIGINT, previous_int)


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
