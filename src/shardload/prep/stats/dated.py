"""The statistics of a dated store, block by block: over the statistics period only (the train
split by default: no val or test row informs the normalisation), missing dates left out, and
the *tendency statistics* -- of the increments ``x[t+k] - x[t]`` for each step ``k``, where
both dates are in the period and neither is missing.

A write task gets its block's rows and the first ``max(k)`` rows after them (the *halo*), so
that every pair ``(t, t+k)`` belongs to the block of ``t``: each block's partials are
mergeable as the others (:mod:`.ordered`), and a parallel run gives the values of one pass.

A block also finds its *missing states*: rows whose values are all NaN (every float array;
a date the source lacks was filled so). With missing dates declared in the config, a row
declared missing that holds data, or an all-NaN row not declared, is an error naming every
such date, when the store is published (:func:`time_entry`; the store stays in
``OUT.partial``, and a run with the list corrected resumes it). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.errors import ViewError
from shardload.manifest.time import TimeAxis, tendency_key
from shardload.prep.stats.block import Partial, partial
from shardload.prep.stats.ordered import _Running

#: block notes (:class:`~shardload.prep.stats.ordered.OrderedMerge`): the block's missing rows
MISSING_NOTE = "missing_rows"
#: block notes: NaN values in the block's rows that are not missing, one key per array
NAN_NOTE = "nan_values:"
#: bytes of float64 increments computed at a time
_SLAB_BYTES = 1 << 22


@dataclass(frozen=True, eq=False)
class DatedStats:
    """What a write task needs to compute a dated store's statistics: the time axis (its gaps
    as missing rows), the rows declared missing (None: none declared), the period (sorted,
    disjoint row ranges ``[a, b)``, named ``period_name``) and the tendency steps."""

    axis: TimeAxis
    declared: tuple[int, ...] | None
    period: tuple[tuple[int, int], ...]
    period_name: str
    tendencies: tuple[int, ...]

    @property
    def halo_rows(self) -> int:
        return max(self.tendencies, default=0)

    def key(self) -> str:
        """What the statistics depend on besides the rows (saved with them, so that a resumed
        run never merges statistics of another period). Not the declared missing dates: they
        are checked when the store is published, so a run that failed that check resumes."""
        text = repr((self.period, self.tendencies, self.axis.to_dict()))
        return hashlib.sha256(text.encode()).hexdigest()[:24]

    def period_mask(self, a: int, b: int) -> np.ndarray:
        """``bool[b - a]``: which rows of ``[a, b)`` the period covers."""
        mask = np.zeros(max(0, b - a), dtype=bool)
        for lo, hi in self.period:
            if hi > a and lo < b:
                mask[max(lo, a) - a : min(hi, b) - a] = True
        return mask


def stat_names(specs: Mapping[str, Any], dated: DatedStats | None) -> list[str]:
    """The names of the statistics a store keeps: one per array, and its tendencies."""
    names = list(specs)
    if dated is not None:
        names += [tendency_key(n, k) for n in tendency_arrays(specs) for k in dated.tendencies]
    return names


def tendency_arrays(specs: Mapping[str, Any]) -> list[str]:
    """The arrays that get tendency statistics: numbers of fixed row shape."""
    return [
        n
        for n, s in specs.items()
        if not getattr(s, "ragged", False) and np.dtype(s.dtype).kind in "iuf"
    ]


def plan_period(
    name: str | None,
    length: int,
    chunk_bounds: Any,
    splits: Mapping[str, tuple[int, ...]],
    split_rows: Mapping[str, tuple[int, int]],
) -> tuple[str, tuple[tuple[int, int], ...]]:
    """The statistics period: split ``name`` (None: ``train`` if there is one, else every
    row; ``"all"``: every row) as sorted, disjoint row ranges."""
    if name is None:
        name = "train" if "train" in splits else "all"
    if name in split_rows:
        lo, hi = split_rows[name]
        return name, ((int(lo), int(hi)),)
    if name in splits:
        ranges: list[list[int]] = []
        for c in sorted(splits[name]):
            a, b = int(chunk_bounds[c]), int(chunk_bounds[c + 1])
            if ranges and ranges[-1][1] == a:
                ranges[-1][1] = b
            else:
                ranges.append([a, b])
        return name, tuple((a, b) for a, b in ranges)
    if name == "all":
        return name, ((0, int(length)),)
    raise ViewError(f"dates.statistics: {name!r} is not a split; the store has {sorted(splits)}")


def missing_rows(arrays: Mapping[str, np.ndarray], n: int) -> tuple[np.ndarray, dict[str, int]]:
    """``bool[n]``: rows whose every value of every float array is NaN (none without float
    arrays); and each float array's NaN values in the other rows."""
    floats = {k: v for k, v in arrays.items() if v.dtype.kind == "f"}
    missing = np.ones(n, dtype=bool) if floats else np.zeros(n, dtype=bool)
    nan_rows: dict[str, np.ndarray] = {}
    for name, v in floats.items():
        nan = np.isnan(v.reshape(n, -1))
        nan_rows[name] = np.add.reduce(nan, axis=1, dtype=np.int64)
        missing &= nan_rows[name] == nan.shape[1]
    return missing, {k: int(c[~missing].sum()) for k, c in nan_rows.items()}


def block_statistics(
    dated: DatedStats,
    arrays: Mapping[str, np.ndarray],
    a: int,
    b: int,
    halo: Mapping[str, np.ndarray],
) -> tuple[dict[str, Partial], dict[str, np.ndarray]]:
    """The partials of rows ``[a, b)`` (``arrays``; ``halo``: rows ``[b, b + h)``) and the
    block's notes: its missing rows and NaN counts."""
    n = b - a
    missing, nans = missing_rows(arrays, n)
    use = dated.period_mask(a, b) & ~missing
    stats = {k: partial(v if use.all() else v[use]) for k, v in arrays.items()}
    if dated.tendencies:
        h = len(next(iter(halo.values()))) if halo else 0
        halo_missing = missing_rows(halo, h)[0] if h else np.zeros(0, bool)
        use_ext = np.concatenate([use, dated.period_mask(b, b + h) & ~halo_missing])
        for name in tendency_arrays({k: v for k, v in arrays.items()}):
            x, after = arrays[name], halo.get(name, arrays[name][:0])
            for k in dated.tendencies:
                stats[tendency_key(name, k)] = tendency_partial(x, after, k, use_ext)
    notes = {MISSING_NOTE: a + np.flatnonzero(missing).astype(np.int64)}
    notes.update({f"{NAN_NOTE}{k}": np.array([c], np.int64) for k, c in nans.items()})
    return stats, notes


def tendency_partial(x: np.ndarray, after: np.ndarray, k: int, use: np.ndarray) -> Partial:
    """The partial of ``rows[t + k] - rows[t]`` over the rows ``t`` of ``x`` where ``use[t]``
    and ``use[t + k]``; ``rows`` is ``x`` followed by ``after``. Increments of float32 rows
    are float32 (one correctly rounded subtraction: within half an ulp of the increment, and
    the statistics' fast path), of other types float64."""
    n, total = len(x), len(x) + len(after)
    stop = min(n, total - k)
    row_shape = x.shape[1:]
    work = np.float32 if x.dtype == np.float32 else np.float64
    # merged in place (merge() makes a dozen row-sized arrays), from the second partial on:
    # one partial (a one-row block, k = 1) is returned as it is (a view of its increment)
    first: Partial | None = None
    acc: _Running | None = None
    if stop > 0:
        pair = use[:stop] & use[k : stop + k]
        row_bytes = np.dtype(work).itemsize * int(np.prod(row_shape, dtype=np.int64))
        step = max(1, _SLAB_BYTES // max(1, row_bytes))
        for s in range(0, stop, step):
            e = min(stop, s + step)
            m = pair[s:e]
            if not m.any():
                continue
            d = np.subtract(_rows(x, after, s + k, e + k), _rows(x, after, s, e), dtype=work)
            p = partial(d if m.all() else d[m])
            if first is None:
                first = p
            elif acc is None:
                acc = _Running(first)
                acc.add(p)
            else:
                acc.add(p)
    if acc is not None:
        return acc.partial
    return first if first is not None else partial(np.empty((0, *row_shape), work))


def _rows(x: np.ndarray, after: np.ndarray, i0: int, i1: int) -> np.ndarray:
    """Rows ``[i0, i1)`` of ``x`` followed by ``after``."""
    n = len(x)
    if i1 <= n:
        return x[i0:i1]
    if i0 >= n:
        return after[i0 - n : i1 - n]
    return np.concatenate([x[i0:], after[: i1 - n]])


def check_missing(axis: TimeAxis, declared: np.ndarray, found: np.ndarray, *, offset: int) -> None:
    """Declared missing rows (``bool``) against found ones: a ViewError naming the dates of
    every disagreement."""
    from shardload.prep.dated import show_dates

    has_data = np.flatnonzero(declared & ~found) + offset
    undeclared = np.flatnonzero(found & ~declared) + offset
    problems = []
    if has_data.size:
        problems.append(
            f"{has_data.size} date(s) declared missing have data: {show_dates(axis, has_data)}"
        )
    if undeclared.size:
        problems.append(
            f"{undeclared.size} date(s) whose states are all NaN are not declared missing: "
            f"{show_dates(axis, undeclared)}"
        )
    if problems:
        raise ViewError(
            "dates.missing disagrees with the data: "
            + "; ".join(problems)
            + " (the list in the config must be the dates without data)"
        )


def time_entry(dated: DatedStats, found: np.ndarray) -> dict[str, Any]:
    """The manifest's ``time`` entry: the axis with every missing row (gaps and all-NaN
    states, ``found``), the statistics period and the tendency steps. With missing dates
    declared, they must be the ones found (each block checked its own; this checks all)."""
    from dataclasses import replace

    found = np.union1d(np.asarray(found, dtype=np.int64), dated.axis.missing).astype(np.int64)
    axis = replace(dated.axis, missing=tuple(found.tolist()))
    if dated.declared is not None:
        declared = np.zeros(axis.length, dtype=bool)
        declared[list(dated.declared)] = True
        check_missing(axis, declared, axis.missing_mask, offset=0)
    mask = axis.missing_mask
    period_rows = sum(b - a for a, b in dated.period)
    used = period_rows - sum(int(mask[a:b].sum()) for a, b in dated.period)
    date = lambda r: str(axis.start + int(r) * axis.frequency)  # noqa: E731
    return {
        **axis.to_dict(),
        "statistics": {
            "period": dated.period_name,
            "rows": [[int(a), int(b)] for a, b in dated.period],
            "dates": [[date(a), date(b - 1)] for a, b in dated.period],
            "num_rows": int(period_rows),
            "num_dates": int(used),
        },
        "tendencies": list(dated.tendencies),
    }
