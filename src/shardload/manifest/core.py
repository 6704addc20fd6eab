"""The manifest: everything a loader needs to know about a store, without opening any array.

On disk (``Manifest.to_files``) it is one small JSON file, ``shardload.json``, at the store root
(arrays, chunks, splits, options), and beside it one binary file per array,
``_features/NAME.npz``, with the array's per-feature names and statistics: a store of 4.5 M
features would otherwise carry hundreds of MB of JSON that every ``open_store`` parses. The
feature files are read lazily, on first access of ``manifest.stats[name]`` or of
``manifest.arrays[name].features``. Stores written before (names and stats inline in the JSON)
still open. Values are frozen dataclasses; ``Manifest.from_json(m.to_json()) == m`` (the
standalone JSON form, everything inline).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, BinaryIO

import numpy as np

from shardload.errors import StoreError
from shardload.layout import FEATURES_DIR, MANIFEST_NAME
from shardload.manifest.features import (
    STATS_FIELDS,
    FeatureFiles,
    FeatureStats,
    LazyFeatures,
    LazyStats,
    feature_file_name,
    write_features,
)
from shardload.manifest.time import TimeAxis

#: 2: per-feature names and statistics in ``_features/NAME.npz`` (1: inline in the JSON);
#: 3: a store with variable-length arrays (``ArrayInfo.ragged``), which older readers refuse;
#: 4: feature files in format 2 (:data:`FEATURES_FORMAT`: grid names as a rule, compact
#: statistics), which older readers would take for corrupt: every store with feature files.
MANIFEST_VERSION = 4
#: the version a store without variable-length arrays is written with (inline, ``to_dict``)
PLAIN_VERSION = 2
#: the version of a store with variable-length arrays (inline)
RAGGED_VERSION = 3

#: the dtypes a store's fixed arrays may have (a config's ``dtype``, every format's)
NUMERIC_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)


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


@dataclass(frozen=True)
class ArrayInfo:
    """One sample-major array of a store: ``shape[0]`` is the store length."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    chunk_rows: int
    path: str
    #: per-feature names (a lazy sequence when they live in a feature file)
    features: Sequence[str] | None = None
    attrs: Mapping[str, Any] = field(default_factory=dict)
    #: a variable-length array (one 1-D array per sample, stored as values + offsets): its
    #: length statistics (``max_length``, ``min_length``, ``mean_length``, ``num_values``);
    #: None for fixed-shape arrays. ``shape`` is then ``(samples,)``, ``dtype`` the values'.
    ragged: Mapping[str, Any] | None = None

    @property
    def is_ragged(self) -> bool:
        return self.ragged is not None

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
            ragged=dict(d["ragged"]) if d.get("ragged") is not None else None,
        )


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
    version: int = PLAIN_VERSION
    shardload_version: str = ""
    #: Splits that are a row range ``(start, stop)`` rather than whole chunks (time-series
    #: windows, or too few chunks); ``splits`` then lists the chunks the range touches.
    split_rows: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    #: array name -> its feature file (relative to the store root), for stores read from disk
    feature_files: Mapping[str, str] = field(default_factory=dict, compare=False)
    #: The per-chunk checksum algorithm of the store's ``checksums.npz`` sidecar ("": none;
    #: stores written before checksums existed, plain Zarr data). See :mod:`shardload.formats.checksums`.
    checksums: str = ""
    #: A dated store's time axis (:class:`shardload.manifest.time.TimeAxis` as a dict: start,
    #: frequency, length, missing rows); empty for a store whose rows are not dates.
    time: Mapping[str, Any] = field(default_factory=dict)

    @property
    def time_axis(self) -> TimeAxis | None:
        """The time axis of a dated store (one row per date), else None."""
        return TimeAxis.from_dict(self.time) if self.time else None

    @functools.cached_property
    def bounds(self) -> np.ndarray:
        """``chunk_bounds`` as a read-only int64 array, made once: each load step that plans
        with numpy had made its own (eight an epoch of the default store's 8,193 bounds,
        0.15 ms each); not pickled (:meth:`__getstate__`)."""
        out = np.array(self.chunk_bounds, dtype=np.int64)
        out.flags.writeable = False
        return out

    def __getstate__(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "bounds"}

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
        """The standalone form: every feature name and statistic inline (small stores, tests)."""
        d = self._plain_fields()
        d["arrays"] = {
            k: {**_fields(v), "features": None if v.features is None else list(v.features)}
            for k, v in self.arrays.items()
        }
        d["stats"] = {
            k: _clean({f: getattr(v, f) for f in ("count", *STATS_FIELDS)})
            for k, v in self.stats.items()
        }
        d["splits"] = {k: list(v) for k, v in self.splits.items()}
        if any(a.is_ragged for a in self.arrays.values()):
            d["version"] = max(self.version, RAGGED_VERSION)
        return _clean(d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"), allow_nan=False)

    def to_files(self) -> dict[str, bytes]:
        """The on-disk form: ``{path relative to the store root: bytes}``, the feature files
        first and ``shardload.json`` last (write them in this order: the manifest is what
        makes a store complete)."""
        out = {}
        for rel, data in self.file_writers().items():
            if callable(data):
                buf = io.BytesIO()
                data(buf)
                data = buf.getvalue()
            out[rel] = data
        return out

    def file_writers(self) -> dict[str, bytes | Callable[[BinaryIO], object]]:
        """:meth:`to_files` with each feature file as a function that writes it into an open
        file (``util.durable.write_atomic`` takes either): a wide array's feature file (168 MB for 9.3 M
        features) then goes straight to its file, without two copies in memory."""
        files: dict[str, bytes | Callable[[BinaryIO], object]] = {}
        arrays: dict[str, Any] = {}
        names = set(self.arrays) | set(self.stats)
        for i, name in enumerate(sorted(names)):
            info = self.arrays.get(name)
            feats = None if info is None else info.features
            stats = self.stats.get(name)
            if feats is None and stats is None:
                continue
            rel = feature_file_name(name, i)
            files[rel] = functools.partial(
                write_features,
                array=name,
                names=feats,
                stats=stats,
                dtype=None if info is None else info.dtype,
            )
            arrays[name] = rel
        d = self._plain_fields()
        ragged = any(a.is_ragged for a in self.arrays.values())
        d["version"] = MANIFEST_VERSION if files else (RAGGED_VERSION if ragged else PLAIN_VERSION)
        d["arrays"] = {
            k: {
                **_fields(a),
                "features": None,
                "num_features": None if a.features is None else len(a.features),
            }
            for k, a in self.arrays.items()
        }
        d["stats"] = {}
        d["feature_files"] = arrays
        d["splits"] = {k: list(v) for k, v in self.splits.items()}
        text = json.dumps(_clean(d), separators=(",", ":"), allow_nan=False)
        files[MANIFEST_NAME] = text.encode()
        return files

    def _plain_fields(self) -> dict[str, Any]:
        skip = ("arrays", "stats", "splits", "feature_files")
        return {k: v for k, v in _fields(self).items() if k not in skip}

    @classmethod
    def from_dict(
        cls, d: Mapping[str, Any], *, read: Callable[[str], bytes] | None = None
    ) -> Manifest:
        """``read(path relative to the store root) -> bytes`` reads the feature files, lazily;
        it is needed for manifests that name feature files (version 2)."""
        try:
            version = int(d.get("version", 1))
            if version > MANIFEST_VERSION:
                raise StoreError(
                    f"{MANIFEST_NAME} has version {version}, newer than this shardload reads "
                    f"({MANIFEST_VERSION}): upgrade shardload"
                )
            files = {str(k): str(v) for k, v in (d.get("feature_files") or {}).items()}
            side = None
            if files:
                if read is None:
                    raise StoreError(
                        f"{MANIFEST_NAME} keeps feature names and statistics in {FEATURES_DIR}/; "
                        "open the store with open_store to read them"
                    )
                side = FeatureFiles(read, files)
            arrays = {}
            for k, v in d["arrays"].items():
                info = ArrayInfo.from_dict(v)
                if side is not None and v.get("num_features") is not None and k in files:
                    info = _replace_features(info, LazyFeatures(side, k, int(v["num_features"])))
                arrays[k] = info
            stats: Mapping[str, FeatureStats]
            if side is not None:
                stats = LazyStats(side)
            else:
                stats = {k: FeatureStats.from_dict(v) for k, v in d.get("stats", {}).items()}
            return cls(
                format=str(d["format"]),
                length=int(d["length"]),
                chunk_bounds=tuple(map(int, d["chunk_bounds"])),
                arrays=arrays,
                splits={k: tuple(map(int, v)) for k, v in d.get("splits", {}).items()},
                stats=stats,
                static=dict(d.get("static", {})),
                options=dict(d.get("options", {})),
                provenance=dict(d.get("provenance", {})),
                complete=bool(d.get("complete", False)),
                version=version,
                shardload_version=str(d.get("shardload_version", "")),
                split_rows={k: (int(v[0]), int(v[1])) for k, v in d.get("split_rows", {}).items()},
                feature_files=files,
                checksums=str(d.get("checksums", "")),
                time=dict(d.get("time") or {}),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise StoreError(f"malformed {MANIFEST_NAME}: {exc!r}") from exc

    @classmethod
    def from_json(
        cls,
        text: str | bytes,
        *,
        where: str = MANIFEST_NAME,
        read: Callable[[str], bytes] | None = None,
    ) -> Manifest:
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
            # UnicodeDecodeError: bytes that are not UTF-8 text (a corrupt or foreign file)
            raise StoreError(f"{where} is not a valid manifest (not JSON text): {exc}") from None
        if not isinstance(d, Mapping):
            raise StoreError(
                f"{where} is not a valid manifest: JSON {type(d).__name__}, not an object"
            )
        return cls.from_dict(d, read=read)


def _fields(obj: Any) -> dict[str, Any]:
    """A dataclass's fields, shallow (``asdict`` would deep-copy lazy feature files)."""
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _replace_features(info: ArrayInfo, features: Sequence[str]) -> ArrayInfo:
    from dataclasses import replace

    return replace(info, features=features)


def _clean(obj: Any) -> Any:
    """JSON-safe copy: tuples to lists, numpy scalars to Python, NaN/inf to None."""
    if isinstance(obj, Mapping):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        if all(type(v) is int for v in obj):  # chunk bounds, block starts: 8,194 of each
            return list(obj)
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
