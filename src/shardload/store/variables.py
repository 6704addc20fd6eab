"""Variables of an anemoi-datasets store picked at open time (``shardload.select(store,
variables=..., drop_variables=...)``): its one array ``data`` has the variables on axis 0 of
a row (:mod:`shardload.formats.zarr.anemoi`), so picking them changes the row shape; the
manifest follows (the array's ``variables``, ``static["anemoi"]``: names and per-variable
statistics, which are per variable and so stay exact).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from shardload.errors import PlanError
from shardload.manifest.core import Manifest
from shardload.store.combined import Source
from shardload.store.core import Store


def _anemoi_array(store: Store, m: Manifest, sources: Mapping[str, Source]) -> str:
    """The (new) name of the array with a variables axis: anemoi's ``data``."""
    meta = store.manifest.static.get("anemoi")
    if isinstance(meta, Mapping):
        for new, src in sources.items():
            if src.names[0] == "data":
                return new
    raise PlanError(
        f"variables= and drop_variables= select along the variables axis of an anemoi-datasets "
        f"store's array 'data'; {store.url} has none (select its arrays with arrays= / drop=)"
    )


def select_variables(
    store: Store,
    m: Manifest,
    sources: Mapping[str, Source],
    variables: Sequence[str] | None,
    drop_variables: Sequence[str] | None,
) -> tuple[Manifest, dict[str, Source]]:
    """``m`` and ``sources`` (a selection of ``store``) with the variables picked."""
    name = _anemoi_array(store, m, sources)
    have = [str(v) for v in store.manifest.arrays[sources[name].names[0] or ""].attrs["variables"]]
    for option, names in (("variables", variables), ("drop_variables", drop_variables)):
        if isinstance(names, str):
            raise PlanError(f"{option}={names!r}: give a list of variable names, not a string")
        unknown = [v for v in names or () if v not in have]
        if unknown:
            raise PlanError(f"{option}=: variable(s) {unknown} not in {store.url}; it has {have}")
    if variables is not None and len(set(variables)) != len(variables):
        raise PlanError(f"variables={list(variables)} names a variable twice")
    kept = [
        v for v in (have if variables is None else variables) if v not in set(drop_variables or ())
    ]
    if not kept:
        raise PlanError(f"variables= and drop_variables= leave no variable of {store.url}")
    index = tuple(have.index(v) for v in kept)
    info = m.arrays[name]
    arrays = dict(m.arrays)
    arrays[name] = dataclasses.replace(
        info,
        shape=(info.shape[0], len(kept), *info.shape[2:]),
        attrs={**info.attrs, "variables": kept},
        features=None,
    )
    stats = {k: v for k, v in m.stats.items() if k != name and not k.startswith(f"{name}/")}
    meta: dict[str, Any] = dict(m.static["anemoi"])
    meta["variables"] = kept
    meta["statistics"] = {k: [v[i] for i in index] for k, v in meta["statistics"].items()}
    meta["tendencies"] = {
        d: {k: [v[i] for i in index] for k, v in by.items()}
        for d, by in (meta.get("tendencies") or {}).items()
    }
    out = dict(sources)
    out[name] = sources[name]._replace(picked=index, row_shape=info.row_shape)
    static = {**m.static, "anemoi": meta}
    return dataclasses.replace(m, arrays=arrays, stats=stats, static=static), out
