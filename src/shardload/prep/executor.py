"""One ``concurrent.futures.Executor`` for every way of running write tasks.

- ``auto`` (default): the active ``distributed.Client`` of this process if there is one (a
  notebook's ``Client()``), else ``threads``.
- ``threads``: a thread pool in this process (numpy, codecs and file I/O release the GIL).
- ``processes``: a process pool (spawned, so HDF5/netCDF handles are never inherited).
- ``distributed``: a dask.distributed cluster -- ``address`` of a running scheduler, else the
  active client, else a new ``LocalCluster`` of ``num_workers`` processes -- through
  ``Client.get_executor()``. A client shardload did not create is left open.
- ``jobqueue``: an HPC cluster from dask-jobqueue (``cluster: {kind: slurm|pbs|lsf|sge|htcondor,
  jobs: N, ...}``; the other keys go to the cluster class, e.g. cores, memory, queue, walltime):
  see :mod:`shardload.prep.jobqueue` (bounded wait for workers, submission errors quoted, every job
  cancelled on the way out). Parallelism is the cluster's worker threads.
- ``sync``: run in the calling thread (debugging).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import sys
from collections.abc import Callable, Iterator
from concurrent.futures import Executor, Future, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from shardload.errors import ConfigError, require
from shardload.prep.config import ExecutionConfig
from shardload.prep.dask_logs import CancelledResultRace

log = logging.getLogger(__name__)


class SyncExecutor(Executor):
    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        f: Future[Any] = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except BaseException as exc:
            f.set_exception(exc)
        return f


def default_workers() -> int:
    return max(
        1,
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
    )


def active_client() -> Any | None:
    """The ``distributed.Client`` this process made current (e.g. ``Client()`` in a notebook),
    or None. Never imports distributed: a process with a client has imported it."""
    distributed = sys.modules.get("distributed")
    if distributed is None:
        return None
    try:
        return distributed.default_client()
    except ValueError:  # no client
        return None


def resolve_scheduler(cfg: ExecutionConfig) -> str:
    """The scheduler a run uses: ``auto`` becomes ``distributed`` with an active client, else
    ``threads``."""
    if cfg.scheduler != "auto":
        return cfg.scheduler
    return "distributed" if active_client() is not None else "threads"


@contextmanager
def open_executor(cfg: ExecutionConfig) -> Iterator[tuple[Executor, int]]:
    """Yield ``(executor, parallelism)``; tear down on exit what was created here."""
    n = int(cfg.num_workers or default_workers())
    scheduler = resolve_scheduler(cfg)
    if scheduler == "sync":
        yield SyncExecutor(), 1
    elif scheduler == "threads":
        with ThreadPoolExecutor(max_workers=n, thread_name_prefix="shardload-write") as ex:
            yield ex, n
    elif scheduler == "processes":
        with ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
            yield ex, n
    elif scheduler == "distributed":
        distributed = require("distributed", "distributed")
        own = True
        if cfg.address:
            client = distributed.Client(cfg.address)
            cluster = None
        elif active_client() is not None:
            client, cluster, own = active_client(), None, False
            log.info("using the active dask.distributed client %s", client)
        else:
            with _no_sigint():  # the workers it starts ignore Ctrl-C: this process stops them
                cluster = distributed.LocalCluster(
                    n_workers=n,
                    threads_per_worker=cfg.threads_per_worker,
                    processes=True,
                    dashboard_address=None,
                    # its HTTP server (health, metrics) on a free port, not 8787: a second
                    # cluster on this machine (another prepare) warned "Port 8787 is already in use"
                    scheduler_kwargs={"dashboard_address": ":0"},
                    # the workers' log level: `shardload -q` asks for errors only (cli/app.py)
                    silence_logs=_worker_log_level(),
                )
                client = distributed.Client(cluster)
                # set in each worker process too: its loggers' levels come from more places
                # (config it was sent, silence_logs) than the environment it inherited
                client.run(_set_distributed_log_level, _worker_log_level())
        tornado_log = logging.getLogger("tornado.application")
        quiet = CancelledResultRace()
        tornado_log.addFilter(quiet)
        try:
            info = client.scheduler_info().get("workers", {})
            workers = len(info) or n
            threads = sum(int(w.get("nthreads", 0)) for w in info.values())
            log.info("dask.distributed: %s with %d worker(s)", client.scheduler.address, workers)
            yield client.get_executor(), (threads or workers * cfg.threads_per_worker)
        except KeyboardInterrupt:
            # the workers are stopped below: their nanny's "still alive after 4 s, killing"
            # warnings are not news after a Ctrl-C
            logging.getLogger("distributed").setLevel(logging.ERROR)
            if cluster is not None:  # ours: its workers and nannies are stopped below too
                _silence_cluster(client)
            raise
        finally:
            if own:
                client.close()
            if cluster is not None:
                cluster.close()
            tornado_log.removeFilter(quiet)
    elif scheduler == "jobqueue":
        from shardload.prep.jobqueue import open_jobqueue

        with open_jobqueue(cfg.cluster, timeout_s=cfg.timeout_s) as (ex, threads):
            yield ex, threads
    else:  # validated in config, kept for direct callers
        raise ConfigError(f"execution.scheduler: unknown {scheduler!r}")


@contextmanager
def _no_sigint() -> Iterator[None]:
    """SIGINT ignored for the block (in the main thread): processes started meanwhile inherit
    it, so a Ctrl-C reaches this process alone (once) instead of also every dask worker, each
    printing its traceback (issue #26 row 8)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def run_windowed(
    ex: Executor,
    task: Callable[[Any, int], Any],
    job: Any,
    todo: Iterator[int] | list[int],
    *,
    window: int,
    on_result: Callable[[Any], None],
) -> None:
    """Submit ``task(job, i)`` for each ``i`` of ``todo`` with at most ``window`` in flight, and
    hand each result to ``on_result`` in the calling thread as it finishes (memory stays bounded
    by the window). On any error, tasks not yet started are cancelled and the error is raised."""
    from concurrent.futures import FIRST_COMPLETED, wait

    pending: set[Future[Any]] = set()
    it = iter(todo)
    try:
        while True:
            while len(pending) < window:
                i = next(it, None)
                if i is None:
                    break
                pending.add(ex.submit(task, job, i))
            if not pending:
                break
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for fut in finished:
                on_result(fut.result())
    except BaseException:
        for f in pending:
            f.cancel()
        raise


def _worker_log_level() -> int:
    """Level of the LocalCluster workers' ``distributed`` loggers: ``DASK_LOGGING__DISTRIBUTED``
    (``shardload -q`` sets ``error``), at least WARNING (their INFO lines are not news)."""
    name = os.environ.get("DASK_LOGGING__DISTRIBUTED", "warning").strip().upper()
    level = logging.getLevelName(name)
    return max(logging.WARNING, level) if isinstance(level, int) else logging.WARNING


def _silence_cluster(client: Any) -> None:
    """After a Ctrl-C: the cluster's worker and nanny processes log nothing more. Stopping a
    cluster mid-run makes a worker whose scheduler closed first log "Failed to communicate with
    scheduler during heartbeat" with its traceback (errors, shown even under ``-q``)."""
    for nanny in (False, True):
        try:
            client.run(_set_distributed_log_level, logging.CRITICAL + 1, nanny=nanny)
        except Exception as exc:  # a worker already gone: nothing more to silence there
            log.debug("silencing the cluster's logs after a Ctrl-C: %s", exc)


def _set_distributed_log_level(level: int) -> None:
    """In a dask worker process: ``distributed`` and each of its loggers at ``level``."""
    names = [n for n in logging.root.manager.loggerDict if n.startswith("distributed")]
    for name in ["distributed", *names]:
        logging.getLogger(name).setLevel(level)
