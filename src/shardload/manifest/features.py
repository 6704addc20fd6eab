"""Per-feature statistics and names of a store's arrays: :class:`FeatureStats` and the
``_features/NAME.npz`` files that hold them beside the manifest (read lazily).

A store of 4.5 M features would otherwise carry hundreds of MB of JSON that every ``open_store``
parses; here the names and statistics of an array load on first access of
``manifest.stats[name]`` or ``manifest.arrays[name].features``.
"""

from __future__ import annotations

import functools
import io
import re
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO, overload

import numpy as np

from shardload.errors import StoreError
from shardload.layout import FEATURES_DIR
from shardload.manifest.names import GridNames, utf8_chunks
from shardload.manifest.npz import Pieces, write_npz
from shardload.util.npy_header import load_npz

STATS_FIELDS = ("mean", "std", "min", "max", "nan_count")
#: Slab size of the exact integer moments (no full-size temporaries).
_SLAB = 1 << 16


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


def exact_q(s1: np.ndarray, s2: np.ndarray, n: int) -> np.ndarray:
    """``n * s2 - s1**2`` (int64, exact below 2**62), a slab at a time."""
    q = np.empty(len(s1), np.int64)
    sq = np.empty(min(len(s1), _SLAB), np.int64)
    for a in range(0, len(s1), _SLAB):
        z = slice(a, a + _SLAB)
        k = len(s1[z])
        np.multiply(s2[z], n, out=q[z])
        np.multiply(s1[z], s1[z], out=sq[:k])
        np.subtract(q[z], sq[:k], out=q[z])
    return q


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
    pieces: dict[str, Pieces] = {}
    if names is not None:
        d["num_names"] = np.array(len(names), dtype=np.int64)
        if isinstance(names, GridNames):
            d["names_grid"] = np.frombuffer(names.to_rule(), dtype=np.uint8)
        else:  # UTF-8 joined by NUL, piece by piece: counted and checked, then written
            chunks = functools.partial(utf8_chunks, names)
            nbytes, nuls = 0, 0
            for piece in chunks():
                nbytes, nuls = nbytes + len(piece), nuls + piece.count(0)
            if nuls != max(len(names) - 1, 0):
                raise StoreError(f"a feature name of array {array!r} contains a NUL character")
            pieces["names"] = (nbytes, chunks)
    write_npz(file, d, pieces)


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
        # numpy would parse each member's header with ast, not thread-safe here
        # (util/npy_header.py): a DataLoader worker's reader threads parse chunk headers meanwhile
        z = load_npz(data)
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
                int(z["count"]),
                mean=mean,
                std=std,
                min=z["min"],
                max=z["max"],
                nan_count=nan_count,
            )
            if not all(len(getattr(stats, f)) == len(stats.mean) for f in STATS_FIELDS):
                raise ValueError("statistics of different lengths")
    except (OSError, ValueError, KeyError, UnicodeDecodeError, EOFError) as exc:
        raise StoreError(f"feature file {where} is corrupt: {exc}") from exc
    return names, stats


class FeatureFiles:
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

    def __init__(self, files: FeatureFiles) -> None:
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

    def __init__(self, files: FeatureFiles, array: str, count: int) -> None:
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
