"""Open-time selection and combination of dated stores, lazily: nothing is rewritten.

- :func:`select`: a period (``start``, ``end``, both included), a coarser ``frequency`` (a
  multiple of the native one: every k-th date), and arrays (``arrays`` picks and orders,
  ``drop`` leaves out, ``rename`` renames);
- :func:`join`: stores of the same dates side by side (more arrays); a date missing in any
  is missing in the join;
- :func:`concat`: stores one after the other (more dates), a gap between them becoming
  missing dates.

Each returns a :class:`CombinedStore`: a :class:`~shardload.store.core.Store` whose manifest
is derived (arrays renamed or left out, the ``time`` entry and the length replaced, chunk
bounds that never cross a chunk of the stores read) and whose reader maps each row to a row
of one of the stores (:mod:`shardload.manifest.combine`), so every loader reads it as any store.
Statistics: a selection of arrays keeps theirs; a concatenation's are the exact merge of its
stores' (:mod:`shardload.manifest.merge`); a time selection's stay those of the store it
selects from, over that store's statistics period (the ``time`` entry's ``statistics`` says
so): nothing is read again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from shardload.errors import PlanError
from shardload.manifest.combine import (
    Piece,
    join_axes,
    plan_chunk_bounds,
    plan_concat,
    plan_time_selection,
)
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.manifest.features import FeatureStats
from shardload.manifest.merge import merge_feature_stats
from shardload.manifest.time import TimeAxis, tendency_key
from shardload.store.combined import CombinedStore, Source
from shardload.store.core import Store
from shardload.store.variables import select_variables

__all__ = ["concat", "join", "select"]


# -- checks ---------------------------------------------------------------------------------------
def _check_readable(store: Store, what: str) -> None:
    if not isinstance(store, Store):
        raise PlanError(
            f"{what}: expected a Store (shardload.open_store), got {type(store).__name__}"
        )
    if "window" in store.manifest.static:
        raise PlanError(f"{what}: {store.url} cuts windows at load time; it cannot be combined")
    if store.ragged:
        raise PlanError(
            f"{what}: {store.url} has variable-length arrays {list(store.ragged)}: select "
            "arrays= without them"
        )


def _axis(store: Store, what: str) -> TimeAxis:
    axis = store.time
    if axis is None:
        raise PlanError(
            f"{what}: {store.url} has no time axis (a dated store: docs/weather.md, Dated stores)"
        )
    return axis


def _pick_arrays(
    store: Store,
    arrays: Sequence[str] | None,
    drop: Sequence[str] | None,
    rename: Mapping[str, str] | None,
) -> dict[str, str]:
    """New name -> name in ``store``, in the order ``arrays`` gives (else the store's)."""
    have = list(store.arrays)
    for option, names in (("arrays", arrays), ("drop", drop), ("rename", rename)):
        if isinstance(names, str):
            raise PlanError(f"{option}={names!r}: give a list of array names, not a string")
        unknown = [n for n in (names or ()) if n not in have]
        if unknown:
            raise PlanError(
                f"{option}=: array(s) {unknown} not in store {store.url}; it has {have}"
                + store.left_out(unknown)
            )
    if arrays is not None and len(set(arrays)) != len(arrays):
        raise PlanError(f"arrays={list(arrays)} names an array twice")
    chosen = [n for n in (have if arrays is None else arrays) if n not in set(drop or ())]
    if not chosen:
        raise PlanError(f"arrays= and drop= leave no array of {store.url}")
    out: dict[str, str] = {}
    for n in chosen:
        new = str((rename or {}).get(n, n))
        if new in out:
            raise PlanError(f"rename=: two arrays of {store.url} would be named {new!r}")
        out[new] = n
    return out


# -- manifests ------------------------------------------------------------------------------------
def _manifest(
    base: Manifest,
    names: Mapping[str, str],
    *,
    axis: TimeAxis | None,
    bounds: tuple[int, ...],
    stats: Mapping[str, FeatureStats],
    statistics: Any,
    keep_splits: bool,
    tendencies: Sequence[int] = (),
    arrays: Mapping[str, ArrayInfo] | None = None,
) -> Manifest:
    length = bounds[-1]
    have = arrays or base.arrays
    infos = {
        new: dataclasses.replace(have[old], name=new, shape=(length, *have[old].row_shape))
        for new, old in names.items()
    }
    time: dict[str, Any] = {}
    if axis is not None:
        time = {**axis.to_dict(), **({"statistics": statistics} if statistics else {})}
        if tendencies:
            time["tendencies"] = list(tendencies)
    return dataclasses.replace(
        base,
        length=length,
        chunk_bounds=bounds,
        arrays=infos,
        splits=dict(base.splits) if keep_splits else {},
        # the sample coordinates prepare wrote (_coords.npz) are the first store's rows'
        options=dict(base.options) if keep_splits else _without_coords(base.options),
        split_rows=dict(base.split_rows) if keep_splits else {},
        stats=stats,
        checksums="",  # each store's reader checks its own chunks
        feature_files={},
        time=time,
        complete=True,
    )


def _without_coords(options: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in options.items() if k != "sample_coords"}


def _tendencies(store: Store) -> list[int]:
    return [int(k) for k in store.manifest.time.get("tendencies") or ()]


def _picked_stats(
    store: Store, names: Mapping[str, str], tendencies: Sequence[int], step: int = 1
) -> dict[str, FeatureStats]:
    """The statistics of the arrays ``names`` (new -> old) and their tendencies over
    ``tendencies`` steps of the result (``step`` rows of ``store`` each)."""
    have, out = store.manifest.stats, {}
    for new, old in names.items():
        if old in have:
            out[new] = have[old]
        for k in tendencies:
            if tendency_key(old, k * step) in have:
                out[tendency_key(new, k)] = have[tendency_key(old, k * step)]
    return out


def _own_stats(store: Store) -> bool:
    """Whether ``store.manifest.stats`` describe its own rows (not a time selection's)."""
    return bool(getattr(store, "own_stats", True))


def _stats_entry(store: Store) -> dict[str, Any]:
    entry = store.manifest.time.get("statistics")
    return {"store": store.url, **(dict(entry) if isinstance(entry, Mapping) else {})}


# -- the public entry points -----------------------------------------------------------------------
def select(
    store: Store,
    *,
    start: Any = None,
    end: Any = None,
    frequency: Any = None,
    arrays: Sequence[str] | None = None,
    drop: Sequence[str] | None = None,
    rename: Mapping[str, str] | None = None,
    variables: Sequence[str] | None = None,
    drop_variables: Sequence[str] | None = None,
) -> CombinedStore:
    """A lazy selection of ``store``: dates ``start`` to ``end`` (both included, on the
    store's time axis) every ``frequency`` (a multiple of the native one, e.g. ``"12h"`` of a
    6-hourly store: every 2nd date), arrays picked and ordered (``arrays``), left out
    (``drop``), renamed (``rename={old: new}``). The time options need a dated store.
    ``variables`` (pick and order) and ``drop_variables`` select along the variables axis of
    an anemoi-datasets store's ``data`` (axis 0 of a row, :mod:`shardload.formats.zarr.anemoi`):
    the row shape changes, ``anemoi_metadata`` follows (names, per-variable statistics).

    Statistics: the selected arrays keep theirs, which are those of ``store`` over its own
    statistics period (a time selection does not recompute them: the ``time`` entry's
    ``statistics`` names that store and period). Splits carry over only without time options.
    """
    _check_readable(store, "select")
    names = _pick_arrays(store, arrays, drop, rename)
    timed = not (start is None and end is None and frequency is None)
    axis = store.time
    n = len(store)
    piece = Piece(0, n, 0, 0, 1)
    if timed:
        axis, piece = plan_time_selection(
            _axis(store, "select"), start=start, end=end, frequency=frequency, what=store.url
        )
    bounds = plan_chunk_bounds([piece], [store.chunk_bounds], 1)
    # a tendency over k steps of the result is one over k * step rows of the store
    tendencies = [t // piece.step for t in _tendencies(store) if t % piece.step == 0]
    stats = _picked_stats(store, names, tendencies, piece.step)
    statistics = store.manifest.time.get("statistics")
    if timed:
        statistics = {"of": [_stats_entry(store)], "rows": "those of the store selected from"}
    m = _manifest(
        store.manifest,
        names,
        axis=axis,
        bounds=bounds,
        stats=stats,
        statistics=statistics,
        keep_splits=not timed,
        tendencies=tendencies,
    )
    sources = {new: Source((old,)) for new, old in names.items()}
    if variables is not None or drop_variables is not None:
        m, sources = select_variables(store, m, sources, variables, drop_variables)
    own = _own_stats(store) and not timed
    return CombinedStore(m, [store], [piece], sources, url=f"select({store.url})", own_stats=own)


def join(*stores: Store) -> CombinedStore:
    """Stores of the same dates side by side: the arrays of each (names must differ: rename
    with :func:`select`), the time axes equal (start, frequency, length; the first
    disagreement is the error), a date missing in any store missing in the join. Statistics:
    each array keeps its store's."""
    if len(stores) < 2:
        raise PlanError(f"join needs two stores or more, got {len(stores)}")
    urls = [s.url for s in stores]
    for s in stores:
        _check_readable(s, "join")
    axis = join_axes([_axis(s, "join") for s in stores], urls)
    sources: dict[str, Source] = {}
    infos: dict[str, ArrayInfo] = {}
    stats: dict[str, FeatureStats] = {}
    tendencies = sorted(set.intersection(*(set(_tendencies(s)) for s in stores)))
    for k, s in enumerate(stores):
        for name in s.arrays:
            if name in sources:
                first = urls[sources[name].part or 0]
                raise PlanError(
                    f"join: array {name!r} is in {first} and in {s.url}: rename one, "
                    f"e.g. shardload.select(store, rename={{{name!r}: {name + '_2'!r}}})"
                )
            sources[name] = Source(tuple(name if j == k else None for j in range(len(stores))), k)
            infos[name] = s.manifest.arrays[name]
        stats.update(_picked_stats(s, {n: n for n in s.arrays}, tendencies))
    pieces = [Piece(0, axis.length, k) for k in range(len(stores))]
    bounds = plan_chunk_bounds(pieces, [s.chunk_bounds for s in stores], 1)
    m = _manifest(
        stores[0].manifest,
        {n: n for n in sources},
        axis=axis,
        bounds=bounds,
        stats=stats,
        statistics={"of": [_stats_entry(s) for s in stores]},
        keep_splits=False,
        tendencies=tendencies,
        arrays=infos,
    )
    own = all(_own_stats(s) for s in stores)
    return CombinedStore(m, stores, pieces, sources, url=f"join({', '.join(urls)})", own_stats=own)


def concat(*stores: Store) -> CombinedStore:
    """Stores one after the other in time: the same arrays (names, row shapes, dtypes) and
    frequency, each starting one step after the one before ends, or later: the dates in
    between are missing dates (rows of NaN, or 0 for integer arrays, that loaders leave out).
    Statistics: per array, the exact merge of every store's (an array some store has no
    statistics for has none; none at all when a store is a time selection, whose statistics
    are those of the store it selects from); no tendency statistics (the pairs of dates across a seam are in
    no store's)."""
    if len(stores) < 2:
        raise PlanError(f"concat needs two stores or more, got {len(stores)}")
    urls = [s.url for s in stores]
    first = stores[0]
    for s in stores:
        _check_readable(s, "concat")
        if list(s.arrays) != list(first.arrays):
            raise PlanError(
                f"concat: {s.url} has arrays {list(s.arrays)}, {first.url} {list(first.arrays)}"
                ": select the same arrays in the same order first"
            )
        for name in s.arrays:
            a, b = s.manifest.arrays[name], first.manifest.arrays[name]
            if (a.row_shape, a.dtype) != (b.row_shape, b.dtype):
                raise PlanError(
                    f"concat: array {name!r} has rows {a.row_shape} {a.dtype} in {s.url}, "
                    f"{b.row_shape} {b.dtype} in {first.url}"
                )
    axis, pieces = plan_concat([_axis(s, "concat") for s in stores], urls)
    bounds = plan_chunk_bounds(pieces, [s.chunk_bounds for s in stores], first.manifest.chunk_rows)
    stats: dict[str, FeatureStats] = {}
    statistics: dict[str, Any] = {"of": [_stats_entry(s) for s in stores]}
    own = all(_own_stats(s) for s in stores)
    if not own:  # a time selection's statistics are another period's: no merge
        statistics["rows"] = "none: the statistics of a time selection are not its rows'"
    for name in first.arrays if own else ():
        if all(name in s.manifest.stats for s in stores):
            merged = first.manifest.stats[name]
            for s in stores[1:]:
                merged = merge_feature_stats(merged, s.manifest.stats[name])
            stats[name] = merged
    m = _manifest(
        first.manifest,
        {n: n for n in first.arrays},
        axis=axis,
        bounds=bounds,
        stats=stats,
        statistics=statistics,
        keep_splits=False,
    )
    anemoi = first.manifest.static.get("anemoi")
    if isinstance(anemoi, Mapping):  # anemoi's per-variable statistics: one store's, no counts
        meta = {**anemoi, "statistics": {}, "tendencies": {}}
        m = dataclasses.replace(m, static={**m.static, "anemoi": meta})
    sources = {n: Source(tuple(n for _ in stores)) for n in first.arrays}
    return CombinedStore(m, stores, pieces, sources, url=f"concat({', '.join(urls)})")
