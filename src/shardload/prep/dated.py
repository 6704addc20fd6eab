"""Which stores ``prepare`` writes dated, and their time axis (docs/weather.md, "Dated stores").

A flat view over one sample dim whose coordinate holds dates at a regular frequency is a
*dated store*: one row per date of the axis from the first date to the last
(:class:`~shardload.manifest.time.TimeAxis`), a date the source lacks (a gap) keeping its row,
filled with NaN (:class:`~shardload.prep.views.dated.DatedView`) and listed as missing.
``dates:`` in the config gives the frequency (default: the most common step between
consecutive dates) and may declare the missing dates, which are checked against the data.

Without ``dates:`` a time coordinate that is not regular (dates off every grid, unsorted,
repeated) leaves the store undated, as before, with a warning; with ``dates:`` it is an error
naming the coordinate. Pure but for reading the coordinate's values.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from shardload.errors import ConfigError, StoreError, ViewError
from shardload.manifest.time import DATE_UNIT, TimeAxis

if TYPE_CHECKING:
    from shardload.prep.config import PrepareConfig

log = logging.getLogger("shardload.prep.driver")  # the name users' logs have always shown

#: dates named in one error message at most
SHOWN_DATES = 8


@dataclass(frozen=True)
class DatedRows:
    """The time axis of a dated store (its gaps as missing rows), the store row of each of
    the source's dates (strictly increasing), the rows declared missing in the config (None:
    no declaration) and the name of the time coordinate."""

    axis: TimeAxis
    source_rows: np.ndarray
    declared: tuple[int, ...] | None
    coord: str

    @property
    def gaps(self) -> tuple[int, ...]:
        return self.axis.missing


def show_dates(axis: TimeAxis, rows: Any) -> str:
    """The dates of ``rows``, as text (the first :data:`SHOWN_DATES`, then how many more)."""
    rows = sorted(int(r) for r in rows)
    text = ", ".join(str(axis.start + r * axis.frequency) for r in rows[:SHOWN_DATES])
    more = len(rows) - SHOWN_DATES
    return text + (f" and {more} more" if more > 0 else "")


def infer_frequency_s(dates: np.ndarray) -> int | None:
    """The most common step between consecutive dates, in seconds (the smallest of equally
    common ones); None for fewer than two dates or no positive step.

    >>> d = np.array(["2020-01-01T00", "2020-01-01T06", "2020-01-01T18"], "datetime64[s]")
    >>> infer_frequency_s(d)
    21600
    """
    steps = np.diff(np.asarray(dates).astype(f"datetime64[{DATE_UNIT}]")).astype(np.int64)
    steps = steps[steps > 0]
    if not steps.size:
        return None
    values, counts = np.unique(steps, return_counts=True)
    return int(values[counts == counts.max()].min())


def plan_dated_rows(ds: Any, cfg: PrepareConfig) -> DatedRows | None:
    """The :class:`DatedRows` of a flat view of ``ds`` as ``cfg`` asks, or None for a store
    that is not dated. Errors (``ViewError`` / ``ConfigError``) name the coordinate, the
    config key and the dates at fault."""
    want = cfg.dates.enabled
    if want is False:
        return None
    if cfg.view != "flat" or len(cfg.sample_dims) != 1:
        if want:
            raise ConfigError(
                "dates: a dated store is a flat view over one sample dimension (its time); "
                f"this config has view {cfg.view!r} and sample_dims {list(cfg.sample_dims)}"
            )
        return None
    dim = cfg.sample_dims[0]
    coord = ds.coords.get(dim) if ds is not None else None
    if coord is None or coord.dims != (dim,) or np.dtype(coord.dtype).kind != "M":
        if want:
            raise ViewError(
                f"dates: sample dimension {dim!r} has no coordinate of dates (datetime64) in "
                "the source; decode its times (source.decode_times) or remove dates:"
            )
        return None
    values = np.asarray(coord.values).astype(f"datetime64[{DATE_UNIT}]")
    try:
        axis, rows = _axis(values, cfg.dates.frequency_s, dim)
    except ViewError as exc:
        if want:
            raise
        log.warning("%s; the store is not dated (dates: {frequency: ...} makes this an error)", exc)
        return None
    declared = _declared_rows(axis, cfg.dates.missing)
    dated = DatedRows(axis, rows, declared, str(dim))
    if declared is not None:
        undeclared = sorted(set(dated.gaps) - set(declared))
        if undeclared:
            raise ViewError(
                f"dates.missing: the time coordinate {dim!r} lacks {len(undeclared)} date(s) "
                f"of its {axis.frequency_text} axis that are not declared missing: "
                f"{show_dates(axis, undeclared)}; add them to dates.missing"
            )
    return dated


def _axis(values: np.ndarray, frequency_s: int | None, dim: str) -> tuple[TimeAxis, np.ndarray]:
    if np.isnat(values).any():
        row = int(np.argmax(np.isnat(values)))
        raise ViewError(f"time coordinate {dim!r} has no date (NaT) at index {row}")
    freq = frequency_s or infer_frequency_s(values)
    if freq is None:
        raise ViewError(
            f"time coordinate {dim!r} has {len(values)} date(s) and no step between them: "
            "give dates: {frequency: ...}"
        )
    try:
        return TimeAxis.from_dates(values, frequency=freq)
    except StoreError as exc:
        raise ViewError(f"time coordinate {dim!r} is not a regular axis: {exc}") from None


def _declared_rows(axis: TimeAxis, missing: tuple[str, ...] | None) -> tuple[int, ...] | None:
    if missing is None:
        return None
    rows, bad = [], []
    for d in missing:
        try:
            rows.append(axis.row_of(np.datetime64(d, DATE_UNIT)))
        except StoreError:
            bad.append(d)
    if bad:
        raise ConfigError(
            f"dates.missing: {', '.join(bad[:SHOWN_DATES])} not on the time axis "
            f"({axis.start} to {axis.end} every {axis.frequency_text})"
        )
    return tuple(sorted(set(rows)))
