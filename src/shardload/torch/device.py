"""Batches to an accelerator: :class:`DevicePrefetcher` (pinned buffers, non-blocking copies on
a side stream, ``depth`` batches ahead).

On CUDA each batch's tensors are copied into page-locked (pinned) host buffers (skipped for
tensors already pinned, e.g. by ``DataLoader(pin_memory=True)``), then to the device with
``non_blocking=True`` on a copy stream of their own, so the copy of batch ``k + 1`` overlaps
the compute on batch ``k``. The training loop's stream waits for a batch's copy event before
it gets the batch (``wait_event``: the host does not block), and each device tensor is marked
as used by that stream (``record_stream``) so the caching allocator does not hand its memory
to the copy stream too early. A set of pinned buffers is reused once the copy that read it has
finished (its event, checked before the set is refilled ``depth + 1`` batches later), so
pinned memory is ``depth + 1`` batches, allocated once.

Elsewhere (CPU, or a device without streams) it is a plain ``.to(device)`` of each batch, in
order: the same batches, so code written for the GPU runs unchanged on a laptop.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DevicePrefetcher", "TransferStats", "plan_pinned_slots"]


def plan_pinned_slots(depth: int) -> int:
    """Sets of pinned buffers a prefetcher of ``depth`` batches ahead needs: the batches in
    flight and the one being filled (pure).

    >>> plan_pinned_slots(2)
    3
    """
    if depth < 1:
        raise ValueError(f"depth must be >= 1, got {depth}")
    return depth + 1


@dataclass
class TransferStats:
    """What a prefetcher moved: batches, bytes, bytes staged through its pinned buffers (not
    already pinned), and ``waits``: batches whose copy had not finished when the loop asked
    for them (CUDA only; the loop's stream then waits for it on the device)."""

    batches: int = 0
    bytes: int = 0
    staged_bytes: int = 0
    waits: int = 0


class DevicePrefetcher:
    """Iterate ``loader`` (batches: mappings of tensors, or tensors) with every tensor on
    ``device``.

    Parameters
    ----------
    loader
        Any iterable of batches (a ``StreamingDataLoader``, a ``DataLoader``, a generator).
    device
        Where batches go (``"cuda"``, ``"cuda:1"``, ``torch.device``, ``"cpu"``).
    depth
        Batches copied ahead of the one the loop holds (CUDA).
    pin
        Stage batches that are not pinned through reused pinned buffers (CUDA). Without it a
        pageable tensor's copy is synchronous, whatever ``non_blocking`` says.
    """

    def __init__(
        self,
        loader: Iterable[Any],
        device: str | torch.device,
        *,
        depth: int = 2,
        pin: bool = True,
    ) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.slots = plan_pinned_slots(depth)
        self.depth = depth
        self.pin = pin
        self.stats = TransferStats()
        self._pinned: list[dict[str, torch.Tensor]] = [{} for _ in range(self.slots)]

    @property
    def uses_streams(self) -> bool:
        return self.device.type == "cuda" and torch.cuda.is_available()

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[Any]:
        if not self.uses_streams:
            for batch in self.loader:
                self.stats.batches += 1
                self.stats.bytes += _nbytes(batch)
                yield _map(batch, lambda t: t.to(self.device))
            return
        yield from self._cuda()

    def _stage(self, slot: int, key: str, t: torch.Tensor) -> torch.Tensor:
        """``t`` in pinned host memory: itself if pinned, else a copy in slot ``slot``'s buffer."""
        if not self.pin or t.device.type != "cpu" or t.is_pinned():
            return t
        bufs = self._pinned[slot]
        buf = bufs.get(key)
        if buf is None or buf.numel() < t.numel() or buf.dtype != t.dtype:
            buf = bufs[key] = torch.empty(t.numel(), dtype=t.dtype, pin_memory=True)
        view = buf[: t.numel()].view(t.shape)
        view.copy_(t)
        self.stats.staged_bytes += t.numel() * t.element_size()
        return view

    def _cuda(self) -> Iterator[Any]:
        stream = torch.cuda.Stream(self.device)
        inflight: deque[tuple[Any, torch.cuda.Event]] = deque()
        last_use: list[torch.cuda.Event | None] = [None] * self.slots
        it = iter(self.loader)
        n = 0

        def submit() -> bool:
            nonlocal n
            batch = next(it, None)
            if batch is None:
                return False
            slot = n % self.slots
            n += 1
            done = last_use[slot]
            if done is not None:  # its copy, depth + 1 batches ago, has read the buffers
                done.synchronize()
            keys = iter(range(1 << 30))
            host = _map(batch, lambda t: self._stage(slot, f"{next(keys)}", t))
            with torch.cuda.stream(stream):
                dev = _map(host, lambda t: t.to(self.device, non_blocking=True))
                event = torch.cuda.Event()
                event.record(stream)
            last_use[slot] = event
            inflight.append((dev, event))
            self.stats.batches += 1
            self.stats.bytes += _nbytes(batch)
            return True

        while len(inflight) < self.depth and submit():
            pass
        current = torch.cuda.current_stream(self.device)
        while inflight:
            dev, event = inflight.popleft()
            if not event.query():
                self.stats.waits += 1
            current.wait_event(event)  # the loop's stream waits; the host does not
            _map(dev, lambda t: (t.record_stream(current), t)[1])
            submit()
            yield dev


def _map(batch: Any, fn: Any) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, Mapping):
        return {k: _map(v, fn) for k, v in batch.items()}
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(v, fn) for v in batch)
    return batch


def _nbytes(batch: Any) -> int:
    total = 0

    def add(t: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    _map(batch, add)
    return total
