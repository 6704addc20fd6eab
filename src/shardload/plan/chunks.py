"""Chunk sizing and chunk boundaries along the sample axis (pure functions).

Chunks are plain data, as in dask: a tuple of boundaries ``(0, b1, b2, ..., length)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, overload

import numpy as np

from shardload.errors import ConfigError

#: Default target size of one chunk of all arrays together (uncompressed). 16 MiB: big enough
#: that per-read overhead (a syscall, an HTTP request, a codec call) is far below the transfer
#: time, small enough that a loader worker can hold a shuffle buffer of several chunks.
DEFAULT_TARGET_CHUNK_BYTES = 16 * 2**20


def plan_chunk_rows(
    row_bytes: int, *, length: int, target_bytes: int = DEFAULT_TARGET_CHUNK_BYTES
) -> int:
    """Rows per chunk so that one chunk of all arrays is about ``target_bytes``.

    >>> plan_chunk_rows(1000, length=10**6, target_bytes=16_000)
    16
    >>> plan_chunk_rows(10**9, length=5)   # one row bigger than the target: one row per chunk
    1
    >>> plan_chunk_rows(4, length=10)      # never more rows than the data has
    10
    """
    if row_bytes <= 0:
        raise ConfigError(f"row size must be positive, got {row_bytes} bytes")
    if target_bytes <= 0:
        raise ConfigError(f"target_chunk_bytes must be positive, got {target_bytes}")
    rows = max(1, target_bytes // row_bytes)
    return int(max(1, min(rows, length)))


def plan_chunk_bounds(length: int, chunk_rows: int) -> tuple[int, ...]:
    """Boundaries of consecutive chunks of ``chunk_rows`` rows; the last may be short.

    >>> plan_chunk_bounds(10, 4)
    (0, 4, 8, 10)
    >>> plan_chunk_bounds(0, 4)
    (0,)
    """
    if chunk_rows <= 0:
        raise ConfigError(f"chunk_rows must be positive, got {chunk_rows}")
    if length < 0:
        raise ConfigError(f"length must be >= 0, got {length}")
    return (*range(0, length, chunk_rows), length) if length else (0,)


class RegularBounds(Sequence[int]):
    """The boundaries :func:`plan_chunk_bounds` returns, computed on demand: O(1) to index,
    to search and to pickle (a write task ships them; 65,536 chunks must not cost 65,536 ints
    per task, nor a linear ``tuple.index`` per block).

    >>> b = RegularBounds(10, 4)
    >>> list(b), b[-1], b.index(8), len(b), b == (0, 4, 8, 10)
    ([0, 4, 8, 10], 10, 2, 4, True)
    """

    __slots__ = ("chunk_rows", "length")

    def __init__(self, length: int, chunk_rows: int) -> None:
        if chunk_rows <= 0:
            raise ConfigError(f"chunk_rows must be positive, got {chunk_rows}")
        if length < 0:
            raise ConfigError(f"length must be >= 0, got {length}")
        self.length, self.chunk_rows = int(length), int(chunk_rows)

    @property
    def num_chunks(self) -> int:
        return -(-self.length // self.chunk_rows)

    def __len__(self) -> int:
        return self.num_chunks + 1 if self.length else 1

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[int, ...]: ...
    def __getitem__(self, i: int | slice) -> int | tuple[int, ...]:
        if isinstance(i, slice):
            return tuple(self[j] for j in range(*i.indices(len(self))))
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"chunk boundary {i} out of range (0..{n - 1})")
        return min(i * self.chunk_rows, self.length)

    def __iter__(self) -> Iterator[int]:
        yield from (plan_chunk_bounds(self.length, self.chunk_rows))

    def index(self, value: Any, start: int = 0, stop: int | None = None) -> int:
        i = int(value) // self.chunk_rows if value != self.length else len(self) - 1
        if (
            value < 0
            or i >= len(self)
            or self[i] != value
            or i < start
            or (stop is not None and i >= stop)
        ):
            raise ValueError(f"{value} is not a chunk boundary")
        return i

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RegularBounds):
            return (self.length, self.chunk_rows) == (other.length, other.chunk_rows)
        if isinstance(other, (tuple, list)):
            return len(other) == len(self) and tuple(other) == tuple(self)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.length, self.chunk_rows))

    def __reduce__(self) -> tuple[Any, ...]:
        return (RegularBounds, (self.length, self.chunk_rows))

    def __repr__(self) -> str:
        return f"RegularBounds(length={self.length}, chunk_rows={self.chunk_rows})"


def block_span(bounds: Sequence[int], chunks_per_block: int, block: int) -> tuple[int, int, int]:
    """``(first chunk, first row, stop row)`` of write block ``block`` (O(1) for
    :class:`RegularBounds`; blocks group ``chunks_per_block`` chunks, as :func:`plan_blocks`).

    >>> block_span(RegularBounds(10, 4), 2, 1)
    (2, 8, 10)
    """
    num_chunks = len(bounds) - 1
    chunk = block * chunks_per_block
    if not 0 <= chunk < num_chunks:
        raise IndexError(f"write block {block} out of range ({num_chunks} chunks)")
    return chunk, int(bounds[chunk]), int(bounds[min(chunk + chunks_per_block, num_chunks)])


def chunk_sizes(bounds: Sequence[int]) -> np.ndarray:
    """Rows in each chunk, from boundaries.

    >>> chunk_sizes((0, 4, 8, 10)).tolist()
    [4, 4, 2]
    """
    return np.diff(np.asarray(bounds, dtype=np.int64))


def plan_blocks(bounds: Sequence[int], chunks_per_block: int) -> tuple[int, ...]:
    """Group chunks into write blocks (a Zarr shard holds ``chunks_per_block`` chunks).

    >>> plan_blocks((0, 4, 8, 10), 2)
    (0, 8, 10)
    """
    if chunks_per_block <= 0:
        raise ConfigError(f"chunks per shard must be positive, got {chunks_per_block}")
    b = list(bounds)
    out = b[::chunks_per_block]
    if out[-1] != b[-1]:
        out.append(b[-1])
    return tuple(out)


def plan_splits(
    num_chunks: int, fractions: Mapping[str, float], *, seed: int = 0, shuffle: bool = True
) -> dict[str, tuple[int, ...]]:
    """Assign whole chunks to named splits (train/val/test...), seeded.

    Counts follow the fractions by largest remainder; every split with a positive fraction gets at
    least one chunk when there are enough chunks. Chunk ids inside a split are sorted.

    >>> plan_splits(10, {"train": 0.8, "val": 0.1, "test": 0.1}, shuffle=False)
    {'train': (0, 1, 2, 3, 4, 5, 6, 7), 'val': (8,), 'test': (9,)}
    """
    if not fractions:
        return {"all": tuple(range(num_chunks))}
    _check_fractions(fractions)
    total = float(sum(fractions.values()))
    names = list(fractions)
    exact = np.array([fractions[n] * num_chunks for n in names], dtype=float)
    counts = np.floor(exact).astype(int)
    budget = round(total * num_chunks) if total < 1 - 1e-9 else num_chunks
    order = np.argsort(-(exact - counts), kind="stable")
    for i in order[: max(0, budget - counts.sum())]:
        counts[i] += 1
    # every positive split gets a chunk if possible, taken from the largest split
    for i, n in enumerate(names):
        if fractions[n] > 0 and counts[i] == 0 and counts.max() > 1:
            counts[int(np.argmax(counts))] -= 1
            counts[i] = 1
    ids = np.arange(num_chunks)
    if shuffle:
        ids = np.random.default_rng(seed).permutation(num_chunks)
    out: dict[str, tuple[int, ...]] = {}
    start = 0
    for n, c in zip(names, counts, strict=True):
        out[n] = tuple(sorted(int(i) for i in ids[start : start + c]))
        start += c
    return out


def plan_row_splits(
    length: int,
    fractions: Mapping[str, float],
    *,
    group_rows: int = 1,
    gap_groups: int = 0,
) -> dict[str, tuple[int, int]]:
    """Assign contiguous row ranges ``(start, stop)`` to splits, in the order given.

    Rows are taken in groups of ``group_rows`` (a split never cuts a group: for windows, all
    space points of one window); ``gap_groups`` groups are left out between two consecutive
    splits, so that samples of different splits never share a time step (windows). Counts of
    groups follow the fractions by largest remainder; a split with a positive fraction that
    would get no group raises :class:`ConfigError`.

    >>> plan_row_splits(10, {"train": 0.8, "val": 0.1, "test": 0.1})
    {'train': (0, 8), 'val': (8, 9), 'test': (9, 10)}
    >>> plan_row_splits(20, {"train": 0.5, "test": 0.5}, group_rows=2, gap_groups=2)
    {'train': (0, 8), 'test': (12, 20)}
    """
    _check_fractions(fractions)
    if group_rows <= 0 or gap_groups < 0:
        raise ConfigError(f"splits: bad grouping ({group_rows} rows, gap {gap_groups})")
    groups = length // group_rows
    names = list(fractions)
    total = float(sum(fractions.values()))
    usable = groups - gap_groups * max(0, sum(1 for n in names if fractions[n] > 0) - 1)
    assigned = max(0, usable) if total >= 1 - 1e-9 else round(total * max(0, usable))
    counts = _largest_remainder([fractions[n] / total for n in names], assigned)
    for i, n in enumerate(names):  # every positive split gets a group if possible
        if fractions[n] > 0 and counts[i] == 0 and counts.max() > 1:
            counts[int(np.argmax(counts))] -= 1
            counts[i] = 1
    empty = [n for n, c in zip(names, counts, strict=True) if fractions[n] > 0 and c == 0]
    if empty:
        what = f"{groups} window(s) of {group_rows} rows" if group_rows > 1 else f"{length} rows"
        gap = f" with a gap of {gap_groups} window(s) between splits" if gap_groups else ""
        raise ConfigError(
            f"splits: {empty} would be empty: the store has {what}{gap}, too few for the "
            f"fractions {dict(fractions)}; use fewer splits or more data"
        )
    out: dict[str, tuple[int, int]] = {}
    g = 0
    for n, c in zip(names, counts, strict=True):
        if c == 0:
            out[n] = (g * group_rows, g * group_rows)
            continue
        out[n] = (g * group_rows, (g + int(c)) * group_rows)
        g += int(c) + gap_groups
    return out


def _largest_remainder(weights: Sequence[float], total: int) -> np.ndarray:
    exact = np.asarray(weights, dtype=float) * total
    counts = np.floor(exact + 1e-9).astype(int)
    order = np.argsort(-(exact - counts), kind="stable")
    for i in order[: max(0, total - int(counts.sum()))]:
        counts[i] += 1
    return counts


def _check_fractions(fractions: Mapping[str, float]) -> None:
    bad = {k: v for k, v in fractions.items() if not (isinstance(v, (int, float)) and v >= 0)}
    if bad:
        raise ConfigError(f"splits: fractions must be numbers >= 0, got {bad}")
    total = float(sum(fractions.values()))
    if total <= 0 or total > 1.0 + 1e-9:
        raise ConfigError(f"splits: fractions must sum to a value in (0, 1], got {total:g}")


def chunks_of_rows(bounds: Sequence[int], start: int, stop: int) -> tuple[int, ...]:
    """Ids of the chunks that rows ``[start, stop)`` touch.

    >>> chunks_of_rows((0, 4, 8, 10), 3, 9)
    (0, 1, 2)
    """
    if stop <= start:
        return ()
    b = np.asarray(bounds, dtype=np.int64)
    first = int(np.searchsorted(b, start, side="right") - 1)
    last = int(np.searchsorted(b, stop - 1, side="right") - 1)
    return tuple(range(first, last + 1))


def plan_store_splits(
    bounds: Sequence[int],
    fractions: Mapping[str, float],
    *,
    seed: int = 0,
    shuffle: bool = True,
    group_rows: int | None = None,
    gap_groups: int = 0,
) -> tuple[dict[str, tuple[int, ...]], dict[str, tuple[int, int]], str]:
    """A store's splits: ``(chunk ids per split, row range per split, why)``.

    Whole chunks (:func:`plan_splits`, shuffled) when every split with a positive fraction gets
    one; otherwise, and always for time-series windows (``group_rows`` = rows of one window),
    contiguous row ranges (:func:`plan_row_splits`), each listed with the chunks it touches.
    ``why`` says which was chosen and why (``""`` for whole chunks).

    >>> plan_store_splits((0, 4, 8, 10), {"train": 0.8, "val": 0.2}, shuffle=False)
    ({'train': (0, 1), 'val': (2,)}, {}, '')
    >>> plan_store_splits((0, 10), {"train": 0.8, "val": 0.2})[1]
    {'train': (0, 8), 'val': (8, 10)}
    """
    length = int(bounds[-1])
    if not fractions:
        return {"all": tuple(range(len(bounds) - 1))}, {}, ""
    if group_rows is None:
        chunks = plan_splits(len(bounds) - 1, fractions, seed=seed, shuffle=shuffle)
        empty = [n for n, ids in chunks.items() if fractions.get(n, 0) > 0 and not ids]
        if not empty:
            return chunks, {}, ""
        why = (
            f"splits {empty} would get no whole chunk ({len(bounds) - 1} chunk(s)): "
            "splits are contiguous row ranges instead, in the order given"
        )
        rows = plan_row_splits(length, fractions)
    else:
        why = (
            f"time-series windows: splits are contiguous time ranges in the order given, "
            f"{gap_groups} window(s) left out between two splits so no two share a time step"
        )
        rows = plan_row_splits(length, fractions, group_rows=group_rows, gap_groups=gap_groups)
    return {n: chunks_of_rows(bounds, a, b) for n, (a, b) in rows.items()}, rows, why


def describe_split_shortfall(
    rows: Mapping[str, tuple[int, int]], fractions: Mapping[str, float], length: int
) -> str:
    """What the row splits ``rows`` give against the ``fractions`` asked, when they fall well
    short (a split under 75% of its fraction, or over 10% of the samples in no split beyond
    what the fractions leave out); ``""`` otherwise (pure).

    >>> describe_split_shortfall({"train": (0, 44), "test": (88, 100)}, {"train": 0.8, "test": 0.2}, 100)
    'train 44.0% (asked 80.0%), test 12.0% (asked 20.0%); 44.0% of the samples in no split'
    >>> describe_split_shortfall({"train": (0, 79), "test": (81, 100)}, {"train": 0.8, "test": 0.2}, 100)
    ''
    """
    if length <= 0 or not rows:
        return ""
    got = {n: (b - a) / length for n, (a, b) in rows.items()}
    lost = 1.0 - sum(got.values())
    short = [n for n, f in fractions.items() if f > 0 and got.get(n, 0.0) < 0.75 * f]
    if not short and lost - (1.0 - sum(fractions.values())) <= 0.10:
        return ""
    parts = ", ".join(f"{n} {got.get(n, 0.0):.1%} (asked {f:.1%})" for n, f in fractions.items())
    return f"{parts}; {lost:.1%} of the samples in no split"
