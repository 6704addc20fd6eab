"""The time axis of a dated store: one row per date, at a regular frequency, some dates missing.

A *dated store* has one sample per date (a whole state of the atmosphere or ocean): row ``i``
is the date ``start + i * frequency``. Dates the data lacks (a gap in the source's dates, or a
state that is all NaN) still have their row, listed in ``missing``; loading never yields such
a row unless asked to fill it. This is the layout of anemoi-datasets stores (a row per date of
a regular range, ``missing_dates`` beside it), so that both kinds of store answer the same
questions through :class:`TimeAxis` (``Store.time``).

In the manifest it is the ``time`` entry::

    "time": {"start": "2020-01-01T00:00:00", "frequency_s": 21600, "length": 1460,
             "missing": [17, 18]}

Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import numpy as np

from shardload.errors import StoreError

#: the unit every date and frequency of a time axis is kept in
DATE_UNIT: Final = "s"


@dataclass(frozen=True)
class TimeAxis:
    """A regular time axis: ``length`` dates from ``start`` every ``frequency``; rows listed
    in ``missing`` hold no data (a gap or an all-NaN state)."""

    start: np.datetime64
    frequency: np.timedelta64
    length: int
    missing: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "start", np.asarray(self.start).astype(f"datetime64[{DATE_UNIT}]")[()]
        )
        object.__setattr__(
            self, "frequency", np.asarray(self.frequency).astype(f"timedelta64[{DATE_UNIT}]")[()]
        )
        object.__setattr__(self, "missing", tuple(sorted({int(i) for i in self.missing})))
        if self.frequency <= np.timedelta64(0, DATE_UNIT):
            raise StoreError(f"a time axis needs a positive frequency, got {self.frequency}")
        if self.length < 0:
            raise StoreError(f"a time axis needs a length >= 0, got {self.length}")
        bad = [i for i in self.missing if not 0 <= i < self.length]
        if bad:
            raise StoreError(
                f"missing dates {bad[:5]} are rows outside the time axis of {self.length} dates"
            )

    # -- questions ----------------------------------------------------------------------------
    @property
    def dates(self) -> np.ndarray:
        """Every row's date, ``datetime64[s]``."""
        return self.start + np.arange(self.length) * self.frequency

    @property
    def end(self) -> np.datetime64:
        """The last row's date."""
        return self.start + (self.length - 1) * self.frequency

    @property
    def missing_mask(self) -> np.ndarray:
        """``bool[length]``: True where the row's date is missing."""
        mask = np.zeros(self.length, dtype=bool)
        mask[list(self.missing)] = True
        return mask

    @property
    def missing_dates(self) -> np.ndarray:
        return self.start + np.asarray(self.missing, dtype=np.int64) * self.frequency

    def row_of(self, date: Any) -> int:
        """The row of ``date`` (a ``datetime64``, ISO string or ``datetime``); StoreError when
        it is outside the axis or between two of its dates."""
        d = np.datetime64(date, DATE_UNIT)
        steps, rest = divmod(int((d - self.start) / np.timedelta64(1, DATE_UNIT)), self.seconds)
        if rest or not 0 <= steps < self.length:
            raise StoreError(
                f"date {d} is not on this time axis ({self.start} to {self.end} every "
                f"{self.frequency_text})"
            )
        return steps

    @property
    def seconds(self) -> int:
        """The frequency in seconds."""
        return int(self.frequency / np.timedelta64(1, DATE_UNIT))

    @property
    def frequency_text(self) -> str:
        """The frequency as people write it: ``6h``, ``1d``, ``90min``, ``30s``."""
        s = self.seconds
        for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
            if s % n == 0:
                return f"{s // n}{unit}"
        return f"{s}s"

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "start": str(self.start),
            "frequency_s": self.seconds,
            "length": int(self.length),
            "missing": list(self.missing),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TimeAxis:
        try:
            return cls(
                start=np.datetime64(str(d["start"]), DATE_UNIT),
                frequency=np.timedelta64(int(d["frequency_s"]), DATE_UNIT),
                length=int(d["length"]),
                missing=tuple(int(i) for i in d.get("missing", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise StoreError(f"malformed time axis in the manifest: {exc!r}") from exc

    @classmethod
    def from_dates(
        cls, dates: Sequence[Any] | np.ndarray, *, frequency: Any = None
    ) -> tuple[TimeAxis, np.ndarray]:
        """The regular axis over ``dates`` (sorted, unique) and, for each given date, its row.

        ``frequency`` (a ``timedelta64``, seconds, or a string such as ``"6h"``) defaults to
        the smallest step between consecutive dates; dates the axis has but ``dates`` lacks
        are ``missing``. A date off the grid (not start + k * frequency) is a StoreError.
        """
        d = np.asarray(dates).astype(f"datetime64[{DATE_UNIT}]")
        if d.ndim != 1 or d.size == 0:
            raise StoreError("a time axis needs a 1-D, non-empty list of dates")
        steps = np.diff(d).astype(np.int64)
        if np.any(steps <= 0):
            i = int(np.argmax(steps <= 0))
            raise StoreError(f"dates must increase strictly: {d[i]} is followed by {d[i + 1]}")
        if frequency is None:
            if d.size < 2:
                raise StoreError("one date alone gives no frequency: pass frequency=")
            freq_s = int(steps.min())
        else:
            freq_s = parse_frequency_s(frequency)
        offsets = (d - d[0]).astype(np.int64)
        rows, rest = np.divmod(offsets, freq_s)
        if np.any(rest):
            i = int(np.argmax(rest != 0))
            raise StoreError(f"date {d[i]} is not on the {freq_s} s grid that starts at {d[0]}")
        length = int(rows[-1]) + 1
        have = np.zeros(length, dtype=bool)
        have[rows] = True
        axis = cls(
            start=d[0],
            frequency=np.timedelta64(freq_s, DATE_UNIT),
            length=length,
            missing=tuple(np.flatnonzero(~have).tolist()),
        )
        return axis, rows.astype(np.int64)


def parse_frequency_s(value: Any) -> int:
    """Seconds of a frequency given as seconds (int), ``timedelta64``, ``datetime.timedelta``
    or text (``"6h"``, ``"1d"``, ``"30min"``, ``"90s"``)."""
    import datetime

    if isinstance(value, np.timedelta64):
        return int(value / np.timedelta64(1, "s"))
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds())
    if isinstance(value, (int, np.integer)):
        return int(value)
    text = str(value).strip().lower()
    for unit, n in (("min", 60), ("d", 86400), ("h", 3600), ("s", 1)):
        if text.endswith(unit):
            num = text[: -len(unit)].strip() or "1"
            try:
                return int(num) * n
            except ValueError:
                break
    raise StoreError(
        f"frequency {value!r} is not understood: give seconds or text such as '6h', '1d', '30min'"
    )


def tendency_key(array: str, step: int) -> str:
    """The name of array ``array``'s tendency statistics over ``step`` rows in
    ``Manifest.stats`` (of ``x[t + step] - x[t]``, written by ``prepare`` for dated stores).

    >>> tendency_key("x", 1)
    'x/tendency_1'
    """
    return f"{array}/tendency_{int(step)}"
