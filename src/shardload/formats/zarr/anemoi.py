"""anemoi-datasets stores read as they are: the Zarr v2 group ``anemoi-datasets create`` writes,
described as a dated store (no rewriting).

The layout (anemoi-datasets 0.5, ``create/gridded``; read by its ``usage/gridded/store.py``):

- ``data``: ``(dates, variables, ensembles, values)``, one row per date of a regular range,
  chunked ``(1, variables, 1, values)`` by default; a missing date keeps its row, which is never
  written (its chunks read as the fill value, NaN);
- ``dates`` (``datetime64[s]``), ``latitudes``, ``longitudes`` (one value per grid cell);
- per-variable statistics ``mean``, ``stdev``, ``minimum``, ``maximum`` (older stores also
  ``sums``, ``squares``, ``count``, ``has_nans``), and with ``statistics: {tendencies: ...}``
  in the recipe the same of tendencies, ``statistics_tendencies_{delta}_{mean,...}``;
- group attributes ``start_date``, ``end_date``, ``frequency`` (``"6h"``; without it, the first
  step of ``dates``, as anemoi does), ``variables`` (or ``name_to_index``), ``missing_dates``
  (ISO dates), ``field_shape``, ``dimensions``, ...

The store becomes one array ``data`` whose row ``i`` equals
``anemoi.datasets.open_dataset(path)[i]`` (the stored values: anemoi serves them as they are),
a :class:`~shardload.manifest.time.TimeAxis` with the missing dates' rows (``Store.time``), and
``manifest.static["anemoi"]``: variables, per-variable statistics, field shape, latitudes and
longitudes (:func:`anemoi_metadata` gives them as numpy arrays). A store whose dates are not the
regular range its attributes describe (older anemoi-datasets versions dropped missing dates'
rows; anemoi refuses those stores too) is refused, naming the store and the first wrong date:
serving it would give rows the wrong dates.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.manifest.core import ArrayInfo, Manifest
from shardload.manifest.time import TimeAxis, parse_frequency_s
from shardload.plan.chunks import plan_chunk_bounds

#: the statistics arrays of an anemoi store, by anemoi's names (the first four always)
STATISTICS = ("mean", "stdev", "minimum", "maximum", "sums", "squares", "count", "has_nans")
#: anemoi's own names of the axes of ``data`` (its ``dimensions`` attribute)
DIMENSIONS = ("dates", "variables", "ensembles", "values")
LAYOUT = "anemoi-datasets"
#: the prefix of the arrays of statistics of tendencies (``x[t] - x[t - delta]``) per delta
TENDENCIES = "statistics_tendencies_"


def looks_like_anemoi(attrs: Mapping[str, Any], members: Mapping[str, Any]) -> bool:
    """Whether a Zarr group's attributes and arrays are an anemoi-datasets store's (pure)."""
    data = members.get("data")
    return (
        data is not None
        and len(data.shape) == 4
        and "dates" in members
        and ("variables" in attrs or "name_to_index" in attrs)
    )


def manifest_from_anemoi(
    attrs: Mapping[str, Any], members: Mapping[str, Any], root: str
) -> Manifest:
    """The manifest of the anemoi-datasets store at ``root`` (its group attributes and arrays,
    opened with zarr): one array ``data``, its time axis and ``static["anemoi"]``."""
    data = members["data"]
    shape = tuple(int(s) for s in data.shape)
    chunks = tuple(int(c) for c in data.chunks)
    variables = _variables(attrs, shape[1], root)
    axis = _time_axis(attrs, np.asarray(members["dates"][...]), shape[0], root)
    stats = {}
    for name in STATISTICS:
        if name in members:
            values = np.asarray(members[name][...])
            if values.shape != (shape[1],):
                raise StoreError(
                    f"anemoi store {root}: statistics {name!r} has shape {values.shape}, not "
                    f"one value per variable ({shape[1]})"
                )
            stats[name] = values.tolist()
    tendencies: dict[str, dict[str, list[float]]] = {}
    for key, arr in members.items():  # statistics_tendencies_{delta}_{stat}, e.g. ..._6h_mean
        if key.startswith(TENDENCIES):
            delta, _, stat = key[len(TENDENCIES) :].rpartition("_")
            values = np.asarray(arr[...])
            if delta and values.shape == (shape[1],):
                tendencies.setdefault(delta, {})[stat] = values.tolist()
    coords = {}
    for name in ("latitudes", "longitudes"):
        if name in members:
            values = np.asarray(members[name][...]).reshape(-1)
            if values.size != shape[3]:
                raise StoreError(
                    f"anemoi store {root}: {name} has {values.size} values for {shape[3]} grid "
                    "cells"
                )
            coords[name] = values.tolist()
    dims = attrs.get("dimensions")
    dims = list(dims) if isinstance(dims, list) and len(dims) == 4 else list(DIMENSIONS)
    static = {
        "anemoi": {
            "variables": variables,
            "statistics": stats,
            "tendencies": tendencies,
            "field_shape": list(attrs.get("field_shape") or [shape[3]]),
            "ensembles": shape[2],
            **coords,
            **{
                k: attrs[k]
                for k in ("statistics_start_date", "statistics_end_date", "version", "resolution")
                if attrs.get(k) is not None
            },
        }
    }
    info = ArrayInfo(
        name="data",
        shape=shape,
        dtype=str(np.dtype(data.dtype)),
        chunk_rows=chunks[0],
        path="data",
        attrs={"dims": dims, "variables": variables},
    )
    bounds = plan_chunk_bounds(shape[0], chunks[0])
    return Manifest(
        format="zarr",
        length=shape[0],
        chunk_bounds=bounds,
        arrays={"data": info},
        splits={"all": tuple(range(len(bounds) - 1))},
        static=static,
        # "plain zarr": read through zarr-python, a chunk never written reads as its fill value
        # (a missing date's row), no checksums
        provenance={"source": "plain zarr", "layout": LAYOUT, "root": root},
        complete=True,
        time=axis.to_dict(),
    )


def _variables(attrs: Mapping[str, Any], count: int, root: str) -> list[str]:
    if "variables" in attrs:
        names = [str(v) for v in attrs["variables"]]
    else:
        index = dict(attrs["name_to_index"])
        names = [str(k) for k, _ in sorted(index.items(), key=lambda kv: int(kv[1]))]
    if len(names) != count:
        raise StoreError(
            f"anemoi store {root} names {len(names)} variables for the {count} of array 'data'"
        )
    return names


def _time_axis(attrs: Mapping[str, Any], dates: np.ndarray, length: int, root: str) -> TimeAxis:
    """The regular axis the attributes describe, checked against the stored ``dates``."""
    stored = dates.astype("datetime64[s]")
    if stored.shape != (length,):
        raise StoreError(
            f"anemoi store {root}: 'dates' has {stored.shape} values for the {length} rows of 'data'"
        )
    if length == 0:
        raise StoreError(f"anemoi store {root} has no dates (array 'data' has no rows)")
    # without the attribute anemoi takes the first step of 'dates' (its GriddedZarr.frequency)
    frequency = attrs.get("frequency")
    try:
        if frequency is None:
            if length < 2:
                raise StoreError("no 'frequency' attribute and one date: no frequency")
            frequency = int((stored[1] - stored[0]) / np.timedelta64(1, "s"))
        freq_s = parse_frequency_s(frequency)
    except StoreError as exc:
        raise StoreError(f"anemoi store {root}: {exc}") from None
    start = np.datetime64(attrs.get("start_date") or stored[0], "s")
    axis = TimeAxis(start=start, frequency=np.timedelta64(freq_s, "s"), length=length)
    wrong = np.flatnonzero(stored != axis.dates)
    if wrong.size:
        i = int(wrong[0])
        raise StoreError(
            f"anemoi store {root}: row {i} is dated {stored[i]} where its start_date and "
            f"frequency {frequency!r} say {axis.dates[i]}; its dates are not one row per "
            "date of a regular range (older anemoi-datasets versions left missing dates out: "
            "anemoi refuses such stores too; recreate it with a newer anemoi-datasets)"
        )
    end = attrs.get("end_date")
    if end is not None and np.datetime64(end, "s") != axis.end:
        raise StoreError(
            f"anemoi store {root}: end_date {end} but {length} rows every "
            f"{frequency!r} from {axis.start} end at {axis.end} (rows missing?)"
        )
    missing = [np.datetime64(d, "s") for d in attrs.get("missing_dates") or ()]
    rows = []
    for d in missing:
        try:
            rows.append(axis.row_of(d))
        except StoreError as exc:
            raise StoreError(f"anemoi store {root}: missing date {d}: {exc}") from None
    return TimeAxis(start=axis.start, frequency=axis.frequency, length=length, missing=tuple(rows))


@dataclass(frozen=True)
class AnemoiMetadata:
    """What an anemoi-datasets store says besides its rows: variable names (axis 1 of
    ``data``), per-variable statistics by anemoi's names (``mean``, ``stdev``, ``minimum``,
    ``maximum``, ...), the same of tendencies by delta (``tendencies["6h"]["mean"]``: of
    ``x[t] - x[t - 6h]``, when the store has them), the grid's ``field_shape``, ``latitudes``
    and ``longitudes`` (one per cell, axis 3)."""

    variables: tuple[str, ...]
    statistics: Mapping[str, np.ndarray]
    tendencies: Mapping[str, Mapping[str, np.ndarray]]
    field_shape: tuple[int, ...]
    ensembles: int
    latitudes: np.ndarray | None
    longitudes: np.ndarray | None


def anemoi_metadata(manifest: Manifest) -> AnemoiMetadata | None:
    """The anemoi metadata of a store opened from an anemoi-datasets store, else None."""
    meta = manifest.static.get("anemoi")
    if not isinstance(meta, Mapping):
        return None

    def arr(name: str) -> np.ndarray | None:
        return np.asarray(meta[name], dtype=np.float64) if name in meta else None

    return AnemoiMetadata(
        variables=tuple(meta["variables"]),
        statistics={k: np.asarray(v) for k, v in meta["statistics"].items()},
        tendencies={
            d: {k: np.asarray(v) for k, v in by.items()}
            for d, by in (meta.get("tendencies") or {}).items()
        },
        field_shape=tuple(int(s) for s in meta["field_shape"]),
        ensembles=int(meta["ensembles"]),
        latitudes=arr("latitudes"),
        longitudes=arr("longitudes"),
    )
