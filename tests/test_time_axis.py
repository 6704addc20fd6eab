"""The time axis of a dated store (manifest/time.py): regular dates, missing rows, JSON."""

import numpy as np
import pytest

from shardload.errors import StoreError
from shardload.manifest.core import Manifest
from shardload.manifest.time import TimeAxis, parse_frequency_s


def test_from_dates_lists_the_gaps_as_missing_rows():
    dates = np.array(["2020-01-01T00", "2020-01-01T06", "2020-01-02T00"], dtype="datetime64[h]")
    axis, rows = TimeAxis.from_dates(dates)
    assert axis.length == 5 and axis.frequency_text == "6h"
    assert axis.missing == (2, 3)
    assert rows.tolist() == [0, 1, 4]
    assert axis.dates[4] == np.datetime64("2020-01-02T00:00:00")
    assert axis.row_of("2020-01-01T12") == 2
    assert axis.missing_mask.tolist() == [False, False, True, True, False]


def test_dates_off_the_grid_and_out_of_order_are_refused():
    with pytest.raises(StoreError, match="not on the"):
        TimeAxis.from_dates(
            np.array(["2020-01-01T00", "2020-01-01T06", "2020-01-01T09"], "M8[h]"), frequency="6h"
        )
    with pytest.raises(StoreError, match="increase strictly"):
        TimeAxis.from_dates(np.array(["2020-01-01T06", "2020-01-01T00"], "M8[h]"))
    axis, _ = TimeAxis.from_dates(np.array(["2020-01-01"], "M8[D]"), frequency="1d")
    with pytest.raises(StoreError, match="not on this time axis"):
        axis.row_of("2020-01-03")


def test_round_trip_through_the_manifest_json():
    axis = TimeAxis(np.datetime64("2021-03-01T00"), np.timedelta64(6, "h"), 8, (5, 2))
    assert TimeAxis.from_dict(axis.to_dict()) == axis
    m = Manifest(
        format="npy", length=8, chunk_bounds=(0, 8), arrays={}, time=axis.to_dict(), complete=True
    )
    back = Manifest.from_json(m.to_json())
    assert back.time_axis == axis and back.time_axis.missing == (2, 5)
    assert Manifest(format="npy", length=0, chunk_bounds=(0,), arrays={}).time_axis is None


@pytest.mark.parametrize(
    ("text", "seconds"), [("6h", 21600), ("1d", 86400), ("30min", 1800), ("90s", 90), (3600, 3600)]
)
def test_frequencies_as_people_write_them(text, seconds):
    assert parse_frequency_s(text) == seconds
    with pytest.raises(StoreError, match="not understood"):
        parse_frequency_s("weekly")
