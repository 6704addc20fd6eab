"""What a view is: a lazy mapping from a dataset to named, sample-major arrays.

A view knows its length and array specs without reading data, and materialises any row range
``[start, stop)`` of all its arrays with ``read`` -- reading from the lazy source only the slab
that those rows need. That is how shardload rechunks along the sample axis without a dask
rechunk graph: each write task reads exactly its rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from shardload.errors import ViewError


@dataclass(frozen=True)
class ArraySpec:
    """Shape (length first), dtype and optional per-feature names (along the last axis for
    arrays with ndim >= 2; the flattened features for flat views)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    features: Sequence[str] | None = None  # a lazy sequence for wide grids (views/names.py)
    attrs: Mapping[str, Any] = field(default_factory=dict)
    #: variable-length: one 1-D array per sample (``shape`` is ``(length,)``; ``read`` returns
    #: a :class:`shardload.manifest.ragged.RaggedRows`); ``mean_length`` sizes chunks
    ragged: bool = False
    mean_length: float = 0.0

    @property
    def row_bytes(self) -> int:
        if self.ragged:  # the values of a mean row, plus its offset
            return int(np.ceil(self.mean_length * np.dtype(self.dtype).itemsize)) + 8
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize


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
