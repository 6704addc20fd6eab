"""Saving and loading where a :class:`~shardload.torch.dataset.StreamingDataset` stands.

The resume half of the dataset: ``state_dict`` / ``load_state_dict`` in the main process (a
rank's state) and in DataLoader workers (a worker's, for torchdata's ``StatefulDataLoader``).
The state's shape and checks live in :mod:`shardload.torch.state`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch.utils.data import get_worker_info

from shardload.errors import StateError
from shardload.plan.resume import EpochState
from shardload.torch.state import (
    UNCOUNTED_STATE,
    check_state,
    epoch_state,
    pass_epoch,
    rank_state,
    worker_position,
    worker_state,
)


class ResumableDataset:
    """Mixed into :class:`~shardload.torch.dataset.StreamingDataset`: its resume state. Uses the
    dataset's epoch, channel, plan and counters (set in its ``__init__``)."""

    epoch: int
    num_workers: int
    plan_fingerprint: str
    _pending: dict[str, Any] | None
    _leg: Any
    _consumed: int
    _channel: Any
    _worker_resume: Any
    _worker_pos: Any

    def rank_world(self) -> tuple[int, int]:
        raise NotImplementedError

    def _worker_rank_world(self) -> tuple[int, int]:
        raise NotImplementedError

    def group_rank_world(self) -> tuple[int, int]:
        raise NotImplementedError

    def _plan(self, rank: int, world: int, num_workers: int, state: Any) -> Any:
        raise NotImplementedError

    def _publish(self, epoch: int, state: dict[str, Any] | None) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """Where this rank stands: epoch, batches consumed, plan shape and fingerprints.

        In a DataLoader worker (torchdata's ``StatefulDataLoader`` asks there), where this
        worker stands: its epoch, the resume state its iteration started from, and the batches
        it has yielded.

        Raises
        ------
        StateError
            In the main process, after DataLoader workers iterated the dataset with nobody
            counting the batches they handed over (a plain ``DataLoader(num_workers>0)``): use
            :class:`StreamingDataLoader` or torchdata's ``StatefulDataLoader`` and save *their*
            state.
        """
        if get_worker_info() is not None:
            return self._worker_state()
        if self._pending is not None:
            return dict(self._pending)
        if self._channel.uncounted:
            raise StateError(UNCOUNTED_STATE)
        _, world = self.group_rank_world()  # read groups: the state is the group's
        state = epoch_state(
            self.epoch, self._consumed, world, self.num_workers, self.plan_fingerprint, self._leg
        )
        return rank_state(self, state)

    def _worker_state(self) -> dict[str, Any]:
        info = get_worker_info()
        pos = self._worker_resume or self._worker_pos
        if pos is None and info is not None:  # not started: the coming pass, from its start
            pass_no, shift = self._channel.next_pass()
            epoch, leg = pass_epoch(self._channel.read(), pass_no, shift)
            pos = {
                "epoch": epoch,
                "leg": leg,
                "worker": info.id,
                "num_workers": info.num_workers,
                "rank_world": list(self._worker_rank_world()),
                "worker_batches": 0,
            }
        assert pos is not None  # only called in a worker
        return worker_state(self, pos)

    def _load_worker_state(self, state: dict[str, Any]) -> None:
        info = get_worker_info()
        rank_world = None if info is None else self._worker_rank_world()
        self._worker_resume = worker_position(state, info, rank_world)

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` on the next pass (any world shape: elastic re-plan); the pass
        after it is the next epoch.

        A worker's state (``StatefulDataLoader``) resumes that worker, same world shape only.
        A state with no batch left in its epoch changes nothing (as torchdata's
        ``StatefulDataLoader`` does, the next iteration is the epoch set by ``set_epoch``);
        :class:`StreamingDataLoader` instead resumes it as an empty rest of that epoch.

        Raises
        ------
        StateError
            A state of another dataset, selection, seed or option set.
        """
        self._load_state(state, keep_finished=False)

    def _load_state(self, state: Mapping[str, Any], *, keep_finished: bool) -> None:
        state = dict(state)
        if check_state(self, state) == "worker":
            return self._load_worker_state(state)
        es = EpochState.from_dict(state)
        if not keep_finished:
            rank, _ = self.group_rank_world()
            left = self._plan(min(rank, es.world_size - 1), es.world_size, es.num_workers, state)
            if left.batches_per_rank == 0:
                return
        self._pending, self._leg, self._consumed = state, None, 0
        self._publish(int(state["epoch"]), state)
