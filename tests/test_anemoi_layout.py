"""Stores in anemoi-datasets' layout, written here with zarr-python (fast, no anemoi venv):
what ``open_store`` makes of them and what it refuses. tests/test_anemoi.py checks the same
reads against stores anemoi-datasets itself builds (the layout below is theirs: a Zarr v2
group, ``data`` chunked one date and one member at a time, a missing date's chunks never
written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import StoreError
from shardload.formats.zarr.anemoi import anemoi_metadata

START = np.datetime64("2020-01-01T00:00:00", "s")
STEP = np.timedelta64(6, "h")


def write_anemoi_layout(
    path: Path,
    *,
    length: int = 8,
    variables: tuple[str, ...] = ("msl", "t2m"),
    members: int = 2,
    cells: int = 6,
    missing: tuple[int, ...] = (),
    dates: np.ndarray | None = None,
    attrs: dict[str, Any] | None = None,
    drop: tuple[str, ...] = (),
    chunks: tuple[int, int] = (1, 1),
    compressors: Any = "auto",
) -> np.ndarray:
    """An anemoi-datasets store at ``path``; returns ``data`` as written (NaN where missing).
    ``chunks``: dates and members a chunk of ``data`` holds (anemoi's: one and one)."""
    import zarr

    g = zarr.open_group(str(path), mode="w", zarr_format=2)
    v = len(variables)
    values = (np.arange(length * v * members * cells, dtype="f4") + 1).reshape(
        length, v, members, cells
    )
    data = g.create_array(
        "data",
        shape=values.shape,
        chunks=(chunks[0], v, chunks[1], cells),
        dtype="f4",
        fill_value=np.nan,
        compressors=compressors,
    )
    for i in range(length):
        if i not in missing:  # anemoi never writes a missing date's chunks
            data[i] = values[i]
    values[list(missing)] = np.nan
    stamps = START + np.arange(length) * STEP if dates is None else dates
    g.create_array("dates", shape=(length,), dtype="M8[s]", chunks=(length,))[:] = stamps
    for name, arr in (
        ("latitudes", np.linspace(50, 40, cells)),
        ("longitudes", np.linspace(0, 10, cells)),
        ("mean", np.arange(v) + 0.5),
        ("stdev", np.arange(v) + 1.5),
        ("minimum", np.arange(v) - 1.0),
        ("maximum", np.arange(v) + 9.0),
        ("statistics_tendencies_6h_mean", np.arange(v) + 0.25),
        ("statistics_tendencies_1d_stdev", np.arange(v) + 0.75),
    ):
        g.create_array(name, shape=arr.shape, dtype="f8")[:] = arr
    g.attrs.update(
        {
            "start_date": str(START),
            "end_date": str(START + (length - 1) * STEP),
            "frequency": "6h",
            "variables": list(variables),
            "missing_dates": [str(START + i * STEP) for i in missing],
            "field_shape": [cells],
            "dimensions": ["dates", "variables", "ensembles", "values"],
            "version": "0.30",
            **(attrs or {}),
        }
    )
    for key in drop:
        del g.attrs[key]
    return values


def test_open_store_describes_it(tmp_path):
    values = write_anemoi_layout(tmp_path / "a.zarr", missing=(3,))
    store = shardload.open_store(tmp_path / "a.zarr")
    assert store.arrays == ("data",)
    assert store.time.missing == (3,)
    assert str(store.time.start) == "2020-01-01T00:00:00" and store.time.frequency_text == "6h"
    np.testing.assert_array_equal(store.read("data"), values)  # as stored, NaN included
    meta = anemoi_metadata(store.manifest)
    assert meta.variables == ("msl", "t2m") and meta.ensembles == 2
    np.testing.assert_array_equal(meta.statistics["stdev"], [1.5, 2.5])
    np.testing.assert_array_equal(meta.latitudes, np.linspace(50, 40, 6))
    assert sorted(meta.tendencies) == ["1d", "6h"]
    np.testing.assert_array_equal(meta.tendencies["6h"]["mean"], [0.25, 1.25])
    np.testing.assert_array_equal(meta.tendencies["1d"]["stdev"], [0.75, 1.75])
    assert store.manifest.arrays["data"].attrs["variables"] == ["msl", "t2m"]


def test_loader_never_serves_the_missing_rows(tmp_path):
    values = write_anemoi_layout(tmp_path / "a.zarr", length=12, missing=(0, 5, 6))
    for world in (1, 2):
        seen = []
        for r in range(world):
            for b in shardload.iter_batches(
                tmp_path / "a.zarr", batch_size=2, rank=r, world_size=world
            ):
                assert not np.isnan(b["data"]).any()
                np.testing.assert_array_equal(b["data"], values[b["index"]])
                seen += b["index"].tolist()
        assert not set(seen) & {0, 5, 6} and len(seen) == len(set(seen))
        assert 9 - len(seen) < world


def test_rows_not_one_per_date_are_refused(tmp_path):
    """Older anemoi-datasets versions left missing dates' rows out: every row after the gap
    would carry the wrong date."""
    dates = START + np.array([0, 1, 2, 4, 5, 6]) * STEP
    write_anemoi_layout(tmp_path / "old.zarr", length=6, dates=dates)
    with pytest.raises(StoreError, match=r"old.zarr: row 3 is dated 2020-01-02T00:00:00"):
        shardload.open_store(tmp_path / "old.zarr")


@pytest.mark.parametrize(
    ("attrs", "match"),
    [
        ({"end_date": "2020-01-03T00:00:00"}, "end_date 2020-01-03T00:00:00 but 8 rows"),
        ({"missing_dates": ["2020-01-01T03:00:00"]}, "missing date 2020-01-01T03:00:00"),
        ({"variables": ["msl"]}, "names 1 variables for the 2 of array 'data'"),
        ({"frequency": "often"}, "a.zarr: frequency 'often' is not understood"),
    ],
)
def test_attributes_that_disagree_are_refused_by_name(tmp_path, attrs, match):
    write_anemoi_layout(tmp_path / "a.zarr", attrs=attrs)
    with pytest.raises(StoreError, match=match):
        shardload.open_store(tmp_path / "a.zarr")


def test_without_a_frequency_attribute_the_dates_give_it(tmp_path):
    """anemoi takes the first step of 'dates' then; the store is still dated, so its missing
    dates still leave the epoch (served as plain Zarr, they would be NaN rows)."""
    write_anemoi_layout(tmp_path / "a.zarr", missing=(1,), drop=("frequency",))
    store = shardload.open_store(tmp_path / "a.zarr")
    assert store.time.frequency_text == "6h" and store.time.missing == (1,)
    rows = [i for b in shardload.iter_batches(store, batch_size=3) for i in b["index"].tolist()]
    assert sorted(rows) == [0, 2, 3, 4, 5, 6, 7]


def test_plain_zarr_without_anemoi_attributes_stays_plain(tmp_path):
    import zarr

    g = zarr.open_group(str(tmp_path / "p.zarr"), mode="w", zarr_format=2)
    g.create_array("data", shape=(5, 2, 1, 3), chunks=(1, 2, 1, 3), dtype="f4")[:] = 1.0
    store = shardload.open_store(tmp_path / "p.zarr")
    assert store.time is None and "anemoi" not in store.manifest.static


def test_resume_is_exact_and_refuses_other_missing_dates(tmp_path):
    """A state saved mid-epoch resumes the rest exactly; one planned without the missing rows
    does not resume a run that includes them (the rows differ)."""
    from _resume import assert_resumes_exactly
    from shardload.errors import StateError
    from shardload.load.spec import LoadSpec
    from shardload.plan.resume import plan_state

    path = tmp_path / "a.zarr"
    write_anemoi_layout(path, length=14, missing=(2, 5, 13))
    assert_resumes_exactly(path, world=2, workers=2, consumed=(1, 3), batch_size=1, seed=3)
    spec = LoadSpec.build(path, batch_size=1)
    state = plan_state(spec.plan(world_size=1, num_workers=1, epoch=0), 2).to_dict()
    state["dataset"] = spec.fingerprint
    with pytest.raises(StateError, match="missing_dates="):  # the option it may come from
        list(shardload.iter_batches(path, batch_size=1, state=state, missing_dates="include"))


@pytest.mark.parametrize(
    ("members", "chunks", "compressors"),
    [
        (1, (1, 1), "auto"),  # chunks of whole dates
        (3, (1, 1), "auto"),  # anemoi's several members: one chunk per date and member
        (3, (1, 1), None),  # the same uncompressed
        (5, (3, 2), "auto"),  # chunks of 3 dates, members 2 at a time (the last one padded)
    ],
)
def test_chunks_of_dates_and_members_are_read_natively(
    tmp_path, monkeypatch, members, chunks, compressors
):
    """Chunks of whole dates, and chunks that split a date by ensemble member (anemoi's layout
    with several members), are read from their files and decoded straight into the batch,
    never through zarr-python: the same values as zarr's, NaN where a chunk (a whole missing
    date, or one member of a date) was never written."""
    import zarr

    from shardload.formats.zarr.read import ZarrReader

    path = tmp_path / "a.zarr"
    values = write_anemoi_layout(
        path, length=9, members=members, missing=(2,), chunks=chunks, compressors=compressors
    )
    if members > 1:  # one member of date 4 never written: NaN there only, as zarr reads it
        for f in (path / "data").glob(f"{4 // chunks[0]}.0.0.0"):
            f.unlink()
        values[(4 // chunks[0]) * chunks[0] : (4 // chunks[0] + 1) * chunks[0], :, : chunks[1]] = (
            np.nan
        )
    expected = zarr.open_array(str(path / "data"))[:]
    np.testing.assert_array_equal(expected, values)

    def no_zarr_python(*args, **kwargs):
        raise AssertionError("read through zarr-python")

    monkeypatch.setattr(ZarrReader, "_read_zarr", no_zarr_python)
    store = shardload.open_store(path)
    assert store.reader.layout("data") is not None
    np.testing.assert_array_equal(store.read("data"), values)
    np.testing.assert_array_equal(store.read("data", 1, 5), values[1:5])  # parts of chunks
    seen = []
    for b in shardload.iter_batches(store, batch_size=3, seed=1, missing_dates="include"):
        np.testing.assert_array_equal(b["data"], values[b["index"]])
        seen += b["index"].tolist()
    assert sorted(seen) == list(range(9))


def test_chunks_cut_along_two_row_axes_go_through_zarr_python(tmp_path):
    """Chunks that cut a date along two axes (members and cells) are not a layout the native
    reader plans: zarr-python reads them, the same values."""
    import zarr

    path = tmp_path / "a.zarr"
    values = write_anemoi_layout(path, members=3)
    g = zarr.open_group(str(path), mode="a", zarr_format=2)
    del g["data"]
    g.create_array("data", shape=values.shape, chunks=(1, 2, 1, 3), dtype="f4")[:] = values
    store = shardload.open_store(path)
    assert store.reader.layout("data") is None
    np.testing.assert_array_equal(store.read("data"), values)
