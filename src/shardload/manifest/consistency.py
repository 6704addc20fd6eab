"""A manifest's own consistency (pure): checked when a store is opened, before any array is
read or any buffer is sized from it.

A manifest is valid JSON written by ``prepare``; one edited by hand, damaged or written by
another tool can still contradict itself (a ``length`` beyond its chunks, a chunk bound past
the arrays' rows). Every later step trusts these numbers to size buffers and index chunks, so
a contradiction is a :class:`~shardload.errors.StoreError` naming the manifest here, not an
``IndexError`` or ``MemoryError`` in a DataLoader worker. What only the array files can tell
(their dtype, their row shape) each format's reader checks on open (``check_metadata``).
"""

from __future__ import annotations

import numpy as np

from shardload.errors import StoreError
from shardload.manifest.core import Manifest


def check_manifest_consistent(m: Manifest, *, where: str) -> None:
    """Raise :class:`StoreError` naming ``where`` (the manifest's path) unless ``m``'s length,
    chunk bounds, array shapes and splits agree with each other.

    >>> from shardload.manifest.core import ArrayInfo
    >>> x = ArrayInfo(name="x", shape=(10, 4), dtype="float32", chunk_rows=5, path="x")
    >>> check_manifest_consistent(
    ...     Manifest(format="npy", length=10, chunk_bounds=(0, 5, 10), arrays={"x": x}), where="m"
    ... )
    >>> check_manifest_consistent(
    ...     Manifest(format="npy", length=11, chunk_bounds=(0, 5, 10), arrays={"x": x}), where="m"
    ... )
    Traceback (most recent call last):
    ...
    shardload.errors.StoreError: m contradicts itself: length is 11 but chunk_bounds end at 10
    """

    def bad(what: str) -> StoreError:
        return StoreError(f"{where} contradicts itself: {what}")

    b = m.chunk_bounds
    if m.length < 0:
        raise bad(f"length is {m.length}")
    if not b or b[0] != 0:
        raise bad(f"chunk_bounds must start at 0, they start {list(b[:1])}")
    falls = np.flatnonzero(np.diff(m.bounds) < 0)  # thousands of chunks
    if len(falls):
        i = int(falls[0])
        raise bad(f"chunk_bounds fall from {b[i]} to {b[i + 1]} (chunk {i})")
    if b[-1] != m.length:
        raise bad(f"length is {m.length} but chunk_bounds end at {b[-1]}")
    for name, a in m.arrays.items():
        if not a.shape or a.shape[0] != m.length:
            raise bad(f"array {name!r} has shape {list(a.shape)}; the store has {m.length} rows")
        if any(s < 0 for s in a.shape):
            raise bad(f"array {name!r} has shape {list(a.shape)}")
    n = m.num_chunks
    for split, chunks in m.splits.items():
        ids = np.asarray(chunks, dtype=np.int64)
        out = ids[(ids < 0) | (ids >= n)]
        if len(out):
            raise bad(
                f"split {split!r} lists chunk(s) {out[:5].tolist()}; the store has {n} chunks"
            )
    for split, (lo, hi) in m.split_rows.items():
        if not 0 <= lo <= hi <= m.length:
            raise bad(f"split {split!r} has rows [{lo}, {hi}); the store has {m.length} rows")
    axis = m.time_axis  # a malformed one: StoreError from TimeAxis.from_dict
    if axis is not None and axis.length != m.length:
        raise bad(f"its time axis has {axis.length} dates; the store has {m.length} rows")
