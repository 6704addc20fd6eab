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
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, BinaryIO, overload

import numpy as np

from shardload.errors import StoreError
from shardload.manifest.names import GridNames

MANIFEST_NAME = "shardload.json"
#: 2: per-feature names and statistics in ``_features/NAME.npz`` (1: inline in the JSON);
#: 3: a store with variable-length arrays (``ArrayInfo.ragged``), which older readers refuse;
#: 4: feature files in format 2 (:data:`FEATURES_FORMAT`: grid names as a rule, compact
#: statistics), which older readers would take for corrupt: every store with feature files.
MANIFEST_VERSION = 4
#: the version a store without variable-length arrays is written with (inline, ``to_dict``)
PLAIN_VERSION = 2
#: the version of a store with variable-length arrays (inline)
RAGGED_VERSION = 3
FEATURES_DIR = "_features"
STATS_FIELDS = ("mean", "std", "min", "max", "nan_count")
FORMATS = ("zarr", "npy", "hdf5")


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


@dataclass(frozen=True, eq=False)
class FeatureStats:
    """Per-feature statistics along the last axis (one feature for 1-D arrays), in float64.

    ``mean``, ``std``, ``min``, ``max`` (float64) and ``nan_count`` (int64) are read-only numpy
    arrays of one value per feature (sequences given to the constructor are converted)."""

    count: int
    mean: np.ndarray
    std: np.ndarray
    min: np.ndarray
    max: np.ndarray
    nan_count: np.ndarray
    #: ``(count, s1, s2)``: the exact integer sums ``mean`` and ``std`` were computed from
    #: (``stats._Running`` on one-row integer blocks), so the feature file stores them as
    #: integers without checking every figure again; None when not known. Not a statistic:
    #: not compared, not written to JSON.
    exact_sums: tuple[int, np.ndarray, np.ndarray] | None = field(
        default=None, compare=False, repr=False
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "count", int(self.count))
        for name in STATS_FIELDS:
            dtype = np.int64 if name == "nan_count" else np.float64
            arr = np.array(getattr(self, name), dtype=dtype).reshape(-1)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, FeatureStats):
            return NotImplemented
        return self.count == other.count and all(
            np.array_equal(getattr(self, f), getattr(other, f), equal_nan=f != "nan_count")
            for f in STATS_FIELDS
        )

    __hash__ = None  # type: ignore[assignment]

    @classmethod
    def of_arrays(
        cls,
        count: int,
        exact_sums: tuple[int, np.ndarray, np.ndarray] | None = None,
        **arrays: np.ndarray,
    ) -> FeatureStats:
        """Statistics that take over the arrays given (1-D, float64 / int64; others are
        converted), made read-only, without the copies the constructor makes (74 MB per field
        for 9.3 M features): for arrays nothing else holds."""
        self = cls.__new__(cls)
        object.__setattr__(self, "count", int(count))
        for name in STATS_FIELDS:
            dtype = np.int64 if name == "nan_count" else np.float64
            arr = np.asarray(arrays[name])
            if arr.dtype != dtype or arr.ndim != 1 or not arr.flags.owndata:
                arr = np.array(arr, dtype=dtype).reshape(-1)
            arr.setflags(write=False)
            object.__setattr__(self, name, arr)
        object.__setattr__(self, "exact_sums", exact_sums)
        return self

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FeatureStats:
        return cls(
            count=int(d["count"]),
            mean=np.array([_num(v) for v in d["mean"]]),
            std=np.array([_num(v) for v in d["std"]]),
            min=np.array([_num(v) for v in d["min"]]),
            max=np.array([_num(v) for v in d["max"]]),
            nan_count=np.array([int(v) for v in d["nan_count"]], dtype=np.int64),
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
        file (``commit.write_atomic`` takes either): a wide array's feature file (168 MB for 9.3 M
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
                write_features, array=name, names=feats, stats=stats,
                dtype=None if info is None else info.dtype,
            )  # fmt: skip
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
                side = _FeatureFiles(read, files)
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
                chunk_bounds=tuple(int(b) for b in d["chunk_bounds"]),
                arrays=arrays,
                splits={k: tuple(int(i) for i in v) for k, v in d.get("splits", {}).items()},
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


# -- feature files ------------------------------------------------------------------------------
def feature_file_name(array: str, index: int) -> str:
    """``_features/NAME.npz`` (a numbered name where the array name is not a safe file name)."""
    safe = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,100}", array) is not None
    return f"{FEATURES_DIR}/{array if safe else f'array-{index:04d}'}.npz"


#: the encoding of the feature files this version writes: 2 keeps a grid's names as its rule
#: and statistics compactly (see :func:`encode_features`); 1 (no ``format`` key) is read too
FEATURES_FORMAT = 2


def encode_features(
    array: str,
    names: Sequence[str] | None,
    stats: FeatureStats | None,
    *,
    dtype: str | np.dtype[Any] | None = None,
) -> bytes:
    """:func:`write_features` into bytes."""
    buf = io.BytesIO()
    write_features(buf, array=array, names=names, stats=stats, dtype=dtype)
    return buf.getvalue()


def write_features(
    file: BinaryIO,
    *,
    array: str,
    names: Sequence[str] | None,
    stats: FeatureStats | None,
    dtype: str | np.dtype[Any] | None = None,
) -> None:
    """One array's feature file, an ``.npz`` (format :data:`FEATURES_FORMAT`), into ``file``.

    Names: a :class:`~shardload.manifest.names.GridNames` as its rule (name and per-dim labels,
    ``names_grid``: kilobytes for 9.3 M names); any other sequence as UTF-8 joined by NUL (one
    buffer: 4.5 M names load in a fraction of a second; a numpy unicode array would take 4
    bytes per character of the longest name).

    Statistics, lossless: ``count`` (one value), ``mean`` and ``std`` float64; ``min`` and
    ``max`` in the array's ``dtype`` where every value converts back exactly (integer data,
    float32 data; else float64); ``nan_count`` only where a feature has a NaN, in the smallest
    unsigned type that holds it. :func:`decode_features` gives back the same
    :class:`FeatureStats` (float64 / int64 arrays).
    """
    d: dict[str, np.ndarray] = {"format": np.array(FEATURES_FORMAT, dtype=np.int64)}
    if stats is not None:
        d["count"] = np.array(stats.count, dtype=np.int64)
        sums = _integer_moments(stats, dtype)
        if sums is None:
            d["mean"], d["std"] = stats.mean, stats.std
        else:
            d["mean_sum"], d["var_sum"] = sums
        d["min"], d["max"] = _exact_as(stats.min, dtype), _exact_as(stats.max, dtype)
        nc = stats.nan_count
        if nc.any():
            d["nan_count"] = nc.astype(np.min_scalar_type(int(nc.max()))) if nc.min() >= 0 else nc
    if names is not None:
        d["num_names"] = np.array(len(names), dtype=np.int64)
        if isinstance(names, GridNames):
            d["names_grid"] = np.frombuffer(names.to_rule(), dtype=np.uint8)
        else:
            if hasattr(names, "utf8_joined"):  # lazy names (names.py: grids among others)
                raw = np.frombuffer(names.utf8_joined(), dtype=np.uint8)
            else:
                names = list(names)
                raw = np.frombuffer("\0".join(names).encode("utf-8"), dtype=np.uint8)
            if np.count_nonzero(raw == 0) != max(len(names) - 1, 0):
                raise StoreError(f"a feature name of array {array!r} contains a NUL character")
            d["names"] = raw
    np.savez(file, **d)  # type: ignore[arg-type]


def _integer_moments(
    stats: FeatureStats, dtype: str | np.dtype[Any] | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """Integer data's mean and std as the integers they come from, where they do exactly:
    ``s1`` with ``mean == s1 / n`` and ``q`` with ``std == sqrt(q / n**2)`` (``n`` the count,
    float64 arithmetic as :func:`decode_features` does it), each in the smallest integer type
    that holds it; None where a value does not (then float64 is stored). Statistics of
    one-row integer blocks are computed so (``stats._Running``: exact sums)."""
    if dtype is None or np.dtype(dtype).kind not in "biu" or stats.count <= 0:
        return None
    n = stats.count
    sums = stats.exact_sums
    if sums is not None and sums[0] == n:
        from shardload.prep.stats import exact_q

        return _as_smallest_int(sums[1]), _as_smallest_int(exact_q(sums[1], sums[2], n))
    with np.errstate(invalid="ignore", over="ignore"):
        s1 = np.rint(stats.mean * n)
        if not (np.abs(s1) < 2**53).all() or (s1 / np.float64(n) != stats.mean).any():
            return None
        q = np.rint(np.square(stats.std) * np.float64(n * n))
        if not (q < 2**53).all() or (np.sqrt(q / np.float64(n * n)) != stats.std).any():
            return None
    return _as_smallest_int(s1), _as_smallest_int(q)


def _as_smallest_int(x: np.ndarray) -> np.ndarray:
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    for t in (np.uint8, np.int8, np.uint16, np.int16, np.uint32, np.int32):
        info = np.iinfo(t)
        if info.min <= lo and hi <= info.max:
            return x.astype(t)
    return x.astype(np.int64)


def _exact_as(x: np.ndarray, dtype: str | np.dtype[Any] | None) -> np.ndarray:
    """``x`` (float64) in ``dtype`` where every value converts back to the same float64
    (sign of zero included), else ``x`` itself."""
    if dtype is None:
        return x
    dt = np.dtype(dtype)
    if dt.kind == "b":
        dt = np.dtype(np.uint8)
    if dt.kind not in "iuf" or dt.itemsize >= 8 or not x.size:
        return x
    if dt.kind in "iu" and not np.isfinite(x).all():
        return x
    with np.errstate(invalid="ignore", over="ignore"):
        y = x.astype(dt)
        differ = y != x  # (np.array_equal with equal_nan takes several times longer)
    if dt.kind in "iu":  # and -0.0 is no integer
        sign = np.signbit(x) if dt.kind == "u" else np.signbit(x) != (y < 0)
        return x if differ.any() or sign.any() else y
    if differ.any() and not (np.isnan(x[differ]).all() and np.isnan(y[differ]).all()):
        return x
    return y


def decode_features(data: bytes, *, where: str) -> tuple[Sequence[str] | None, FeatureStats | None]:
    """What :func:`encode_features` wrote (either format): names (a
    :class:`~shardload.manifest.names.GridNames` for a grid's rule, else a tuple) and statistics."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as z:
            fmt = int(z["format"]) if "format" in z else 1
            if fmt > FEATURES_FORMAT:
                raise StoreError(
                    f"feature file {where} has format {fmt}, newer than this shardload reads "
                    f"({FEATURES_FORMAT}): upgrade shardload"
                )
            names: Sequence[str] | None = None
            if "num_names" in z:
                n = int(z["num_names"])
                if "names_grid" in z:
                    names = GridNames.from_rule(z["names_grid"].tobytes())
                else:
                    names = tuple(z["names"].tobytes().decode("utf-8").split("\0")) if n else ()
                if len(names) != n:
                    raise ValueError(f"{len(names)} names, expected {n}")
            stats = None
            if "count" in z:
                if "mean_sum" in z:  # integer sums (format 2, integer data)
                    n = int(z["count"])
                    mean = z["mean_sum"].astype(np.float64) / np.float64(n)
                    std = np.sqrt(z["var_sum"].astype(np.float64) / np.float64(n * n))
                else:
                    mean, std = z["mean"], z["std"]
                if "nan_count" in z or fmt == 1:
                    nan_count = z["nan_count"]
                else:  # format 2 leaves out all-zero counts
                    nan_count = np.zeros(mean.shape, np.int64)
                stats = FeatureStats.of_arrays(
                    int(z["count"]), mean=mean, std=std, min=z["min"], max=z["max"],
                    nan_count=nan_count,
                )  # fmt: skip
                if not all(len(getattr(stats, f)) == len(stats.mean) for f in STATS_FIELDS):
                    raise ValueError("statistics of different lengths")
    except (OSError, ValueError, KeyError, UnicodeDecodeError, EOFError) as exc:
        raise StoreError(f"feature file {where} is corrupt: {exc}") from exc
    return names, stats


class _FeatureFiles:
    """Reads each array's feature file once, on first use (thread-safe); picklable (the cache
    stays behind: a DataLoader worker reads only what it uses)."""

    def __init__(self, read: Callable[[str], bytes], files: Mapping[str, str]) -> None:
        self.read, self.files = read, dict(files)
        self._cache: dict[str, tuple[Sequence[str] | None, FeatureStats | None]] = {}
        self._lock = threading.Lock()

    def get(self, array: str) -> tuple[Sequence[str] | None, FeatureStats | None]:
        with self._lock:
            if array not in self._cache:
                rel = self.files[array]
                try:
                    data = self.read(rel)
                except FileNotFoundError as exc:
                    raise StoreError(
                        f"feature file {rel} of array {array!r} is missing from the store"
                    ) from exc
                self._cache[array] = decode_features(data, where=rel)
            return self._cache[array]

    def __getstate__(self) -> dict[str, Any]:
        return {"read": self.read, "files": self.files}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["read"], state["files"])  # type: ignore[misc]


class LazyStats(Mapping[str, FeatureStats]):
    """``manifest.stats``: each array's statistics read from its feature file on first access."""

    def __init__(self, files: _FeatureFiles) -> None:
        self._files = files

    def __getitem__(self, array: str) -> FeatureStats:
        if array not in self._files.files:
            raise KeyError(array)
        stats = self._files.get(array)[1]
        if stats is None:
            raise KeyError(array)
        return stats

    def __iter__(self) -> Iterator[str]:
        return iter(self._files.files)

    def __len__(self) -> int:
        return len(self._files.files)

    def __repr__(self) -> str:
        return f"<stats of {list(self._files.files)}, read from {FEATURES_DIR}/ on access>"


class LazyFeatures(Sequence[str]):
    """An array's feature names, read from its feature file on first access of a name (the
    count is in the manifest, so ``len`` reads nothing)."""

    def __init__(self, files: _FeatureFiles, array: str, count: int) -> None:
        self._files, self._array, self._count = files, array, count

    def _names(self) -> Sequence[str]:
        names = self._files.get(self._array)[0]
        if names is None or len(names) != self._count:
            raise StoreError(
                f"feature file {self._files.files[self._array]} has "
                f"{'no' if names is None else len(names)} names for array {self._array!r}, "
                f"the manifest says {self._count}"
            )
        return names

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> str: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[str, ...]: ...
    def __getitem__(self, i: int | slice) -> str | tuple[str, ...]:
        names = self._names()
        return tuple(names[i]) if isinstance(i, slice) else names[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LazyFeatures):
            other = other._names()
        if isinstance(other, (tuple, list, GridNames)):
            if len(self) != len(other):
                return False
            names = self._names()
            if isinstance(names, GridNames) or isinstance(other, GridNames):
                return bool(names == other)  # a grid against a grid compares the rules
            return names == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<{self._count} feature names of {self._array!r}, read on access>"


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
