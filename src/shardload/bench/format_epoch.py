"""One timed, checked epoch of ``shardload bench formats`` (the torch layer of the benchmark).

A map-style format is read through a ``torch.utils.data.DataLoader`` over a dataset whose
``__getitem__`` calls the format's reader; WebDataset through its own pipeline (an
``IterableDataset``). Batches are ``(indices, values, lengths)``: the samples concatenated,
which is each format's ragged form and costs the same copy for fixed and variable lengths.

The main process checks every sample it receives against the digest of the sample written
(XXH3-64 of its bytes), and at the end that the epoch held each sample exactly once, so a
reader that returns wrong, missing or repeated samples fails loudly instead of winning.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import xxhash

from shardload.bench.format_data import DTYPE
from shardload.errors import ShardloadError


class FormatCheckError(ShardloadError):
    """A format's reader returned a sample that differs from the one written, or a wrong set."""


def collate(items: list[tuple[int, np.ndarray]]) -> tuple[Any, Any, Any]:
    """``[(index, sample), ...] -> (indices, concatenated values, lengths)`` as tensors."""
    import torch

    indices = torch.tensor([i for i, _ in items], dtype=torch.int64)
    lengths = torch.tensor([len(a) for _, a in items], dtype=torch.int64)
    values = np.concatenate([a for _, a in items]) if items else np.empty(0, DTYPE)
    return indices, torch.from_numpy(np.asarray(values, dtype=DTYPE)), lengths


class EpochChecker:
    """Checks each received sample against its digest and the epoch for completeness."""

    def __init__(self, hashes: np.ndarray, *, what: str) -> None:
        self.hashes = hashes
        self.what = what
        self.seen = np.zeros(len(hashes), dtype=bool)
        self.samples = 0
        self.nbytes = 0

    def check(self, indices: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
        if int(lengths.sum()) != len(values):
            raise FormatCheckError(
                f"{self.what}: a batch holds {len(values)} values, its lengths say {lengths.sum()}"
            )
        ends = np.cumsum(lengths)
        start = 0
        for i, end in zip(indices.tolist(), ends.tolist(), strict=True):
            if not 0 <= i < len(self.hashes):
                raise FormatCheckError(f"{self.what}: sample index {i} out of range")
            if self.seen[i]:
                raise FormatCheckError(f"{self.what}: sample {i} read twice in one epoch")
            if xxhash.xxh3_64_intdigest(values[start:end].data) != int(self.hashes[i]):
                raise FormatCheckError(
                    f"{self.what}: sample {i} differs from the sample written "
                    f"({end - start} values read; XXH3-64 mismatch)"
                )
            self.seen[i] = True
            start = end
        self.samples += len(indices)
        self.nbytes += values.nbytes

    def finish(self) -> None:
        missing = np.flatnonzero(~self.seen)
        if len(missing):
            raise FormatCheckError(
                f"{self.what}: the epoch missed {len(missing)} of {len(self.seen)} samples "
                f"(first: {missing[:5].tolist()})"
            )


class RssSampler:
    """Peak resident memory of this process and its children (DataLoader workers), summed,
    sampled every ``interval_s`` in a thread. Memory-mapped file pages count once per process
    that touched them, so the sum over-states shared pages."""

    def __init__(self, interval_s: float = 0.02) -> None:
        import psutil

        self._proc = psutil.Process()
        self._interval_s = interval_s
        self._stop = threading.Event()
        self.start = self.peak = self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True, name="rss-sampler")

    def sample(self) -> int:
        import psutil

        total = self._proc.memory_info().rss
        for child in self._proc.children(recursive=True):
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                total += child.memory_info().rss
        return total

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.peak = max(self.peak, self.sample())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.sample())


class _Samples:
    """Map-style dataset over a reader: ``ds[i] -> (i, sample i)`` (a torch ``Dataset``)."""

    def __init__(self, reader: Any, length: int) -> None:
        self.reader = reader
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: int) -> tuple[int, np.ndarray]:
        return i, self.reader.read(i)


def map_loader(
    reader: Any, *, num_samples: int, shuffle: bool, seed: int, batch_size: int, workers: int
) -> Iterable[Any]:
    """A DataLoader over ``reader`` in a seeded permutation (shuffle) or in order."""
    from torch.utils.data import DataLoader

    order = (
        np.random.default_rng(seed).permutation(num_samples) if shuffle else np.arange(num_samples)
    )
    return DataLoader(
        _Samples(reader, num_samples),  # type: ignore[arg-type]
        batch_size=batch_size,
        sampler=order.tolist(),
        num_workers=workers,
        collate_fn=collate,
    )


def iterable_loader(dataset: Any, *, workers: int) -> Iterable[Any]:
    """A DataLoader over an iterable pipeline that yields collated batches itself."""
    from torch.utils.data import DataLoader

    return DataLoader(dataset, batch_size=None, num_workers=workers)


def time_epoch(
    make_loader: Callable[[], Iterable[Any]],
    hashes: np.ndarray,
    *,
    what: str,
    max_epoch_s: float,
) -> dict[str, Any]:
    """Iterate one epoch, checking every batch; stop after ``max_epoch_s`` (then the epoch is
    reported as capped and its completeness is not checked).

    The rate is taken after the first batch (worker start-up and file opens are reported
    apart as ``first_batch_s``), unless the epoch had a single batch.
    """
    checker = EpochChecker(hashes, what=what)
    capped = False
    t0 = time.perf_counter()
    loader = iter(make_loader())
    first_s: float | None = None
    first_samples = first_bytes = 0
    with RssSampler() as rss:
        try:
            for indices, values, lengths in loader:
                checker.check(indices.numpy(), values.numpy(), lengths.numpy())
                now = time.perf_counter()
                if first_s is None:
                    first_s = now - t0
                    first_samples, first_bytes = checker.samples, checker.nbytes
                if now - t0 > max_epoch_s:
                    capped = checker.samples < len(hashes)
                    break
        finally:
            del loader  # shuts the workers down
    total_s = time.perf_counter() - t0
    if not capped:
        checker.finish()
    if first_s is None:
        raise FormatCheckError(f"{what}: the epoch yielded no batch")
    steady_s = total_s - first_s
    samples, nbytes = checker.samples - first_samples, checker.nbytes - first_bytes
    if samples == 0 or steady_s <= 0:
        steady_s, samples, nbytes = total_s, checker.samples, checker.nbytes
    return {
        "samples_read": checker.samples,
        "epoch_s": total_s,
        "first_batch_s": first_s,
        "samples_per_s": samples / steady_s,
        "MB_per_s": nbytes / steady_s / 1e6,
        "peak_rss_MB": rss.peak / 1e6,
        "rss_before_MB": rss.start / 1e6,
        "complete_epoch": not capped,
        "capped": capped,
    }
