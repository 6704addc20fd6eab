"""PyTorch integration (the only module that imports torch).

- :class:`StreamingDataset`: an ``IterableDataset`` of whole batches for
  ``DataLoader(ds, batch_size=None, num_workers=W)``; rank and world from ``torch.distributed``,
  the worker from ``get_worker_info``; ``set_epoch``; resumable mid-epoch.
- :class:`StreamingDataLoader`: a ``DataLoader`` that counts the batches it yields (in the main
  process) so that ``state_dict()`` / ``load_state_dict()`` resume mid-epoch with workers.
- :class:`MapDataset`: random access by row (memory-mapped npy chunks, or a small LRU cache of
  decoded chunks), for samplers such as ``DistributedSampler``.

The epoch, the rank/world and a pending resume reach DataLoader workers through a small shared
memory buffer, so ``set_epoch`` and ``load_state_dict`` work with ``persistent_workers=True``.

Hand-off: DataLoader workers gather each batch into a slot of a shared-memory ring
(:mod:`shardload.loader.ring`, mapped before the workers fork) and send only the slot's address;
the main process wraps the slot as tensors (no copy), and the slot is reused once those tensors
(and any views of them) are garbage. A training loop that keeps many batches alive just makes
the workers fall back to the stock hand-off for the batches that find no free slot.

Bundles: every DataLoader item costs a round trip between the main process and a worker (two
queue hops, a feeder thread on each side, about 0.2-0.6 ms of CPU a batch on 2 cores).
:class:`StreamingDataLoader` has each worker send ``bundle`` consecutive batches as one item and
puts them back in the exact order a plain ``DataLoader`` yields them (worker 0's batch ``i``, then
worker 1's batch ``i``, ...), so what the training loop sees, and resumes from, is unchanged.

``StreamingDataset`` also works with torchdata's ``StatefulDataLoader``: inside a worker,
``state_dict()`` is that worker's position (``load_state_dict`` of it skips what the worker
already yielded, without reading it); in the main process it is the rank's position.
"""

from __future__ import annotations

import functools
import json
import os
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypedDict, cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, get_worker_info

from .errors import StateError
from .loader.batches import (
    DEFAULT_PREFETCH,
    INDEX_KEY,
    batch_specs,
    iter_batches,
    loader_selection,
    plan_for,
)
from .loader.recycle import plan_batch_layout
from .loader.ring import RINGS, BatchRing, plan_ring_slots
from .loader.scatter import batches_per_group, groups_in_flight
from .loader.select import select_rows, store_fingerprint
from .plan.epoch import PlanOptions, plan_fingerprint
from .plan.resume import EpochState
from .store import Store, open_store

__all__ = ["MapDataset", "StreamingDataLoader", "StreamingDataset"]

STATE_VERSION = 1
_SPEC_BYTES = 1 << 16


class _SelectOptions(TypedDict):
    """What a :class:`StreamingDataset` reads, as keyword arguments of ``iter_batches``."""

    split: str | None
    chunks: Sequence[int] | None
    rows: tuple[int, int] | None
    arrays: Sequence[str]
    piece_rows: int


class _ReadOptions(TypedDict):
    """How a :class:`StreamingDataset` reads, as keyword arguments of ``iter_batches``."""

    prefetch: int
    threads: int | None


def _to_torch(batch: Mapping[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(v) for k, v in batch.items()}


class _RingBatch(dict):  # type: ignore[type-arg]
    """A batch in a ring slot, in a DataLoader worker: a dict of tensors viewing the slot, which
    pickles as the slot's address; the main process rebuilds a plain dict of fresh tensors.

    If code in the worker replaced or added entries, it pickles as a plain dict of private
    copies instead (and frees the slot), so the main process still gets what the worker saw.
    """

    def __init__(self, data: Mapping[str, torch.Tensor], ring: BatchRing, slot: int, rows: int):
        super().__init__(data)
        self._ring, self._slot, self._rows = ring, slot, rows
        self._views = dict(data)
        self._sent = [False]  # shared with copies: one slot, sent once

    def __copy__(self) -> _RingBatch:  # default_convert copies, then updates with equal values
        new = _RingBatch(self, self._ring, self._slot, self._rows)
        new._views, new._sent = self._views, self._sent
        return new

    def discard(self) -> None:
        """Free the slot of a batch that will never be sent."""
        if not self._sent[0]:
            self._sent[0] = True
            self._ring.free(self._slot)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._sent[0]:
            raise RuntimeError("a shardload ring batch can be sent to another process only once")
        self._sent[0] = True
        views = self._views
        if self.keys() == views.keys() and all(self[k] is v for k, v in views.items()):
            return (_batch_from_ring, (self._ring.token, self._slot, self._rows))
        ids = {id(v) for v in views.values()}
        plain = {k: v.clone() if id(v) in ids else v for k, v in self.items()}
        self._ring.free(self._slot)
        return (dict, (plain,))


def _batch_from_ring(token: str, slot: int, rows: int) -> dict[str, torch.Tensor]:
    """Main process: tensors over a batch's ring slot (no copy); the slot is freed when they,
    and every view of them, are garbage."""
    ring = RINGS.get(token)
    if ring is None:
        raise RuntimeError(
            "a shardload batch arrived from a DataLoader worker but its shared-memory ring is "
            "not mapped in this process (was the StreamingDataset garbage-collected?)"
        )
    return _to_torch(ring.lease(slot, rows))


#: Most batches a :class:`StreamingDataLoader` worker sends per DataLoader item by default...
MAX_BUNDLE = 8
#: ...and most bytes of them.
BUNDLE_BYTES = 16 << 20


def plan_bundle(batch_bytes: int) -> int:
    """Batches per bundle by default: up to ``MAX_BUNDLE``, within ``BUNDLE_BYTES`` (pure).

    >>> plan_bundle(256 * 6208), plan_bundle(64 << 20)
    (8, 1)
    """
    return max(1, min(MAX_BUNDLE, BUNDLE_BYTES // max(1, batch_bytes)))


class _Bundle(list):  # type: ignore[type-arg]
    """Consecutive batches of one DataLoader worker sent as one item (StreamingDataLoader);
    ``seq`` numbers a worker's bundles from 0."""

    worker: int
    seq: int

    def __init__(self, worker: int, seq: int) -> None:
        super().__init__()
        self.worker, self.seq = worker, seq


def _bundles(items: Iterator[Any], worker: int, size: int) -> Iterator[_Bundle]:
    """A worker's batches in bundles of ``size`` (the last one may be shorter)."""
    out = _Bundle(worker, 0)
    try:
        for item in items:
            out.append(item)
            if len(out) == size:
                full, out = out, _Bundle(worker, out.seq + 1)
                yield full  # the DataLoader's now (its queue pickles it later, in a thread)
        if out:
            last, out = out, _Bundle(worker, out.seq + 1)
            yield last
    finally:
        for item in out:  # built but never yielded (the iteration was closed): free their slots
            if isinstance(item, _RingBatch):
                item.discard()
        items.close()  # type: ignore[attr-defined]


def plan_rounds(counts: Sequence[int], bundle: int) -> list[list[int]]:
    """The workers that send a bundle in each round, given each worker's batch count (pure).

    >>> plan_rounds([5, 4, 0], 2)
    [[0, 1], [0, 1], [0]]
    """
    rounds = -(-max(counts, default=0) // bundle)
    return [[w for w, n in enumerate(counts) if r * bundle < n] for r in range(rounds)]


def _unbundle(items: Iterator[Any], counts: Sequence[int], bundle: int) -> Iterator[Any]:
    """Main process: the batches of the workers' bundles, in the order a plain DataLoader
    yields them one by one (batch ``i`` of every worker that has one, then batch ``i + 1``).

    ``counts``: each worker's batches in this iteration (from the plan), so round ``r`` is
    bundle ``r`` of every worker with more than ``r * bundle`` batches. Bundles are matched by
    (worker, seq), so ``in_order=False`` gives the same order; anything unexpected is passed on
    as it comes, never dropped.
    """
    held: dict[tuple[int, int], _Bundle] = {}
    rounds = iter(enumerate(plan_rounds(counts, bundle)))
    rnd, who = next(rounds, (-1, []))
    for item in items:
        if not isinstance(item, _Bundle):
            yield item
            continue
        held[(item.worker, item.seq)] = item
        while who and all((w, rnd) in held for w in who):
            bundles = [held.pop((w, rnd)) for w in who]
            for i in range(max(map(len, bundles))):
                for b in bundles:
                    if i < len(b):
                        batch, b[i] = b[i], None  # the caller alone holds it (its slot frees)
                        yield batch
            rnd, who = next(rounds, (-1, []))
    for key in sorted(held, key=lambda k: (k[1], k[0])):  # not in the plan: in arrival order
        yield from held.pop(key)


def _dist_rank_world() -> tuple[int, int] | None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return None


class StreamingDataset(IterableDataset):
    """Batches of a store for one rank, split over the DataLoader's workers.

    Use with ``DataLoader(ds, batch_size=None, num_workers=W)`` (or :class:`StreamingDataLoader`
    for mid-epoch resume). Each item is a dict of tensors, one per array, and ``"index"`` (int64
    global rows). Every rank yields the same number of batches (``mode`` ``"drop"``/``"pad"``).
    Memory per worker is about ``shuffle_chunks + prefetch`` pieces (chunks, or pieces of
    ``piece_rows`` rows: see :func:`shardload.iter_batches`).

    Parameters
    ----------
    store
        A path, URL or :class:`~shardload.store.Store` (only the manifest is read here; workers
        open the arrays after fork).
    batch_size, split, shuffle, seed, mode
        As in :func:`shardload.iter_batches`; so are the other keyword options.
    rank, world_size
        Override ``torch.distributed`` (default: its rank and world when initialised, else 0/1).
    ring_slots
        Batch slots of the shared-memory ring forked DataLoader workers hand batches over in
        (virtual memory; only slots in use at once hold memory, about ``threads + 1 +
        prefetch_factor`` batches per worker plus the batches the training loop holds; scatter
        reads of raw local chunks fill a whole shuffle group's batches at once). The main
        process gets tensors over the slot itself (no copy); a slot is reused once those
        tensors are garbage. Default: enough for up to ``min(16, CPUs)`` workers; 0: the stock
        DataLoader hand-off.
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
        prefetch: int = DEFAULT_PREFETCH,
        threads: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
        ring_slots: int | None = None,
    ) -> None:
        if (rank is None) != (world_size is None):
            raise ValueError("pass both rank= and world_size=, or neither")
        self.store = open_store(store, storage_options=storage_options, arrays=arrays)
        self.selection, resolved, shuffle_chunks = loader_selection(
            self.store, split=split, chunks=chunks, rows=rows, arrays=arrays,
            piece_rows=piece_rows, shuffle_chunks=shuffle_chunks, shuffle=shuffle,
        )  # fmt: skip
        self.options: PlanOptions = dict(
            batch_size=batch_size, shuffle=shuffle, seed=seed, mode=mode, drop_last=drop_last,
            shuffle_chunks=shuffle_chunks,
        )  # fmt: skip
        self.read_options: _ReadOptions = dict(prefetch=prefetch, threads=threads)
        self.split = split
        self._select: _SelectOptions = dict(
            split=split, chunks=chunks, rows=rows, arrays=self.selection.arrays,
            piece_rows=resolved,  # workers take the pieces as resolved here
        )  # fmt: skip
        self.fingerprint = store_fingerprint(self.store, self.selection)
        sel = self.selection
        self.plan_fingerprint = plan_fingerprint(
            sel.sizes, chunk_ids=sel.ids, chunk_starts=sel.starts, **self.options
        )
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
        self._spec = torch.zeros(_SPEC_BYTES, dtype=torch.uint8).share_memory_()
        self._publish(self._pending)
        self._worker_resume: dict[str, Any] | None = None  # a worker's own state (torchdata)
        self._worker_pos: dict[str, Any] | None = None  # where this worker stands
        self._ring: BatchRing | None = None
        specs = batch_specs(self.store, sel.arrays)
        batch_bytes = plan_batch_layout(specs, max(1, batch_size))[1]
        #: batches per worker item a StreamingDataLoader uses unless told (``plan_bundle``)
        self.default_bundle = plan_bundle(batch_bytes)
        if ring_slots != 0 and hasattr(os, "fork"):
            slots = ring_slots or self._ring_slots(
                batch_bytes, batch_size, shuffle_chunks, prefetch
            )
            try:
                self._ring = BatchRing(specs, batch_size, slots=slots)
            except OSError:  # no address space for it (strict overcommit): the stock hand-off
                self._ring = None
        # Fail early on impossible shapes (e.g. a batch bigger than a rank's share).
        self._plan(*self.rank_world(), 0, None)

    def _ring_slots(
        self, batch_bytes: int, batch_size: int, shuffle_chunks: int, prefetch: int
    ) -> int:
        """Enough ring slots for the batches in flight of up to ``min(16, CPUs)`` workers
        (a StreamingDataLoader's default bundles and ``prefetch_factor=2`` included)."""
        sizes = self.selection.sizes
        chunk_rows = int(sizes.max()) if len(sizes) else 1
        if self.options["shuffle"] == "uniform":  # groups of one-row segments
            chunk_rows = 1
        return plan_ring_slots(
            group_batches=batches_per_group(
                chunk_rows=chunk_rows, shuffle_chunks=shuffle_chunks, batch_size=batch_size
            ),
            groups_in_flight=groups_in_flight(prefetch=prefetch, shuffle_chunks=shuffle_chunks),
            workers=min(16, max(2, os.cpu_count() or 1)),
            slot_bytes=batch_bytes,
            # bundles: the one being filled, prefetch_factor (2) queued, one being reordered
            extra=8 + 4 * self.default_bundle,
        )

    # -- where this process stands -------------------------------------------------------------
    def rank_world(self) -> tuple[int, int]:
        return self._explicit or _dist_rank_world() or (0, 1)

    def _plan(self, rank: int, world: int, num_workers: int, state: Any) -> Any:
        return plan_for(
            self.store, self.selection, world_size=world, num_workers=num_workers,
            epoch=self.epoch, state=state, **self.options,
        )  # fmt: skip

    def _publish(self, state: dict[str, Any] | None) -> None:
        rw = self._explicit or _dist_rank_world()
        spec = {"epoch": self.epoch, "rank_world": rw, "state": state}
        raw = json.dumps(spec).encode()
        if len(raw) + 4 > _SPEC_BYTES:
            raise StateError(f"resume state too large to share with workers ({len(raw)} bytes)")
        buf = np.frombuffer(len(raw).to_bytes(4, "little") + raw, dtype=np.uint8)
        self._spec[: len(buf)] = torch.from_numpy(buf.copy())

    def _read_spec(self) -> dict[str, Any]:
        raw = self._spec.numpy().tobytes()
        n = int.from_bytes(raw[:4], "little")
        return json.loads(raw[4 : 4 + n])  # type: ignore[no-any-return]

    def _begin(self, num_workers: int) -> None:
        """Main process, before an iteration: start a leg from a pending resume, if any."""
        self._leg, self._pending = self._pending, None
        self._consumed = 0
        self.num_workers = num_workers
        self._publish(self._leg)

    # -- iteration ------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        # Not a generator: the iteration's plan and position are set when the DataLoader (or
        # torchdata, right before it asks for the worker's state) calls iter(), not at the
        # first batch.
        info = get_worker_info()
        if info is None and not self._counted_by_loader:
            self._begin(0)
        spec = self._read_spec()
        rank, world = spec["rank_world"] or _dist_rank_world() or (0, 1)
        worker, workers = (0, 0) if info is None else (info.id, info.num_workers)
        epoch, state, skip = spec["epoch"], spec["state"], 0
        resume, self._worker_resume = self._worker_resume, None
        if resume is not None and info is not None:  # torchdata restored this worker
            epoch, state, skip = resume["epoch"], resume["leg"], resume["worker_batches"]
        self.epoch = epoch
        ring = self._ring if info is not None and self._ring is not None else None
        ring = ring if ring is not None and ring.usable else None
        batches = iter_batches(
            self.store, rank=rank, world_size=world, worker=worker, num_workers=workers,
            epoch=epoch, state=state, skip_batches=skip,
            allocate=(
                functools.partial(ring.allocate, part=(worker, workers)) if ring is not None
                else None
            ),
            **self._select, **self.options, **self.read_options,
        )  # fmt: skip
        pos = {"epoch": epoch, "leg": state, "worker": worker, "num_workers": workers,
               "rank_world": [rank, world], "worker_batches": skip}  # fmt: skip
        self._worker_pos = pos
        out = self._yield(batches, ring, pos, count=info is None and not self._counted_by_loader)
        if info is not None and self._bundle > 0:
            return cast(Iterator[dict[str, torch.Tensor]], _bundles(out, worker, self._bundle))
        return out

    def _yield(
        self, batches: Iterator[dict[str, np.ndarray]], ring: BatchRing | None,
        pos: dict[str, Any], *, count: bool,
    ) -> Iterator[dict[str, torch.Tensor]]:  # fmt: skip
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
        """Batches this rank yields in the coming (or current) iteration."""
        rank, world = self.rank_world()
        return self._plan(
            rank, world, self.num_workers, self._pending or self._leg
        ).batches_per_rank

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` on the next iteration (forgets any pending resume)."""
        self.epoch = int(epoch)
        self._pending = self._leg = self._worker_resume = self._worker_pos = None
        self._consumed = 0
        self._publish(None)

    # -- resume ---------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this rank stands: epoch, batches consumed, plan shape and fingerprints.

        In a DataLoader worker (torchdata's ``StatefulDataLoader`` asks there), where this
        worker stands: its epoch, the resume state its iteration started from, and the batches
        it has yielded.
        """
        if get_worker_info() is not None:
            return self._worker_state()
        if self._pending is not None:
            return dict(self._pending)
        _, world = self.rank_world()
        readers, k = max(1, self.num_workers), self._consumed
        history: tuple[tuple[int, int, int], ...] = ()
        if self._leg is not None:
            leg = EpochState.from_dict(self._leg)
            if leg.world_size == world and max(1, leg.num_workers) == readers:
                history, k = leg.history, leg.batches_consumed + k
            else:
                history = (*leg.history, (leg.world_size, leg.num_workers, leg.batches_consumed))
        state = EpochState(self.epoch, k, world, self.num_workers, self.plan_fingerprint, history)
        return {
            "version": STATE_VERSION, "dataset": self.fingerprint, **state.to_dict(),
            "seed": self.options["seed"], "batch_size": self.options["batch_size"],
        }  # fmt: skip

    def _worker_state(self) -> dict[str, Any]:
        info = get_worker_info()
        pos = self._worker_resume or self._worker_pos
        if pos is None and info is not None:  # not started: the spec's iteration, from its start
            spec = self._read_spec()
            rank_world = spec["rank_world"] or _dist_rank_world() or (0, 1)
            pos = {"epoch": spec["epoch"], "leg": spec["state"], "worker": info.id,
                   "num_workers": info.num_workers, "rank_world": list(rank_world),
                   "worker_batches": 0}  # fmt: skip
        assert pos is not None  # only called in a worker
        return {
            "version": STATE_VERSION, "kind": "worker", "dataset": self.fingerprint,
            "fingerprint": self.plan_fingerprint, "seed": self.options["seed"],
            "batch_size": self.options["batch_size"], **pos,
        }  # fmt: skip

    def _load_worker_state(self, state: dict[str, Any]) -> None:
        info = get_worker_info()
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
        rank_world = list(self._read_spec()["rank_world"] or _dist_rank_world() or (0, 1))
        if list(state["rank_world"]) != rank_world:
            raise StateError(
                f"the state was saved by rank/world {state['rank_world']}; this is {rank_world} "
                "(StatefulDataLoader resumes on the same world shape only)"
            )
        self._worker_resume = {
            k: state[k]
            for k in ("epoch", "leg", "worker", "num_workers", "rank_world", "worker_batches")
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from ``state`` on the next iteration (any world shape: elastic re-plan).

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
        if state.get("version") != STATE_VERSION or "dataset" not in state:
            raise StateError(f"not a shardload StreamingDataset state: keys {sorted(state)}")
        if state["dataset"] != self.fingerprint:
            raise StateError(
                f"the state was saved for another dataset (fingerprint {state['dataset']}); this "
                f"one is {self.store.url}, arrays {list(self.selection.arrays)}, split "
                f"{self.split!r} (fingerprint {self.fingerprint})"
            )
        if state.get("fingerprint") != self.plan_fingerprint:
            raise StateError(
                f"the state was saved with other loader options (seed={state.get('seed')}, "
                f"batch_size={state.get('batch_size')}); this dataset has seed="
                f"{self.options['seed']}, batch_size={self.options['batch_size']}, mode="
                f"{self.options['mode']!r}, shuffle={self.options['shuffle']}"
            )
        if state.get("kind") == "worker":
            return self._load_worker_state(state)
        es = EpochState.from_dict(state)  # validates the fields
        if not keep_finished:
            rank, _ = self.rank_world()
            left = self._plan(min(rank, es.world_size - 1), es.world_size, es.num_workers, state)
            if left.batches_per_rank == 0:
                return
        self.epoch = int(state["epoch"])
        self._pending, self._leg, self._consumed = state, None, 0
        self._publish(state)

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()  # the Store pickles without open handles
        d["_ring"] = None  # shared by fork only: spawned workers use the stock hand-off
        return d


class StreamingDataLoader(DataLoader):
    """A ``DataLoader`` over a :class:`StreamingDataset` whose state resumes mid-epoch, and
    that moves batches from its workers in bundles.

    It counts the batches it yields in the main process; ``state_dict()`` carries the dataset's
    position, and after ``load_state_dict`` the next iteration yields exactly the remaining
    batches (same world: the identical continuation; another world or ``num_workers``: the
    unseen rows re-planned). ``batch_size`` defaults to None (the dataset makes batches).

    ``bundle``: batches a worker sends per DataLoader item (default: up to 8, within 16 MiB,
    :func:`plan_bundle`). Each item costs a round trip between the main process and a worker
    (about 0.2-0.6 ms of CPU), so bundles cut that cost by ``bundle``; the
    batches come out one at a time in exactly the order of a plain ``DataLoader`` over the same
    dataset, so results and resume points do not depend on it. ``prefetch_factor`` counts
    bundles here: about ``bundle * (prefetch_factor + 2)`` batches per worker are in flight
    (in ring slots, or in fresh memory beyond them). Bundles are matched to their worker and
    place, so ``in_order=False`` yields the same order too. No workers, or a ``collate_fn`` of
    your own (which would see bundles): no bundles, one batch per item as in ``DataLoader``.
    Only one loader should use a given dataset: the bundle size is set on it.
    """

    def __init__(
        self, dataset: StreamingDataset, *, batch_size: int | None = None,
        bundle: int | None = None, **kwargs: Any,
    ) -> None:  # fmt: skip
        if not isinstance(dataset, StreamingDataset):
            raise TypeError(
                f"StreamingDataLoader needs a StreamingDataset, got {type(dataset).__name__}"
            )
        if bundle is None:
            bundle = dataset.default_bundle
        if isinstance(bundle, bool) or not isinstance(bundle, int) or bundle < 1:
            raise ValueError(f"bundle must be an integer >= 1 or None, got {bundle!r}")
        super().__init__(dataset, batch_size=batch_size, **kwargs)
        own_collate = kwargs.get("collate_fn") is not None
        self.bundle = bundle
        self._bundled = not own_collate and batch_size is None and self.num_workers > 0
        dataset._counted_by_loader = True
        dataset._bundle = bundle if self._bundled else 0

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        ds: StreamingDataset = self.dataset  # type: ignore[assignment]
        ds._begin(self.num_workers)
        items: Iterator[Any] = super().__iter__()
        if self._bundled:
            rank, world = ds.rank_world()
            plan = ds._plan(rank, world, self.num_workers, ds._leg)
            counts = [wp.num_batches for wp in plan.workers[rank]]
            items = _unbundle(items, counts, self.bundle)
        for batch in items:
            ds._consumed += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"dataset": self.dataset.state_dict()}  # type: ignore[attr-defined]

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.dataset._load_state(state["dataset"], keep_finished=True)  # type: ignore[attr-defined]


class MapDataset(Dataset):
    """Random access by position in a selection: ``ds[i]`` is a dict of tensors for one row,
    plus ``"index"`` (its global row).

    Local npy stores memory-map their chunk files; other formats keep the last
    ``cache_chunks`` decoded chunks per array (an LRU), so nearby accesses decode once.
    Works with any sampler, e.g. ``DistributedSampler``.
    """

    def __init__(
        self,
        store: str | os.PathLike[str] | Store,
        *,
        split: str | None = None,
        arrays: Sequence[str] | None = None,
        chunks: Sequence[int] | None = None,
        rows: tuple[int, int] | None = None,
        cache_chunks: int = 8,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.store = open_store(store, storage_options=storage_options, arrays=arrays)
        self.selection = select_rows(
            self.store, split=split, chunks=chunks, rows=rows, arrays=arrays
        )
        self.cache_chunks = max(1, int(cache_chunks))
        self._cum = np.concatenate(([0], np.cumsum(self.selection.sizes)))
        self._bounds = np.asarray(self.store.manifest.chunk_bounds, dtype=np.int64)
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._mmap = self.store.manifest.format == "npy" and self.store.is_local

    def __len__(self) -> int:
        return int(self._cum[-1])

    def global_row(self, i: int) -> int:
        n = len(self)
        i = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= i < n:
            raise IndexError(f"index {i} out of range for a MapDataset of {n} rows")
        p = int(np.searchsorted(self._cum, i, "right")) - 1
        return int(self.selection.starts[p] + (i - self._cum[p]))

    def _chunk(self, name: str, c: int) -> np.ndarray:
        key = (name, c)
        arr = self._cache.get(key)
        if arr is None:
            if self._mmap:
                arr = self.store.reader.mmap_chunk(name, c)  # type: ignore[attr-defined]
            else:
                arr = self.store.read_chunk(name, c)
            self._cache[key] = arr
            while len(self._cache) > self.cache_chunks * len(self.selection.arrays):
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return arr

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        g = self.global_row(i)
        c = int(np.searchsorted(self._bounds, g, "right")) - 1
        out = {
            a: torch.from_numpy(np.array(self._chunk(a, c)[g - self._bounds[c]]))
            for a in self.selection.arrays
        }
        out[INDEX_KEY] = torch.tensor(g, dtype=torch.int64)
        return out

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_cache"] = OrderedDict()  # memory maps and decoded chunks stay in their process
        return d
