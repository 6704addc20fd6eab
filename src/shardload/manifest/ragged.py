"""Variable-length (ragged) arrays: one 1-D array of any length per sample.

A ragged array is held as ``values`` (all samples' values, concatenated in row order) and
``lengths`` (one int64 per sample); ``offsets`` (``N + 1``, ``offsets[i]:offsets[i + 1]`` are
row ``i``'s values) is their prefix sum. Pure numpy: the read side and the loader use it.

>>> r = RaggedRows(np.array([1, 2, 3, 4, 5, 6], np.float32), np.array([2, 0, 4]))
>>> r.padded().tolist()
[[1.0, 2.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [3.0, 4.0, 5.0, 6.0]]
>>> [a.tolist() for a in r.to_list()]
[[1.0, 2.0], [], [3.0, 4.0, 5.0, 6.0]]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

#: Suffix of the key holding a ragged array's row lengths in a batch: ``NAME_length``.
LENGTH_SUFFIX = "_length"


class RaggedRows(NamedTuple):
    """Rows of a ragged array: ``values`` (1-D, concatenated) and ``lengths`` (int64, one per
    row). What :meth:`shardload.store.core.Store.read` returns for a ragged array."""

    values: np.ndarray
    lengths: np.ndarray

    @property
    def offsets(self) -> np.ndarray:
        return offsets_of(self.lengths)

    def padded(self, width: int | None = None) -> np.ndarray:
        """``(rows, width)`` with each row's values first and zeros after (``width``: the
        longest row by default)."""
        return pad_rows(self.values, self.lengths, width)

    def to_list(self) -> list[np.ndarray]:
        """One array per row (views of ``values``)."""
        off = self.offsets
        return [self.values[off[i] : off[i + 1]] for i in range(len(self.lengths))]

    @property
    def num_rows(self) -> int:
        return len(self.lengths)


def offsets_of(lengths: np.ndarray) -> np.ndarray:
    """``N + 1`` int64 offsets from ``N`` lengths (a prefix sum starting at 0)."""
    out = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def pad_rows(values: np.ndarray, lengths: np.ndarray, width: int | None = None) -> np.ndarray:
    """Rows of ``values`` cut by ``lengths``, zero-padded to ``width`` (default: the longest)."""
    lengths = np.asarray(lengths, np.int64)
    width = int(lengths.max()) if width is None and len(lengths) else int(width or 0)
    out = np.zeros((len(lengths), width), values.dtype)
    fill_padded(out, values, lengths)
    return out


def fill_padded(out: np.ndarray, values: np.ndarray, lengths: np.ndarray) -> None:
    """Write rows of ``values`` (cut by ``lengths``) into the zeroed ``out`` left-aligned."""
    total = int(lengths.sum())
    if total == 0:
        return
    if int(lengths.max()) > out.shape[1]:
        raise ValueError(f"a row of {int(lengths.max())} values does not fit {out.shape[1]}")
    # a boolean mask of the cells that hold values: in C order they are the rows' values in
    # order (one masked assignment; (rows, cols) fancy indexing took 4x as long)
    out[np.arange(out.shape[1]) < lengths[:, None]] = values[:total]


def gather_padded(
    values: np.ndarray, offsets: np.ndarray, rows: np.ndarray, out: np.ndarray
) -> np.ndarray:
    """Rows ``rows`` (indices into ``offsets``) of a ragged buffer written left-aligned into
    the zeroed ``out`` (``(len(rows), width)``), without an intermediate copy; their lengths."""
    rows = np.asarray(rows, np.int64)
    lo = offsets[rows]
    lengths = offsets[rows + 1] - lo
    if len(rows) and out.shape[1]:
        cols = np.arange(out.shape[1])
        mask = cols < lengths[:, None]
        out[mask] = values[(lo[:, None] + cols)[mask]]
    return lengths


def take_rows(values: np.ndarray, offsets: np.ndarray, rows: np.ndarray) -> RaggedRows:
    """The rows ``rows`` (indices into ``offsets``) of a ragged buffer, values gathered."""
    rows = np.asarray(rows, np.int64)
    lo, hi = offsets[rows], offsets[rows + 1]
    lengths = hi - lo
    total = int(lengths.sum())
    if total == 0:
        return RaggedRows(values[:0].copy(), lengths)
    idx = np.arange(total) - np.repeat(offsets_of(lengths)[:-1] - lo, lengths)
    return RaggedRows(values[idx], lengths)


def concat_rows(parts: Sequence[RaggedRows]) -> RaggedRows:
    if len(parts) == 1:
        return parts[0]
    return RaggedRows(
        np.concatenate([p.values for p in parts]), np.concatenate([p.lengths for p in parts])
    )


def as_ragged_block(rows: Any, *, name: str, dtype: np.dtype) -> RaggedRows:
    """A sequence of per-sample 1-D arrays as ``(values, lengths)``; raises ``ValueError``
    naming the sample that is not 1-D."""
    arrs = []
    for i, r in enumerate(rows):
        a = np.asarray(r)
        if a.ndim != 1:
            raise ValueError(
                f"array {name!r}: sample {i} has shape {a.shape}; a variable-length array needs "
                "one 1-D array per sample"
            )
        arrs.append(a)
    lengths = np.array([len(a) for a in arrs], np.int64)
    values = np.concatenate(arrs).astype(dtype, copy=False) if arrs else np.zeros(0, dtype)
    return RaggedRows(np.ascontiguousarray(values, dtype=dtype), lengths)
