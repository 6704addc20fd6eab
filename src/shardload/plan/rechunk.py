"""Splits kept across a re-chunking (pure): what ``shardload copy`` plans before it writes.

A split is a set of whole chunks (or, for ``split_rows`` splits, a row range). A copy into
other chunks keeps every split as it was, row for row: each row where the chunk-set splits
change (a *split boundary*) must be a chunk boundary of the new layout. With regular chunks of
``c`` rows, that means ``c`` divides every split boundary.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from shardload.errors import ConfigError


def split_boundaries(
    chunk_bounds: Sequence[int],
    splits: Mapping[str, Sequence[int]],
    split_rows: Mapping[str, tuple[int, int]] | None = None,
) -> dict[int, tuple[str, str]]:
    """The rows where the chunk-set splits change, each with the splits (or ``-``: none) on
    either side. Row-range splits (``split_rows``) are left out: they keep their range whatever
    the chunks.

    >>> split_boundaries((0, 4, 8, 12, 14), {"train": (0, 2), "val": (1,), "test": (3,)})
    {4: ('train', 'val'), 8: ('val', 'train'), 12: ('train', 'test')}
    >>> split_boundaries((0, 4, 8), {"train": (0, 1)})
    {}
    """
    ranged = set(split_rows or {})
    labels: list[set[str]] = [set() for _ in range(len(chunk_bounds) - 1)]
    for name, chunks in splits.items():
        if name not in ranged:
            for i in chunks:
                labels[int(i)].add(name)
    out = {}
    for i in range(1, len(labels)):
        if labels[i] != labels[i - 1]:
            out[int(chunk_bounds[i])] = (_label(labels[i - 1]), _label(labels[i]))
    return out


def _label(names: set[str]) -> str:
    return "+".join(sorted(names)) or "-"


def plan_kept_chunk_rows(
    chunk_rows: int, boundaries: Mapping[int, tuple[str, str]], *, given: bool
) -> int:
    """Rows per chunk that keep every split boundary: ``chunk_rows`` when it divides them all;
    else, when ``chunk_rows`` was planned (not ``given``), the largest divisor of their greatest
    common divisor that is at most ``chunk_rows``; a given one is refused, naming the boundary.

    >>> plan_kept_chunk_rows(512, {4096: ("train", "val")}, given=True)
    512
    >>> plan_kept_chunk_rows(5000, {4096: ("train", "val"), 8192: ("val", "test")}, given=False)
    4096
    >>> plan_kept_chunk_rows(1000, {4096: ("train", "val")}, given=False)
    512
    >>> plan_kept_chunk_rows(1000, {4096: ("train", "val")}, given=True)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    shardload.errors.ConfigError: chunk_rows 1000 would cut chunks across a split boundary: row 4096 ends split 'train' and starts 'val' (a split is a set of whole chunks); choose chunk_rows dividing 4096, e.g. 512 or 1024
    """
    g = 0
    for b in boundaries:
        g = math.gcd(g, int(b))
    if g == 0 or g % chunk_rows == 0:
        return chunk_rows
    if given:
        bad = min(b for b in boundaries if b % chunk_rows)
        before, after = boundaries[bad]
        divs = _divisors(g)
        near = {max(d for d in divs if d <= chunk_rows), *[d for d in divs if d >= chunk_rows][:1]}
        eg = " or ".join(str(d) for d in sorted(near))
        raise ConfigError(
            f"chunk_rows {chunk_rows} would cut chunks across a split boundary: row {bad} ends "
            f"split {before!r} and starts {after!r} (a split is a set of whole chunks); choose "
            f"chunk_rows dividing {g}, e.g. {eg}"
        )
    return max(d for d in _divisors(g) if d <= chunk_rows)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n``, ascending.

    >>> _divisors(12)
    [1, 2, 3, 4, 6, 12]
    """
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted({*small, *(n // d for d in small)})


def plan_kept_splits(
    new_bounds: Sequence[int],
    old_bounds: Sequence[int],
    splits: Mapping[str, Sequence[int]],
    split_rows: Mapping[str, tuple[int, int]] | None = None,
) -> dict[str, tuple[int, ...]]:
    """Each split as chunks of ``new_bounds``: a chunk-set split holds the new chunks whose
    first row lay in one of its old chunks (with the boundaries kept, all their rows did); a
    row-range split holds the new chunks its range touches.

    >>> plan_kept_splits((0, 2, 4, 6, 8), (0, 4, 8), {"train": (0,), "val": (1,)})
    {'train': (0, 1), 'val': (2, 3)}
    >>> plan_kept_splits((0, 3, 6, 8), (0, 4, 8), {"a": (0, 1), "b": (1,)}, {"b": (5, 8)})
    {'a': (0, 1, 2), 'b': (1, 2)}
    """
    import bisect

    ranged = dict(split_rows or {})
    starts = list(new_bounds[:-1])
    out: dict[str, tuple[int, ...]] = {}
    for name, chunks in splits.items():
        if name in ranged:
            a, b = ranged[name]
            keep = [j for j, s in enumerate(starts) if s < b and new_bounds[j + 1] > a]
        else:
            old = set(int(i) for i in chunks)
            keep = [
                j for j, s in enumerate(starts) if bisect.bisect_right(old_bounds, s) - 1 in old
            ]
        out[name] = tuple(keep)
    return out


def plan_kept_shard_chunks(chunk_rows: int, shard_chunks: int, kept_rows: int, length: int) -> int:
    """Inner chunks per shard once planned chunks of ``chunk_rows`` rows shrank to ``kept_rows``
    (to keep the splits): shards of the rows (so the bytes) the default layout planned, at
    least one chunk and at most the store's chunks.

    >>> plan_kept_shard_chunks(21, 515, 7, 10**7)    # 3x smaller chunks, 3x more per shard
    1545
    >>> plan_kept_shard_chunks(8, 1353, 8, 65_536)   # not shrunk: as planned
    1353
    >>> plan_kept_shard_chunks(1000, 4, 8, 1000)     # never more chunks than the store has
    125
    """
    if kept_rows <= 0 or chunk_rows <= 0 or shard_chunks <= 0:
        raise ConfigError(
            f"bad chunking: {chunk_rows} rows shrunk to {kept_rows}, {shard_chunks} per shard"
        )
    per_shard = max(1, (chunk_rows * shard_chunks) // kept_rows)
    return int(min(per_shard, max(1, -(-length // kept_rows))))
