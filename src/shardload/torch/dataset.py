"""The IterableDataset of a store: :class:`StreamingDataset` (batches for one rank)."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, cast

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from shardload.errors import StateError
from shardload.load.arena import group_arena, serve_group_buffers
from shardload.load.batches import INDEX_KEY, read_batches
from shardload.load.ring import BatchRing
from shardload.load.spec import LoadSpec
from shardload.plan.read_groups import ReadGroupAxis, ReadGroupSize, RowSlice
from shardload.store.core import Store
from shardload.torch.closing import ClosingDataset
from shardload.torch.resume import ResumableDataset
from shardload.torch.state import (
    Channel,
    PlanMemo,
    dist_rank_world,
    env_rank_world,
    main_rank_world,
    pass_epoch,
)
from shardload.torch.transport import (
    _bundles,
    _RingBatch,
    _to_torch,
    guard_worker_exit,
    plan_bundle,
)

__all__ = ["StreamingDataset"]


class StreamingDataset(ResumableDataset, ClosingDataset, IterableDataset):
    """Batches of a store for one rank, split over the DataLoader's workers.

    Use with ``DataLoader(ds, batch_size=None, num_workers=W)`` (or :class:`StreamingDataLoader`
    for mid-epoch resume and bundles). Each new pass over it (``iter()``) is the next epoch,
    unless ``set_epoch`` or ``load_state_dict`` was called since: ``set_epoch(e)`` makes the next
    pass epoch ``e``. Each item is a dict of tensors, one per array, and ``"index"`` (int64
    global rows). Every rank yields the same number of batches (``mode`` ``"drop"``/``"pad"``).
    Memory per worker is about ``shuffle_chunks + prefetch`` pieces (chunks, or pieces of
    ``piece_rows`` rows: see :func:`shardload.iter_batches`; forked workers' group buffers are
    kept for the next workers: ``load/arena.py``). ``close()`` / ``with`` closes a store it
    opened from a path or URL (``ClosingDataset``; workers close theirs).

    Parameters
    ----------
    store
        A path, URL or :class:`~shardload.store.core.Store` (only the manifest is read here; workers
        open the arrays after fork).
    batch_size, split, shuffle, seed, mode
        As in :func:`shardload.iter_batches`; so are the other keyword options.
    rank, world_size
        This process's rank and world. Default: ``torch.distributed``'s when initialised, else
        torchrun's ``RANK`` / ``WORLD_SIZE`` environment, else one process (0, 1); resolved in
        the main process when iteration starts and carried to the DataLoader's workers, whatever
        their start method (fork, spawn, forkserver).
    ring_slots
        Batch slots of the shared-memory ring forked DataLoader workers hand batches over in
        (virtual memory; only slots in use at once hold memory, about ``threads + 1 +
        prefetch_factor`` batches per worker plus the batches the training loop holds; scatter
        reads of raw local chunks fill a whole shuffle group's batches at once). The main
        process gets tensors over the slot itself (no copy); a slot is reused once those
        tensors are garbage. Default: enough for up to ``min(16, CPUs)`` workers; 0: the stock
        DataLoader hand-off. Stores with variable-length arrays use no ring.
    bucket
        Length-bucketed batches for variable-length arrays (see ``iter_batches``).
    window, window_step
        Windows of dates on a dated store (see ``iter_batches``): ``NAME`` is ``(B, window,
        *row_shape)``; ``dates`` comes as int64 seconds since 1970-01-01 (torch has no
        datetime type: ``batch["dates"].numpy().astype("datetime64[s]")`` gives the dates).
    read_group_size, read_group_axis
        Read groups for model parallelism (see ``iter_batches``): the ``read_group_size``
        consecutive ranks of a group get the same batches in the same order, each its slice of
        ``read_group_axis`` (:meth:`read_slices`); the epoch, ``len()`` and the resume state
        are the group's. Two levels: ``read_group_size=(E, G)``, ``read_group_axis=(members
        axis, grid axis)`` (ensemble members across ranks and the grid split within).

    Variable-length arrays come as ``NAME`` (zero-padded to the batch's longest row) and
    ``NAME_length`` (int64), see docs/loading.md ("Variable-length arrays").
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Store,
        *,
        batch_size: int,
        split: str | None = None,
        shuffle: bool | str = True,
        seed: int = 0,
        mode: str = "drop",
        rank: int | None = None,
        world_size: int | None = None,
        arrays: Sequence[str] | None = None,
        chunks: Sequence[int] | None = None,
        rows: tuple[int, int] | None = None,
        drop_last: bool = False,
        shuffle_chunks: int | None = None,
        piece_rows: int | None = None,
        prefetch: int | None = None,
        threads: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        ring_slots: int | None = None,
        bucket: bool | str = False,
        missing_dates: str = "skip",
        window: int | None = None,
        window_step: int | None = None,
        read_group_size: ReadGroupSize = 1,
        read_group_axis: ReadGroupAxis = -1,
    ) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank= and world_size=, or neither")
        #: every option resolved once, against the store (workers take it as is)
        self.spec = spec = LoadSpec.build(
            store,
            batch_size=batch_size,
            split=split,
            chunks=chunks,
            rows=rows,
            arrays=arrays,
            shuffle=shuffle,
            seed=seed,
            mode=mode,
            drop_last=drop_last,
            shuffle_chunks=shuffle_chunks,
            piece_rows=piece_rows,
            prefetch=prefetch,
            threads=threads,
            bucket=bucket,
            storage_options=storage_options,
            missing_dates=missing_dates,
            window=window,
            window_step=window_step,
            read_group_size=read_group_size,
            read_group_axis=read_group_axis,
        )
        self.store, self.selection, self.split = spec.store, spec.selection, split
        self._own_store(store)  # a path or URL: close() closes what was opened here
        self.options = spec.options  # the epoch plan's (PlanOptions)
        self.read_options = {"prefetch": spec.prefetch, "threads": threads}
        self.fingerprint = spec.fingerprint
        #: length-bucketed batches of variable-length arrays (see iter_batches)
        self.bucket = bucket
        self.plan_fingerprint = spec.plan_fingerprint  # checks ``bucket``
        self._explicit = (
            None if rank is None or world_size is None else (int(rank), int(world_size))
        )
        self.epoch = 0
        self.num_workers = 0  # of the loader iterating it (set by StreamingDataLoader)
        self._pending: dict[str, Any] | None = None  # a loaded state, not started yet
        self._leg: dict[str, Any] | None = None  # the state the current iteration resumed
        self._consumed = 0  # batches yielded to the training loop in the current iteration
        self._counted_by_loader = False
        self._bundle = 0  # batches per worker item (StreamingDataLoader sets it); 0: one, plain
        self._channel = Channel()  # epoch, pending state and passes, shared with workers
        self._home = os.getpid()  # the process this object was built or unpickled in
        self._carried: tuple[int, int] | None = None  # rank/world the main process resolved
        self._worker_iters = 0  # iter() calls on this copy in a DataLoader worker
        self._main_pass: int | None = None  # the pass this (main) process last began
        self._worker_resume: dict[str, Any] | None = None  # a worker's own state (torchdata)
        self._worker_pos: dict[str, Any] | None = None  # where this worker stands
        self._ring: BatchRing | None = None
        self._plans = PlanMemo(spec)  # the main process's plans, inherited by new workers
        batch_bytes = spec.batch_bytes()
        #: batches per worker item a StreamingDataLoader uses unless told (``plan_bundle``)
        self.default_bundle = plan_bundle(batch_bytes)
        # ragged arrays: no fixed ring slot fits a batch (load/ragged.py: the stock hand-off);
        # read groups: slots of this rank's slices (a rank found otherwise later: no ring)
        self._ring_member = spec.split_rank(*self.rank_world())[2]
        most = min(16, max(2, os.cpu_count() or 1))  # workers the shared memory is sized for
        self._arena = group_arena(spec, workers=most) if hasattr(os, "fork") else None
        if ring_slots != 0 and hasattr(os, "fork") and spec.kind != "ragged":
            slots = ring_slots or spec.ring_slots(
                workers=most,
                # bundles: the one being filled, prefetch_factor (2) queued, one being reordered
                extra=8 + 4 * self.default_bundle,
            )
            try:
                specs = spec.batch_specs(self._ring_member)
                self._ring = BatchRing(specs, batch_size, slots=slots)
            except OSError:  # no address space for it (strict overcommit): the stock hand-off
                self._ring = None
        # Fail early on impossible shapes (e.g. a batch bigger than a rank's share).
        self._plan(*self.group_rank_world(), 0, None)

    # -- where this process stands -------------------------------------------------------------
    def rank_world(self) -> tuple[int, int]:
        """This process's rank and world (in a DataLoader worker: its main process's)."""
        if get_worker_info() is not None:
            return self._worker_rank_world()
        return main_rank_world(self._explicit)

    def group_rank_world(self) -> tuple[int, int]:
        """This process's read group and the number of groups: what the epoch is planned over
        (``rank_world()`` without read groups)."""
        group, groups, _ = self.spec.split_rank(*self.rank_world())
        return group, groups

    def read_slices(self) -> dict[str, RowSlice] | dict[str, tuple[RowSlice, ...]]:
        """``{array: (axis of a row, start, stop)}``: the slice of each array's rows this rank
        reads with read groups (arrays read whole are not listed; empty without read groups).
        A batch's ``NAME`` is ``rows[:, ..., start:stop]`` along that axis (+1 in the batch).
        Two levels (``read_group_size=(E, G)``): ``{array: ((axis, start, stop), ...)}``, one
        per level that cuts the array, outermost first."""
        _, _, member = self.spec.split_rank(*self.rank_world())
        return self.spec.member_slices(member)

    def _worker_rank_world(self) -> tuple[int, int]:
        if self._explicit is not None:
            return self._explicit
        if self._carried is not None:  # resolved by the main process when it started us
            return self._carried
        if os.getpid() != self._home:  # forked: this process's memory is the main process's
            return main_rank_world(None)
        found = dist_rank_world() or env_rank_world()
        if found is None:
            raise StateError(
                "this DataLoader worker cannot know its rank: its StreamingDataset was not "
                "pickled by the main process (which resolves rank and world) and there is no "
                "torch.distributed process group nor RANK/WORLD_SIZE here. Pass rank= and "
                "world_size= to StreamingDataset"
            )
        return found

    def _plan(self, rank: int, world: int, num_workers: int, state: Any) -> Any:
        return self._plans.get(world, num_workers, self.epoch, state)

    def _publish(self, epoch: int, state: dict[str, Any] | None) -> None:
        """Main process: the next pass is epoch ``epoch`` (resumed from ``state``)."""
        self.epoch = int(epoch)
        self._main_pass = None
        self._channel.publish({"epoch": self.epoch, "state": state})

    def _begin(self, num_workers: int) -> None:
        """Main process, before a pass it counts: its epoch and resume leg.

        A pass of this process that yielded no batch though it had some (an iterator made and
        dropped before its first batch, as torchdata does on loading a finished state) did not
        start: it is run again rather than counted as an epoch.
        """
        ch = self._channel
        if (
            self._main_pass is not None
            and self._main_pass == ch.current_pass()
            and self._consumed == 0
            and self._has_batches(num_workers)
        ):
            pass_no, shift = self._main_pass, ch.shift
        else:
            pass_no, shift = ch.start_pass(None, counted=True)
        self._main_pass = pass_no
        self.epoch, self._leg = pass_epoch(ch.read(), pass_no, shift)
        self._pending = None
        self._consumed = 0
        self.num_workers = num_workers

    def _has_batches(self, num_workers: int) -> bool:
        if self._leg is None:
            return True
        return bool(self._plan(*self.group_rank_world(), num_workers, self._leg).batches_per_rank)

    def _worker_pass(self, info: Any, resumed_epoch: int | None) -> tuple[int, Any]:
        """A DataLoader worker, at ``iter()``: the epoch and resume leg of its pass.

        Workers of one pass share a seed (``info.seed - info.id``; torch draws a new one for
        each new set of workers) and a count of ``iter()`` calls (persistent workers), so the
        first of them to arrive starts the pass and the others join it.
        """
        self._worker_iters += 1
        counted = self._counted_by_loader
        ident = 0 if counted else hash((info.seed - info.id, self._worker_iters)) & (2**62 - 1) | 1
        pass_no, shift = self._channel.start_pass(ident, counted=counted)
        spec = self._channel.read()
        if resumed_epoch is not None:
            shift = resumed_epoch - pass_epoch(spec, pass_no, 0)[0]
            self._channel.set_shift(shift)
        return pass_epoch(spec, pass_no, shift)

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Not a generator: the iteration's plan and position are set when the DataLoader (or
        # torchdata, right before it asks for the worker's state) calls iter(), not at the
        # first batch.
        info = get_worker_info()
        skip = 0
        if info is None:
            if not self._counted_by_loader:
                self._begin(0)
            rank, world = main_rank_world(self._explicit)
            worker, workers = 0, 0
            epoch, state = self.epoch, self._leg
        else:
            guard_worker_exit()
            self._close_at_worker_exit()  # this worker's own copy of the store
            serve_group_buffers(self._arena, self.spec.store, self.selection.arrays)
            rank, world = self._worker_rank_world()
            worker, workers = info.id, info.num_workers
            resume, self._worker_resume = self._worker_resume, None
            epoch, state = self._worker_pass(info, None if resume is None else resume["epoch"])
            if resume is not None:  # torchdata restored this worker
                epoch, state, skip = resume["epoch"], resume["leg"], resume["worker_batches"]
            self.epoch = epoch
        ring = self._ring if info is not None and self._ring is not None else None
        ring = ring if ring is not None and ring.usable else None
        groups, member = self.spec.split_rank(rank, world)[1:]
        if ring is not None and member != self._ring_member:
            ring = None  # slots of another read group member's slices
        batches = read_batches(
            self.spec,
            rank=rank,
            world_size=world,
            worker=worker,
            num_workers=workers,
            epoch=epoch,
            state=state,
            skip_batches=skip,
            plan=self._plans.get(groups, workers, epoch, state),
            allocate=(
                functools.partial(ring.allocate, part=(worker, workers))
                if ring is not None
                else None
            ),
        )
        pos = {
            "epoch": epoch,
            "leg": state,
            "worker": worker,
            "num_workers": workers,
            "rank_world": [rank, world],
            "worker_batches": skip,
        }
        self._worker_pos = pos
        out = self._yield(batches, ring, pos, count=info is None and not self._counted_by_loader)
        if info is not None and self._bundle > 0:
            return cast(Iterator[dict[str, torch.Tensor]], _bundles(out, worker, self._bundle))
        return out

    def _yield(
        self,
        batches: Iterator[dict[str, np.ndarray]],
        ring: BatchRing | None,
        pos: dict[str, Any],
        *,
        count: bool,
    ) -> Iterator[dict[str, torch.Tensor]]:
        try:
            for batch in batches:
                if count:
                    self._consumed += 1
                pos["worker_batches"] += 1
                slot = ring.slot_of(batch) if ring is not None else None
                if slot is None:
                    yield _to_torch(batch)
                else:
                    yield _RingBatch(_to_torch(batch), ring, slot, len(batch[INDEX_KEY]))  # type: ignore[arg-type]
        finally:
            batches.close()  # type: ignore[attr-defined]  # waits for gathers writing into slots
            if ring is not None:
                ring.release_unsent()

    def __len__(self) -> int:
        """Batches this rank yields in the current pass (if one started), else the coming one."""
        rank, world = self.group_rank_world()
        if self._pending is not None:
            state = self._pending
        elif self._channel.current_pass() <= 1:
            state = self._channel.read()["state"]
        else:
            state = None
        return self._plan(rank, world, self.num_workers, state).batches_per_rank

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch ``epoch`` (forgets any pending resume)."""
        self._pending = self._leg = self._worker_resume = self._worker_pos = None
        self._consumed = 0
        self._publish(epoch, None)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()  # the Store pickles without open handles
        d["_ring"] = d["_arena"] = None  # shared by fork only: spawned workers use their own
        # Pickled as the DataLoader starts spawn / forkserver workers: the main process's rank
        # and world go with it (a worker's own copy carries what it knows).
        if get_worker_info() is None:
            d["_carried"] = main_rank_world(self._explicit)
        else:
            d["_carried"] = self._carried
        return d

    def __setstate__(self, d: dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._home = os.getpid()
