"""Map-style access to a store: :class:`MapDataset` (random access by row, for any sampler)."""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from shardload.errors import StoreError
from shardload.load.batches import INDEX_KEY
from shardload.load.dated import DATES_KEY
from shardload.load.spec import LoadSpec
from shardload.store.core import Store
from shardload.torch.closing import ClosingDataset
from shardload.torch.transport import guard_worker_exit

__all__ = ["MapDataset"]


class MapDataset(ClosingDataset, Dataset):
    """Random access by position in a selection: ``ds[i]`` is a dict of tensors for one row,
    plus ``"index"`` (its global row).

    Local npy stores memory-map their chunk files; other formats keep the last
    ``cache_chunks`` decoded chunks per array (an LRU), so nearby accesses decode once.
    Works with any sampler, e.g. ``DistributedSampler``. A dated store's missing dates are
    not among the positions (``missing_dates`` as in :func:`shardload.iter_batches`).

    With ``window=K`` (a dated store, see ``iter_batches``): ``ds[i]`` is the ``i``-th window
    of ``K`` states every ``window_step`` rows whose every date exists, ``NAME`` of shape
    ``(K, *row_shape)``, ``"dates"`` (int64 seconds since 1970) and ``"index"`` (its first row).

    ``close()`` (or a ``with`` block) closes the store it opened from a path or URL and drops
    its cached chunks and memory maps; a DataLoader worker closes its own copy as it exits.
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
        missing_dates: str = "skip",
        window: int | None = None,
        window_step: int | None = None,
    ) -> None:
        # the rows and arrays resolved as iter_batches resolves them, in row order
        spec = LoadSpec.build(
            store,
            batch_size=1,
            split=split,
            chunks=chunks,
            rows=rows,
            arrays=arrays,
            shuffle=False,
            storage_options=storage_options,
            missing_dates=missing_dates,
            window=window,
            window_step=window_step,
        )
        self.store, self.selection = spec.store, spec.selection
        self._own_store(store)  # a path or URL: close() closes what was opened here
        self.window = spec.window  # (K, step) or None
        ragged = spec.ragged
        if ragged:  # a row of one has no fixed shape: default collation cannot stack it
            raise StoreError(
                f"MapDataset serves fixed-shape arrays; {ragged} of {self.store.url} are "
                "variable-length: use StreamingDataset (padded batches with NAME_length), or "
                "pass arrays= without them"
            )
        self.cache_chunks = max(1, int(cache_chunks))
        self._cum = np.concatenate(([0], np.cumsum(self.selection.sizes)))
        self._bounds = np.asarray(self.store.manifest.chunk_bounds, dtype=np.int64)
        self._cache: OrderedDict[tuple[str, int], np.ndarray] = OrderedDict()
        self._mmap = (
            self.store.manifest.format == "npy"
            and self.store.is_local
            and hasattr(self.store.reader, "mmap_chunk")  # not windows cut at load time
        )

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
        guard_worker_exit()
        self._close_at_worker_exit()  # this worker's own copy of the store
        g = self.global_row(i)
        if self.window is not None:
            return self._window(g)
        c = int(np.searchsorted(self._bounds, g, "right")) - 1
        out = {
            a: torch.from_numpy(np.array(self._chunk(a, c)[g - self._bounds[c]]))
            for a in self.selection.arrays
        }
        out[INDEX_KEY] = torch.tensor(g, dtype=torch.int64)
        return out

    def _window(self, g: int) -> dict[str, torch.Tensor]:
        """The window of dates starting at row ``g``: each state from its (cached) chunk."""
        assert self.window is not None and self.store.time is not None
        k, step = self.window
        rows = g + step * np.arange(k, dtype=np.int64)
        chunks = np.searchsorted(self._bounds, rows, "right") - 1
        out = {
            a: torch.from_numpy(
                np.stack(
                    [
                        self._chunk(a, int(c))[int(r - self._bounds[c])]
                        for r, c in zip(rows, chunks, strict=True)
                    ]
                )
            )
            for a in self.selection.arrays
        }
        out[DATES_KEY] = torch.from_numpy(self.store.time.dates[rows].view(np.int64))
        out[INDEX_KEY] = torch.tensor(g, dtype=torch.int64)
        return out

    def close(self) -> None:
        """As :meth:`ClosingDataset.close`, and the cached chunks (memory maps) dropped."""
        self._cache.clear()
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        d = self.__dict__.copy()
        d["_cache"] = OrderedDict()  # memory maps and decoded chunks stay in their process
        return d
