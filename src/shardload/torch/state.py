"""Where an iteration stands: rank and world, the epoch of each pass, and the one resume state.

Three things decide what a process of a :class:`~shardload.torch.StreamingDataset` reads: its
rank and world, the epoch, and a resume state (if any). They are decided in the main process
and reach DataLoader workers whatever the start method:

- rank and world (:func:`main_rank_world`): ``rank=``/``world_size=`` if given, else
  ``torch.distributed`` when initialised, else torchrun's ``RANK``/``WORLD_SIZE``, else one
  process (0, 1). Forked workers resolve them as the main process does (they inherit its
  memory); spawned and forkserver workers get the main process's answer in the pickled dataset
  (:meth:`StreamingDataset.__getstate__` runs in the main process as the DataLoader starts
  them). A worker that has neither raises :class:`~shardload.errors.StateError`.
- epoch and resume state (:class:`Channel`): a small shared-memory buffer, shared by fork and by
  pickling to spawned workers, so ``set_epoch`` and ``load_state_dict`` reach persistent
  workers too. It holds the epoch set last, the pending resume state, and a pass counter: every
  new pass over the dataset (an ``iter()`` in the main process, or a new set of workers'
  ``iter()``) is the next epoch unless ``set_epoch`` / ``load_state_dict`` came since.

One resume-state shape serves every loader (:func:`rank_state`, :func:`worker_state`,
:func:`check_state`): ``version``, ``dataset`` (store and selection fingerprint),
``fingerprint`` (plan options), ``seed``, ``batch_size`` and either a rank's position
(``kind="rank"``: :class:`~shardload.plan.resume.EpochState`'s fields; what
``StreamingDataset.state_dict()`` and ``StreamingDataLoader`` save) or a worker's
(``kind="worker"``: what torchdata's ``StatefulDataLoader`` asks of each worker).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import secrets
from collections.abc import Mapping
from multiprocessing import context as mp_context
from typing import Any

import numpy as np
import torch

from shardload.errors import StateError
from shardload.plan.epoch import EpochPlan
from shardload.plan.resume import EpochState

STATE_VERSION = 1
_SPEC_BYTES = 1 << 16
# Channel integers
_PASS, _PASS_ID, _SHIFT, _UNCOUNTED = range(4)
_INTS = 4
#: the start method of the channel's lock until a spawned worker needs another (Channel)
_LOCK_START = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"

WORKER_KEYS = ("epoch", "leg", "worker", "num_workers", "rank_world", "worker_batches")


# -- rank and world -----------------------------------------------------------------------------
def dist_rank_world() -> tuple[int, int] | None:
    """``torch.distributed``'s rank and world when a process group is initialised."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


def env_rank_world() -> tuple[int, int] | None:
    """torchrun's (and Lightning's, SLURM launchers'...) ``RANK`` / ``WORLD_SIZE``, if both set."""
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:
        return None
    try:
        r, w = int(rank), int(world)
    except ValueError as exc:
        raise StateError(f"RANK={rank!r} / WORLD_SIZE={world!r} are not integers") from exc
    if not 0 <= r < w:
        raise StateError(f"RANK={r} is not within 0..WORLD_SIZE-1 (WORLD_SIZE={w})")
    return r, w


def main_rank_world(explicit: tuple[int, int] | None) -> tuple[int, int]:
    """This process's rank and world, as the main process decides them."""
    return explicit or dist_rank_world() or env_rank_world() or (0, 1)


# -- the channel to workers ---------------------------------------------------------------------
class Channel:
    """Shared memory between the main process and the DataLoader workers of one dataset.

    ``spec``: JSON of ``{"epoch", "state"}`` (the epoch set last, the pending resume state);
    ``ints``: the pass counter and its identity, the epoch shift of a torchdata resume, and
    whether workers iterated with nobody counting batches in the main process.

    Shared by fork, and by the pickling that starts spawned / forkserver workers (torch shares
    the tensors' memory, multiprocessing the lock); any other copy (``copy.deepcopy``, a pickle
    to disk) is a private channel with the same contents.
    """

    def __init__(self, spec: dict[str, Any] | None = None, ints: np.ndarray | None = None) -> None:
        self._spec = torch.zeros(_SPEC_BYTES, dtype=torch.uint8).share_memory_()
        self._ints_t = torch.zeros(_INTS, dtype=torch.int64).share_memory_()
        # A fork-context lock (where there is fork): a spawn-context one starts
        # multiprocessing's resource tracker, a Python process of its own (about 0.03 CPU s),
        # in every program that builds a dataset. A fork-context lock cannot reach spawned
        # workers, so the first pickling for one swaps in a spawn-context lock (__reduce__).
        self.lock: Any = multiprocessing.get_context(_LOCK_START).Lock()
        self._spawnable = _LOCK_START != "fork"
        self.ints = self._ints_t.numpy()
        if ints is not None:
            self.ints[:] = ints
        self.publish(spec or {"epoch": 0, "state": None})

    def publish(self, spec: dict[str, Any]) -> None:
        """Main process: a new epoch / resume state; the next pass is its first."""
        raw = json.dumps(spec).encode()
        if len(raw) + 4 > _SPEC_BYTES:
            raise StateError(f"resume state too large to share with workers ({len(raw)} bytes)")
        buf = np.frombuffer(len(raw).to_bytes(4, "little") + raw, dtype=np.uint8)
        with self.lock:
            self._spec[: len(buf)] = torch.from_numpy(buf.copy())
            self.ints[:] = 0

    def read(self) -> dict[str, Any]:
        raw = self._spec.numpy().tobytes()
        n = int.from_bytes(raw[:4], "little")
        return json.loads(raw[4 : 4 + n])  # type: ignore[no-any-return]

    def start_pass(self, ident: int | None, *, counted: bool) -> tuple[int, int]:
        """Join the pass ``ident`` names, or start it if it is new; ``(pass, epoch shift)``.

        ``ident`` None: a pass of a main process that counts its batches (always new, and the
        workers of a counting loader then join it: ``ident=0``). Passes count from 1.
        """
        with self.lock:
            if ident is None:
                self.ints[_PASS] += 1
                self.ints[_PASS_ID] = secrets.randbits(62) | 1
                self.ints[_UNCOUNTED] = 0
            elif ident and self.ints[_PASS_ID] != ident:
                self.ints[_PASS] += 1
                self.ints[_PASS_ID] = ident
            if not counted:
                self.ints[_UNCOUNTED] = 1
            return max(1, int(self.ints[_PASS])), int(self.ints[_SHIFT])

    def next_pass(self) -> tuple[int, int]:
        """The pass a worker that has not started yet would start, and the epoch shift."""
        with self.lock:
            return int(self.ints[_PASS]) + 1, int(self.ints[_SHIFT])

    def current_pass(self) -> int:
        return int(self.ints[_PASS])

    @property
    def shift(self) -> int:
        return int(self.ints[_SHIFT])

    def set_shift(self, shift: int) -> None:
        """A resumed worker's epoch is its state's: later passes count on from it."""
        with self.lock:
            self.ints[_SHIFT] = shift

    @property
    def uncounted(self) -> bool:
        """Workers iterated since the last main-process pass, and nobody counted their batches."""
        return bool(self.ints[_UNCOUNTED])

    def __reduce__(self) -> tuple[Any, ...]:
        if mp_context.get_spawning_popen() is not None:  # starting a worker: share
            self._make_spawnable()
            return (_shared_channel, (self._spec, self._ints_t, self.lock))
        return (_private_channel, (self.read(), self.ints.copy()))

    def _make_spawnable(self) -> None:
        """Main process, pickling the channel for a spawned or forkserver worker: a lock that
        reaches it (spawn context) from now on. Workers forked before keep the fork-context
        lock: only one loader, with one start method, should use a dataset."""
        if self._spawnable:
            return
        new = multiprocessing.get_context("spawn").Lock()
        with self.lock:
            self.lock, self._spawnable = new, True


def _shared_channel(spec: torch.Tensor, ints: torch.Tensor, lock: Any) -> Channel:
    ch = Channel.__new__(Channel)
    ch._spec, ch._ints_t, ch.lock, ch._spawnable = spec, ints, lock, True
    ch.ints = ints.numpy()
    return ch


def _private_channel(spec: dict[str, Any], ints: np.ndarray) -> Channel:
    return Channel(spec, ints)


class PlanMemo:
    """A dataset's epoch plans (``spec.plan``), the last two kept by their arguments.

    The main process plans a pass before it starts its workers (it needs the plan for the
    bundles' order anyway); new workers inherit it (fork) or unpickle it (spawn: about 0.3 ms,
    against 3-7 ms to plan 8,192 chunks again) instead of each planning the whole world's epoch.
    """

    def __init__(self, spec: Any) -> None:
        self.spec = spec
        self._kept: dict[tuple[Any, ...], EpochPlan] = {}

    def get(self, world: int, num_workers: int, epoch: int, state: Any) -> EpochPlan:
        """``spec.plan(world_size=world, num_workers=..., epoch=..., state=...)``."""
        try:
            key: tuple[Any, ...] | None = (
                world,
                num_workers,
                epoch,
                json.dumps(state, sort_keys=True),
            )
        except (TypeError, ValueError):  # not JSON (an EpochState): not kept
            key = None
        plan = self._kept.get(key) if key is not None else None
        if plan is None:
            plan = self.spec.plan(
                world_size=world, num_workers=num_workers, epoch=epoch, state=state
            )
            if key is not None:
                self._kept = {**dict(list(self._kept.items())[-1:]), key: plan}
        return plan


def pass_epoch(spec: Mapping[str, Any], pass_no: int, shift: int) -> tuple[int, Any]:
    """The epoch and resume state of pass ``pass_no`` after ``spec`` was published: the first
    pass is the published epoch (resumed from the state, if any), each later one the next epoch.

    >>> pass_epoch({"epoch": 3, "state": None}, 1, 0), pass_epoch({"epoch": 3, "state": {}}, 2, 0)
    ((3, None), (4, None))
    """
    return int(spec["epoch"]) + shift + pass_no - 1, spec["state"] if pass_no <= 1 else None


# -- the resume state ---------------------------------------------------------------------------
#: What ``state_dict()`` in the main process says when workers iterated uncounted.
UNCOUNTED_STATE = (
    "this StreamingDataset was iterated by DataLoader workers, whose batches the main process "
    "cannot count (each worker has its own copy of the dataset, and the DataLoader holds "
    "prefetched batches): its state_dict() here would not say where your loop stands. Iterate "
    "it with shardload.torch.StreamingDataLoader(ds, num_workers=...) and save "
    "loader.state_dict(), or with torchdata's StatefulDataLoader and its state_dict()"
)


def epoch_state(
    epoch: int,
    consumed: int,
    world: int,
    num_workers: int,
    fingerprint: str,
    leg: Mapping[str, Any] | None,
) -> EpochState:
    """Where a rank stands after ``consumed`` batches of a pass that resumed ``leg`` (None: a
    fresh pass): a resume on the same shape adds up, one on another shape is history."""
    readers, k = max(1, num_workers), consumed
    history: tuple[tuple[int, int, int], ...] = ()
    if leg is not None:
        old = EpochState.from_dict(dict(leg))
        if old.world_size == world and max(1, old.num_workers) == readers:
            history, k = old.history, old.batches_consumed + k
        else:
            history = (*old.history, (old.world_size, old.num_workers, old.batches_consumed))
    return EpochState(epoch, k, world, num_workers, fingerprint, history)


def worker_position(
    state: Mapping[str, Any], info: Any, rank_world: tuple[int, int] | None
) -> dict[str, Any]:
    """A DataLoader worker's saved position (torchdata's ``StatefulDataLoader``), checked
    against this worker (``info``: ``get_worker_info()``) and its rank and world."""
    if info is None:
        raise StateError(
            "this is a DataLoader worker's state (from torchdata's StatefulDataLoader); load "
            "it through StatefulDataLoader.load_state_dict, not into the dataset directly"
        )
    if (state["worker"], state["num_workers"]) != (info.id, info.num_workers):
        raise StateError(
            f"the state is worker {state['worker']} of {state['num_workers']}; this is worker "
            f"{info.id} of {info.num_workers}"
        )
    if list(state["rank_world"]) != list(rank_world or ()):
        raise StateError(
            f"the state was saved by rank/world {state['rank_world']}; this is "
            f"{list(rank_world or ())} (StatefulDataLoader resumes on the same world shape only)"
        )
    keys = ("epoch", "leg", "worker", "num_workers", "rank_world", "worker_batches")
    return {k: state[k] for k in keys}


def _header(ds: Any, kind: str) -> dict[str, Any]:
    return {
        "version": STATE_VERSION,
        "kind": kind,
        "dataset": ds.fingerprint,
        "fingerprint": ds.plan_fingerprint,
        "seed": ds.options["seed"],
        "batch_size": ds.options["batch_size"],
    }


def rank_state(ds: Any, epoch_state: EpochState) -> dict[str, Any]:
    """A rank's position (what ``StreamingDataset.state_dict()`` returns in the main process)."""
    return {**_header(ds, "rank"), **epoch_state.to_dict()}


def worker_state(ds: Any, position: Mapping[str, Any]) -> dict[str, Any]:
    """A DataLoader worker's position (torchdata's ``StatefulDataLoader`` asks each worker)."""
    return {**_header(ds, "worker"), **{k: position[k] for k in WORKER_KEYS}}


def check_state(ds: Any, state: Mapping[str, Any]) -> str:
    """Validate a state against dataset ``ds``; its kind (``"rank"`` or ``"worker"``).

    Raises
    ------
    StateError
        Not a shardload state, or one of another dataset, selection, seed or option set.
    """
    if state.get("version") != STATE_VERSION or "dataset" not in state:
        raise StateError(f"not a shardload StreamingDataset state: keys {sorted(state)}")
    if state["dataset"] != ds.fingerprint:
        raise StateError(
            f"the state was saved for another dataset (fingerprint {state['dataset']}); this "
            f"one is {ds.store.url}, arrays {list(ds.selection.arrays)}, split "
            f"{ds.split!r} (fingerprint {ds.fingerprint})"
        )
    if state.get("fingerprint") != ds.plan_fingerprint:
        opts = ds.options
        raise StateError(
            f"the state was saved with other loader options (seed={state.get('seed')}, "
            f"batch_size={state.get('batch_size')}); this dataset has seed={opts['seed']}, "
            f"batch_size={opts['batch_size']}, mode={opts['mode']!r}, shuffle={opts['shuffle']}"
            + ds.spec.resume_hint(str(state.get("fingerprint")))
        )
    kind = state.get("kind", "rank")
    if kind == "worker":
        missing = [k for k in WORKER_KEYS if k not in state]
        if missing:
            raise StateError(f"a worker state without {missing}")
    elif kind == "rank":
        EpochState.from_dict(dict(state))  # validates the fields
    else:
        raise StateError(f"unknown state kind {kind!r} (expected 'rank' or 'worker')")
    return str(kind)
