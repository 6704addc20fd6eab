"""Running the write tasks of ``prepare``: every block not yet recorded goes to the executor,
each is recorded once its files are durable, and the statistics of every block are merged in
block order (saved now and then, so that a resumed run need not read every block again).
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import numpy as np

from shardload.manifest.core import ArraySpec
from shardload.prep.commit import BlockCommit
from shardload.prep.config import PrepareConfig
from shardload.prep.executor import open_executor, run_windowed
from shardload.prep.recorder import DurableRecorder
from shardload.prep.stats import STAT_FIELDS, OrderedMerge, Partial
from shardload.prep.stats.dated import stat_names
from shardload.prep.tasks import PrepareJob, run_task

log = logging.getLogger("shardload.prep.driver")  # the name users' logs have always shown


def run_blocks(
    job: PrepareJob,
    commit: BlockCommit,
    done: frozenset[int],
    row_bytes: int,
    progress: bool | None,
) -> OrderedMerge:
    """Write every block not ``done`` and record each once durable; the statistics of every
    block, merged in block order.

    Statistics are not in the progress records (for wide arrays, 6 float64 values per feature
    per block: 447 MB per one-sample block of a 9.3 M-feature grid, 48x its data). The driver
    merges them in block order as blocks are recorded, and saves what it merged
    (``_progress/stats.npz``: a prefix of blocks) at most once per ``16 x its size`` (and
    256 MiB) of data recorded. A resumed run starts from that prefix and recomputes the
    statistics of the recorded blocks past it from the source (reading, not writing). Every
    run merges the same partials in the same order: a resumed store's statistics equal a clean
    run's, bit for bit.
    """
    from tqdm.auto import tqdm

    merge = _load_stats(commit, job)
    restat = sorted(i for i in done if i >= merge.next)
    items = sorted([*commit.todo(), *restat])
    if restat:
        log.info("statistics of %d recorded block(s) are read again from the source", len(restat))
    stats_bytes = sum(
        _num_features(job.specs[_array(n)]) * 8 * len(STAT_FIELDS)
        for n in stat_names(job.specs, job.dated)
    )
    every = max(STATS_SAVE_FACTOR * stats_bytes, STATS_SAVE_BYTES)
    since = [0, merge.next]  # bytes recorded since the last save, prefix saved
    bar = tqdm(
        total=job.num_blocks,
        initial=len(done),
        unit="chunk",
        desc="prepare" if job.origin is None else "copy",
        disable=(not progress) if progress is not None else None,
    )

    def durable(res: dict[str, Any]) -> None:  # the block's files are durable: record it
        block = res["block"]
        if "record" in res:
            commit.record(block, res["record"])
            commit.recorded_files(block, res["paths"])
            bar.update(1)
        merge.add(block, res["stats"], res.get("notes"))
        _, a, b = job.block(block)
        since[0] += (b - a) * row_bytes
        if since[0] >= every and merge.next > since[1]:
            commit.write_state(STATS_STATE, _stats_fields(merge, job))
            since[:] = [0, merge.next]

    try:
        with contextlib.ExitStack() as stack:
            ex, parallelism = stack.enter_context(open_executor(job.config.execution))
            if job.defer_fsync:
                recorder = stack.enter_context(DurableRecorder(commit, durable, maxsize=8))
                on_result = lambda res: recorder.put(res["paths"], res)  # noqa: E731
            else:

                def on_result(res: dict[str, Any]) -> None:
                    commit.synced.update(res["paths"])
                    durable(res)

            todo = [i if i not in done else -i - 1 for i in items]
            window = max(2, 2 * parallelism)
            run_windowed(ex, run_task, job, todo, window=window, on_result=on_result)
    finally:
        bar.close()
    return merge


#: ``_progress/stats.npz``: the statistics merged over the first ``blocks`` blocks
STATS_STATE = "stats"
#: the statistics are saved at most once per this many bytes of blocks recorded, and per
#: this many times their own size
STATS_SAVE_BYTES = 256 << 20
STATS_SAVE_FACTOR = 16


def _num_features(spec: ArraySpec) -> int:
    return int(spec.shape[-1]) if len(spec.shape) >= 2 else 1


#: saved statistics: a block note (:meth:`OrderedMerge.notes`) is ``NOTE_PREFIX + key``
NOTE_PREFIX = "_notes/"
#: saved statistics: what else they depend on (a dated store's period, ``DatedStats.key``)
KEY_FIELD = "_key"


def _stats_fields(merge: OrderedMerge, job: PrepareJob) -> dict[str, np.ndarray]:
    fields = {"blocks": np.array(merge.next), KEY_FIELD: np.array(_stats_key(job))}
    for name, p in (merge.merged or {}).items():
        fields.update({f"{name}/{k}": v for k, v in p.fields().items()})  # + exact sums
    fields.update({f"{NOTE_PREFIX}{k}": v for k, v in merge.notes().items()})
    return fields


def _stats_key(job: PrepareJob) -> str:
    return "" if job.dated is None else job.dated.key()


def _load_stats(commit: BlockCommit, job: PrepareJob) -> OrderedMerge:
    """The statistics saved by an interrupted run (a prefix of recorded blocks), or none."""
    saved = commit.read_state(STATS_STATE)
    if not saved:
        return OrderedMerge()
    try:
        prefix = int(saved["blocks"])
        key = str(saved[KEY_FIELD]) if KEY_FIELD in saved else ""
        merged = {
            n: Partial.from_dict(
                {k: saved[f"{n}/{k}"] for k in (*STAT_FIELDS, "s1", "s2") if f"{n}/{k}" in saved}
            )
            for n in stat_names(job.specs, job.dated)
        }
    except (KeyError, ValueError, TypeError):
        log.warning("ignoring the saved statistics in %s: not of this store", commit.progress)
        return OrderedMerge()
    if key != _stats_key(job):
        log.info("ignoring the saved statistics in %s: of another period", commit.progress)
        return OrderedMerge()
    notes = {k[len(NOTE_PREFIX) :]: v for k, v in saved.items() if k.startswith(NOTE_PREFIX)}
    if not 0 < prefix <= job.num_blocks or not all(i in commit.done for i in range(prefix)):
        log.warning("ignoring the saved statistics in %s: blocks not recorded", commit.progress)
        return OrderedMerge()
    if any(p.count.shape != (_num_features(job.specs[_array(n)]),) for n, p in merged.items()):
        log.warning("ignoring the saved statistics in %s: not of these arrays", commit.progress)
        return OrderedMerge()
    return OrderedMerge(start=prefix, merged=merged, notes=notes)


def _array(stat_name: str) -> str:
    """The array of a statistics name (``x``, or ``x/tendency_1``)."""
    return stat_name.rsplit("/tendency_", 1)[0] if "/tendency_" in stat_name else stat_name


def workers_share_disk_cache(cfg: PrepareConfig) -> bool:
    """Whether the write tasks run on this machine (threads, local processes, a local dask
    cluster started here): then the driver can fsync the files they wrote, by path, and tasks
    defer their fsyncs to it. Workers elsewhere (a scheduler ``address``, an active client,
    dask-jobqueue) fsync their own files: an fsync here would not flush another host's cache."""
    from shardload.prep.executor import active_client, resolve_scheduler

    scheduler = resolve_scheduler(cfg.execution)
    if scheduler in ("sync", "threads", "processes"):
        return True
    return scheduler == "distributed" and not cfg.execution.address and active_client() is None
