"""``dates:``: a dated store (one row per date of a regular time axis): its frequency, the
dates declared missing, the rows its statistics cover and its tendency statistics."""

from __future__ import annotations

import datetime
from typing import Annotated, Any

import numpy as np
from pydantic import BeforeValidator, Field, WithJsonSchema

from shardload.prep.config_models.fields import PositiveInt, StrictModel

#: the value of ``dates.statistics`` that covers every row (any other value names a split)
ALL_ROWS = "all"


def _frequency(v: Any) -> Any:
    """``6h``, ``1d``, ``30min``, ``90s`` or seconds -> seconds (a positive int), or None."""
    from shardload.errors import StoreError
    from shardload.manifest.time import parse_frequency_s

    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, str, datetime.timedelta)):
        raise ValueError(f"expected a frequency such as 6h, 1d, 30min or seconds, got {v!r}")
    try:
        s = parse_frequency_s(v)
    except StoreError as exc:
        raise ValueError(str(exc)) from None
    if s <= 0:
        raise ValueError(f"expected a positive frequency, got {v!r}")
    return s


def _dates(v: Any) -> Any:
    """A date or a list of dates (ISO text; YAML reads unquoted ones as datetimes) -> ISO
    text, each checked to be a date."""
    if v is None:
        return []
    items = v if isinstance(v, (list, tuple)) else [v]
    out = []
    for d in items:
        if isinstance(d, bool) or not isinstance(d, (str, datetime.date)):
            raise ValueError(f"expected dates such as 2020-01-03T06:00, got {d!r}")
        try:
            out.append(str(np.datetime64(d, "s")))
        except ValueError:
            raise ValueError(f"cannot read {d!r} as a date (e.g. 2020-01-03T06:00)") from None
    return out


Frequency = Annotated[
    int | None,
    BeforeValidator(_frequency),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 1}]}),
]
Dates = Annotated[
    list[str],
    BeforeValidator(_dates),
    WithJsonSchema({"type": "array", "items": {"type": "string"}}),
]


class DatesModel(StrictModel):
    """``dates: {...}``: the store must be dated (its sample axis one time dimension with a
    regular datetime coordinate; anything else is an error); ``dates: false``: never."""

    enabled: bool = Field(
        True, description="false: never a dated store (dates: false is short for this)"
    )
    frequency: Frequency = Field(
        None, description="the time step, e.g. 6h, 1d, 30min; default: the most common step"
    )
    missing: Dates | None = Field(
        None,
        description="dates known to be missing (gaps and all-NaN states); checked against the "
        "data: a disagreement is an error naming the dates",
    )
    statistics: str | None = Field(
        None,
        min_length=1,
        description="the split whose rows the statistics cover, or 'all'; default: train "
        "where there is a train split (val and test left out), else all",
    )
    tendencies: list[PositiveInt] = Field(
        default_factory=lambda: [1],
        description="steps k of the tendency statistics (of x[t+k] - x[t]); [] for none",
    )


def dates_shorthand(v: Any) -> Any:
    """``dates: true`` -> ``{}`` (a dated store with the defaults); ``false`` ->
    ``{enabled: false}`` (never dated)."""
    if isinstance(v, bool):
        return {"enabled": v}
    return v
