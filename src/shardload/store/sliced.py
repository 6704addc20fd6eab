"""A store seen through one rank's slice of its rows (read groups: :mod:`shardload.plan.read_groups`).

:class:`SlicedStore` is a :class:`~shardload.store.core.Store` whose arrays have the sliced
row shape and whose reader returns only the slice, so every group reader of ``shardload.load``
reads it as any store. What is read from storage:

- raw rows in local files (npy stacks, uncompressed shardload Zarr: ``RawChunks``): only the
  slice, one ``pread`` per run of the slice (a row of shape ``(V, C)`` split along its last
  axis is ``V`` runs), when a run holds at least ``RUN_MIN_BYTES``; shorter runs cost a
  syscall each for less than a page or two, so those rows are read whole and sliced;
- everything else (compressed chunks decode whole, HDF5, URLs): whole rows, then the slice.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np

from shardload.errors import ChunkReadError
from shardload.formats.base import ArrayReader, RawChunks, ReadsInto, ReadsSpansInto
from shardload.manifest.core import Manifest
from shardload.plan.read_groups import RowSlice
from shardload.store.core import Store

__all__ = ["RUN_MIN_BYTES", "SlicedReader", "SlicedStore"]

#: A slice's runs shorter than this are not read on their own: the rows are read whole.
RUN_MIN_BYTES = 16 << 10


def _index(sl: RowSlice) -> tuple[slice, ...]:
    axis, lo, hi = sl
    return (slice(None),) * (axis + 1) + (slice(lo, hi),)


def sliced_manifest(manifest: Manifest, slices: Mapping[str, RowSlice]) -> Manifest:
    """``manifest`` with each sliced array's row shape cut to its slice (feature names, which
    describe whole rows, left out)."""
    arrays = dict(manifest.arrays)
    for name, (axis, lo, hi) in slices.items():
        info = arrays[name]
        shape = list(info.shape)
        shape[axis + 1] = hi - lo
        arrays[name] = dataclasses.replace(info, shape=tuple(shape), features=None)
    return dataclasses.replace(manifest, arrays=arrays)


class SlicedReader:
    """Rows of ``store`` cut to ``slices`` (arrays not listed: whole rows)."""

    def __init__(self, store: Store, slices: Mapping[str, RowSlice]) -> None:
        self.store, self.slices = store, dict(slices)
        self.base: ArrayReader = store.reader

    def read(self, name: str, start: int, stop: int) -> np.ndarray:
        sl = self.slices.get(name)
        if sl is None:
            return self.base.read(name, start, stop)
        out = np.empty((stop - start, *self._row_shape(name)), self._dtype(name))
        self.read_into(name, start, stop, out)
        return out

    def read_into(self, name: str, start: int, stop: int, out: np.ndarray) -> None:
        sl = self.slices.get(name)
        if sl is None:
            if isinstance(self.base, ReadsInto):
                self.base.read_into(name, start, stop, out)
            else:
                out[...] = self.base.read(name, start, stop)
        elif (
            self._run_bytes(name, sl) >= RUN_MIN_BYTES
            and out.flags.c_contiguous
            and (self._raw(name, start, stop))
        ):
            self._read_runs(name, start, stop, out, sl)
        else:
            out[...] = self.base.read(name, start, stop)[_index(sl)]

    def read_spans_into(
        self, name: str, spans: Sequence[tuple[int, int]], outs: Sequence[np.ndarray]
    ) -> None:
        sl = self.slices.get(name)
        if isinstance(self.base, ReadsSpansInto) and (
            sl is None or self._run_bytes(name, sl) < RUN_MIN_BYTES or not self._raw(name, 0, 0)
        ):  # whole rows through the base's one call (a shard opened once), then the slices
            if sl is None:
                self.base.read_spans_into(name, spans, outs)
                return
            info = self.store.manifest.arrays[name]
            whole = [np.empty((b - a, *info.row_shape), info.dtype) for a, b in spans]
            self.base.read_spans_into(name, spans, whole)
            for w, out in zip(whole, outs, strict=True):
                out[...] = w[_index(sl)]
            return
        for (a, b), out in zip(spans, outs, strict=True):
            self.read_into(name, a, b, out)

    def close(self) -> None:
        """Nothing of its own: the base store's reader is the base store's to close."""

    # -- raw rows: only the slice's bytes ------------------------------------------------------
    def _row_shape(self, name: str) -> tuple[int, ...]:
        shape = list(self.store.manifest.arrays[name].row_shape)
        axis, lo, hi = self.slices[name]
        shape[axis] = hi - lo
        return tuple(shape)

    def _dtype(self, name: str) -> np.dtype:
        return np.dtype(self.store.manifest.arrays[name].dtype)

    def _run_bytes(self, name: str, sl: RowSlice) -> int:
        axis, lo, hi = sl
        inner = int(np.prod(self.store.manifest.arrays[name].row_shape[axis + 1 :], dtype=np.int64))
        return (hi - lo) * inner * self._dtype(name).itemsize

    def _raw(self, name: str, start: int, stop: int) -> bool:
        """Whether the rows' chunks are raw rows in local files."""
        if not isinstance(self.base, RawChunks):
            return False
        bounds = self.store.manifest.chunk_bounds
        i = max(0, int(np.searchsorted(bounds, start, "right")) - 1)
        return cast(RawChunks, self.base).raw_chunk(name, min(i, len(bounds) - 2)) is not None

    def _read_runs(self, name: str, start: int, stop: int, out: np.ndarray, sl: RowSlice) -> None:
        """One ``pread`` per run of the slice, straight into ``out``."""
        axis, lo, _ = sl
        row_shape = self.store.manifest.arrays[name].row_shape
        item = self._dtype(name).itemsize
        inner = int(np.prod(row_shape[axis + 1 :], dtype=np.int64)) * item
        lead = int(np.prod(row_shape[:axis], dtype=np.int64))
        run, stride = self._run_bytes(name, sl), row_shape[axis] * inner
        dst = out.reshape(-1).view(np.uint8).reshape(stop - start, lead, run)
        bounds = self.store.manifest.chunk_bounds
        reader = cast(RawChunks, self.base)
        pos = start
        while pos < stop:
            i = int(np.searchsorted(bounds, pos, "right")) - 1
            c0, end = int(bounds[i]), min(stop, int(bounds[i + 1]))
            raw = reader.raw_chunk(name, i)
            assert raw is not None  # _raw said so for this store
            fd = os.open(raw.path, os.O_RDONLY)
            try:
                for r in range(pos, end):
                    at = raw.offset + (r - c0) * raw.row_bytes + lo * inner
                    for j in range(lead):
                        got = os.preadv(fd, [dst[r - start, j]], at + j * stride)
                        if got != run:
                            raise ChunkReadError(
                                f"chunk {i} of array {name!r} in {self.store.url} is truncated: "
                                f"{raw.path} (expected {run} bytes at offset "
                                f"{at + j * stride}, got {got})"
                            )
            finally:
                os.close(fd)
            pos = end


class SlicedStore(Store):
    """``base`` with the rows of the arrays in ``slices`` cut to their slice (one rank of a
    read group). Pickles as the base store does; its reader wraps the base store's."""

    def __init__(self, base: Store, slices: Mapping[str, RowSlice]) -> None:
        super().__init__(
            sliced_manifest(base.manifest, slices),
            base.fs,
            base.root,
            url=base.url,
            verify=base.verify,
        )
        self.base, self.slices = base, dict(slices)

    @property
    def reader(self) -> ArrayReader:
        if self._reader is None or self._pid != os.getpid():
            self._reader = SlicedReader(self.base, self.slices)
            self._pid = os.getpid()
        return self._reader
