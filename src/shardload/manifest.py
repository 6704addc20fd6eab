"""The manifest: everything a loader needs to know about a store, without opening any array.

It is one JSON file, ``shardload.json``, at the store root. Values are frozen dataclasses that
round-trip through JSON exactly (``Manifest.from_json(m.to_json()) == m``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from .errors import StoreError

MANIFEST_NAME = "shardload.json"
MANIFEST_VERSION = 1
FORMATS = ("zarr", "npy", "hdf5")


@dataclass(frozen=True)
class ArrayInfo:
    """One sample-major array of a store: ``shape[0]`` is the store length."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    chunk_rows: int
    path: str
    features: tuple[str, ...] | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[1:])

    @property
    def row_bytes(self) -> int:
        return int(np.prod(self.row_shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ArrayInfo:
        feats = d.get("features")
        return cls(
            name=d["name"],
            shape=tuple(int(s) for s in d["shape"]),
            dtype=str(d["dtype"]),
            chunk_rows=int(d["chunk_rows"]),
            path=str(d["path"]),
            features=tuple(feats) if feats is not None else None,
            attrs=dict(d.get("attrs", {})),
        )


@dataclass(frozen=True)
class FeatureStats:
    """Per-feature statistics along the last axis (one feature for 1-D arrays), in float64."""

    count: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    min: tuple[float, ...]
    max: tuple[float, ...]
    nan_count: tuple[int, ...]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureStats:
        return cls(
            count=int(d["count"]),
            mean=tuple(_num(v) for v in d["mean"]),
            std=tuple(_num(v) for v in d["std"]),
            min=tuple(_num(v) for v in d["min"]),
            max=tuple(_num(v) for v in d["max"]),
            nan_count=tuple(int(v) for v in d["nan_count"]),
        )


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


@dataclass(frozen=True)
class Manifest:
    """A store's description. ``complete`` is only ever true in a finished store."""

    format: str
    length: int
    chunk_bounds: tuple[int, ...]
    arrays: Mapping[str, ArrayInfo]
    splits: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    stats: Mapping[str, FeatureStats] = field(default_factory=dict)
    static: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    provenance: Mapping[str, Any] = field(default_factory=dict)
    complete: bool = False
    version: int = MANIFEST_VERSION
    shardload_version: str = ""
    #: Splits that are a row range ``(start, stop)`` rather than whole chunks (time-series
    #: windows, or too few chunks); ``splits`` then lists the chunks the range touches.
    split_rows: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def num_chunks(self) -> int:
        return len(self.chunk_bounds) - 1

    @property
    def chunk_rows(self) -> int:
        return self.chunk_bounds[1] - self.chunk_bounds[0] if self.num_chunks else 0

    def chunk_range(self, i: int) -> tuple[int, int]:
        return self.chunk_bounds[i], self.chunk_bounds[i + 1]

    def split_chunks(self, split: str) -> tuple[int, ...]:
        if split not in self.splits:
            raise StoreError(
                f"split {split!r} does not exist in this store; it has {sorted(self.splits)}"
            )
        return self.splits[split]

    def split_num_rows(self, split: str) -> int:
        """Rows of a split (its row range, or the sum of its chunks)."""
        if split in self.split_rows:
            a, b = self.split_rows[split]
            return b - a
        return int(
            sum(self.chunk_bounds[i + 1] - self.chunk_bounds[i] for i in self.split_chunks(split))
        )

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["arrays"] = {k: asdict(v) for k, v in self.arrays.items()}
        d["stats"] = {k: _clean(asdict(v)) for k, v in self.stats.items()}
        d["splits"] = {k: list(v) for k, v in self.splits.items()}
        return _clean(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Manifest:
        try:
            return cls(
                format=str(d["format"]),
                length=int(d["length"]),
                chunk_bounds=tuple(int(b) for b in d["chunk_bounds"]),
                arrays={k: ArrayInfo.from_dict(v) for k, v in d["arrays"].items()},
                splits={k: tuple(int(i) for i in v) for k, v in d.get("splits", {}).items()},
                stats={k: FeatureStats.from_dict(v) for k, v in d.get("stats", {}).items()},
                static=dict(d.get("static", {})),
                options=dict(d.get("options", {})),
                provenance=dict(d.get("provenance", {})),
                complete=bool(d.get("complete", False)),
                version=int(d.get("version", MANIFEST_VERSION)),
                shardload_version=str(d.get("shardload_version", "")),
                split_rows={k: (int(v[0]), int(v[1])) for k, v in d.get("split_rows", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreError(f"malformed {MANIFEST_NAME}: {exc!r}") from exc

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str = MANIFEST_NAME) -> Manifest:
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            # UnicodeDecodeError: bytes that are not UTF-8 text (a corrupt or foreign file)
            raise StoreError(f"{where} is not a valid manifest (not JSON text): {exc}") from None
        if not isinstance(d, Mapping):
            raise StoreError(
                f"{where} is not a valid manifest: JSON {type(d).__name__}, not an object"
            )
        return cls.from_dict(d)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: tuples to lists, numpy scalars to Python, NaN/inf to None."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return _clean(obj.tolist())
    if isinstance(obj, (np.integer,)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        f = float(obj)
        return f if np.isfinite(f) else None
    return obj


def validate_aligned(arrays: Sequence[ArrayInfo], length: int) -> None:
    """Every array of a store is row-aligned: same length."""
    for a in arrays:
        if a.shape[0] != length:
            raise StoreError(
                f"array {a.name!r} has {a.shape[0]} rows but the store has {length}: "
                "arrays of a store must be row-aligned"
            )
