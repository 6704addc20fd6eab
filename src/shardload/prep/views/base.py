"""What a view is: a lazy mapping from a dataset to named, sample-major arrays.

A view knows its length and array specs without reading data, and materialises any row range
``[start, stop)`` of all its arrays with ``read`` -- reading from the lazy source only the slab
that those rows need. That is how shardload rechunks along the sample axis without a dask
rechunk graph: each write task reads exactly its rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shardload.errors import ViewError
from shardload.manifest.core import ArraySpec


@runtime_checkable
class View(Protocol):
    """A dataset seen as named sample-major arrays of equal length."""

    @property
    def length(self) -> int: ...

    @property
    def specs(self) -> Mapping[str, ArraySpec]: ...

    @property
    def static(self) -> Mapping[str, Any]:
        """JSON-able data shared by all samples (e.g. a graph's edge index)."""
        ...

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` of every array, as numpy arrays of the spec's dtype."""
        ...


def check_numeric(name: str, dtype: np.dtype, *, where: str = "") -> None:
    """Refuse dtypes a training loop cannot use (objects such as cftime, strings, datetimes)."""
    dt = np.dtype(dtype)
    if dt.kind not in "biuf":
        loc = f" in {where}" if where else ""
        hint = (
            " (cftime/datetime values: drop the variable or decode it to numbers)"
            if dt.kind in "OMm"
            else ""
        )
        raise ViewError(f"variable {name!r}{loc} has non-numeric dtype {dt}{hint}")


def check_lengths(lengths: Mapping[str, int]) -> int:
    """All arrays of a view must have the same number of samples; return it."""
    values = set(lengths.values())
    if len(values) > 1:
        detail = ", ".join(f"{k}={v}" for k, v in lengths.items())
        raise ViewError(f"mismatched sample lengths between arrays: {detail}")
    return values.pop() if values else 0


def check_features(name: str, sizes: Mapping[Any, int], sample_dims: Any, *, where: str) -> None:
    """Refuse a variable with no values per sample (a feature dim of length 0): a store row
    cannot be empty, and the chunk planner would divide by a 0-byte row."""
    empty = [str(d) for d, n in sizes.items() if d not in sample_dims and n == 0]
    if empty:
        raise ViewError(
            f"variable {name!r} in {where} has no values per sample: its dim(s) {empty} have "
            "length 0; drop it from the config (or select a source where it is not empty)"
        )


def check_rows_not_empty(specs: Mapping[str, ArraySpec]) -> None:
    """Refuse an array whose rows hold no values (any view, a function view's included)."""
    for k, s in specs.items():
        if not s.ragged and int(np.prod(s.shape[1:], dtype=np.int64)) == 0:
            raise ViewError(
                f"array {k!r} has rows of shape {tuple(s.shape[1:])}: no values per sample "
                "(a feature axis of length 0); drop the variable(s) that make it empty"
            )
