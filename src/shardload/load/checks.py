"""Checks that run before the loader takes a raw pointer or gathers with ``mode="clip"``.

The scatter reader writes into batch memory through addresses (``preadv``), and the gather path
uses ``np.take(..., mode="clip")`` (``mode="raise"`` would buffer every output); neither can
catch a wrong array or a wrong index itself: a batch array of the wrong dtype, shape or layout
corrupts the heap, and an out-of-range index silently repeats an edge row. So a caller's
``allocate`` result is checked before any pointer is taken, and a shuffle group's indices once
per group (a ``min`` and a ``max``: about 0.1 ms for 100k rows, against the milliseconds the
group takes to read).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from shardload.errors import PlanError
from shardload.load.recycle import Allocate, Specs


def check_batch_arrays(batch: object, specs: Specs, rows: int) -> None:
    """Raise :class:`PlanError` unless ``batch`` maps every key of ``specs`` to a writable,
    C-contiguous numpy array of that dtype and shape ``(rows, *row_shape)``."""
    if not isinstance(batch, Mapping):
        raise PlanError(
            f"allocate({rows}) returned {type(batch).__name__}, not a dict of numpy arrays "
            f"(keys {list(specs)}) or None"
        )
    for key, (row_shape, dtype) in specs.items():
        arr = batch.get(key)
        if (  # the common case first, cheaply (a few us per batch): no message is built
            isinstance(arr, np.ndarray)
            and arr.dtype == dtype
            and arr.shape == (rows, *row_shape)
            and arr.flags.c_contiguous
            and arr.flags.writeable
        ):
            continue
        want = (
            f"a writable C-contiguous numpy array of dtype {dtype} and shape {(rows, *row_shape)}"
        )
        if arr is None:
            raise PlanError(f"allocate({rows}) returned no array {key!r} (expected {want})")
        if not isinstance(arr, np.ndarray):
            raise PlanError(f"allocate({rows})[{key!r}] is a {type(arr).__name__}; expected {want}")
        got = []
        if arr.dtype != dtype:
            got.append(f"dtype {arr.dtype}")
        if arr.shape != (rows, *row_shape):
            got.append(f"shape {arr.shape}")
        if not arr.flags.c_contiguous:
            got.append("a non-C-contiguous layout")
        if not arr.flags.writeable:
            got.append("a read-only array")
        raise PlanError(f"allocate({rows})[{key!r}] has {', '.join(got)}; expected {want}")


def checked_allocate(allocate: Allocate, specs: Specs) -> Allocate:
    """``allocate`` whose batches are checked (:func:`check_batch_arrays`) as they come."""

    def alloc(rows: int) -> dict[str, np.ndarray] | None:
        out = allocate(rows)
        if out is not None:
            check_batch_arrays(out, specs, rows)
        return out

    return alloc


def check_indices(index: np.ndarray, size: int, what: str) -> None:
    """Raise :class:`PlanError` unless every entry of ``index`` is within ``0..size-1``."""
    if len(index) and (int(index.min()) < 0 or int(index.max()) >= size):
        raise PlanError(
            f"{what}: indices {int(index.min())}..{int(index.max())} are outside 0..{size - 1} "
            "(a planning bug: please report it)"
        )
