"""Metadata that lies (valid JSON, wrong numbers) is refused when the store is opened, naming
the file, before any value is served or any buffer sized from it (issue 26, rows 2 and 6).

Row 2: a Zarr array's ``zarr.json`` with ``data_type`` float32 -> int32 (same item size) was
served with the float bits reinterpreted, and ``shardload verify`` said "all good".
Row 6: a ``shardload.json`` whose ``length``, feature count or last chunk bound was edited
gave a raw ``IndexError`` (Store.read, a MapDataset worker) or ``MemoryError`` (iter_batches).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import StoreError
from test_corruption import FORMATS, _prepare

N = 400
LAYOUTS = ("npy", "zarr-none", "zarr-zstd", "zarr-sharded", "hdf5")
ZARR = ("zarr-none", "zarr-zstd", "zarr-sharded")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lying")
    src = root / "src.nc"
    rng = np.random.default_rng(0)
    xr.Dataset(
        {
            "a": ("sample", np.arange(N, dtype="f4") + 0.5),
            "b": (("sample", "lev"), rng.standard_normal((N, 3)).astype("f4")),
            "c": ("sample", np.arange(N, dtype="i8") * 10),
        }
    ).to_netcdf(src)
    out = {}
    for fmt in LAYOUTS:
        _prepare(root / fmt, src, FORMATS[fmt])
        out[fmt] = root / fmt
    return out


def _copy(pristine: dict[str, Path], fmt: str, tmp_path: Path) -> Path:
    root = tmp_path / fmt
    shutil.copytree(pristine[fmt], root)
    return root


def _edit_json(path: Path, edit) -> None:
    d = json.loads(path.read_text())
    edit(d)
    path.write_text(json.dumps(d))


def _read_every_way(root: Path | str) -> None:
    """Store.read, iter_batches and MapDataset over the whole store (each opens it)."""
    from shardload.torch import MapDataset

    s = shardload.open_store(root)
    for a in s.arrays:
        s.read(a)
    for _ in shardload.iter_batches(root, batch_size=64, seed=1):
        pass
    ds = MapDataset(root)
    for i in range(len(ds)):
        ds[i]


# -- row 2: zarr.json against the manifest ---------------------------------------------------------
ZARR_EDITS = {
    "data_type": lambda d: d.update(data_type="int32"),
    "shape": lambda d: d.update(shape=[d["shape"][0], 3]),
    "chunk_grid": lambda d: d["chunk_grid"]["configuration"].update(
        chunk_shape=[d["chunk_grid"]["configuration"]["chunk_shape"][0] * 2, 4]
    ),
}


@pytest.mark.parametrize("edit", list(ZARR_EDITS))
@pytest.mark.parametrize("fmt", ZARR)
def test_zarr_json_that_disagrees_with_the_manifest_is_refused_on_open(
    pristine, tmp_path, fmt, edit
):
    root = _copy(pristine, fmt, tmp_path)
    zarr_json = root / "x" / "zarr.json"
    _edit_json(zarr_json, ZARR_EDITS[edit])
    with pytest.raises(StoreError) as err:
        _read_every_way(root)
    assert str(zarr_json) in str(err.value) and "shardload.json" in str(err.value), err.value


@pytest.mark.parametrize("fmt", ZARR)
def test_verify_cli_refuses_a_zarr_json_of_another_data_type(
    pristine, tmp_path, capsys, caplog, fmt
):
    from shardload.cli.app import main

    root = _copy(pristine, fmt, tmp_path)
    assert main(["verify", str(root)]) == 0
    assert "all good" in capsys.readouterr().out
    _edit_json(root / "x" / "zarr.json", ZARR_EDITS["data_type"])
    assert main(["verify", str(root)]) == 2
    captured = capsys.readouterr()
    assert "all good" not in captured.out
    said = captured.err + caplog.text  # the CLI's log goes to stderr, or pytest's handler
    assert str(root / "x" / "zarr.json") in said, said


def test_zarr_json_of_another_data_type_is_refused_by_url(pristine, tmp_path):
    from shardload.move.serve import serving

    root = _copy(pristine, "zarr-zstd", tmp_path)
    _edit_json(root / "x" / "zarr.json", ZARR_EDITS["data_type"])
    want = r"zarr-zstd/x/zarr\.json says data_type int32"
    with serving(tmp_path) as url, pytest.raises(StoreError, match=want):
        _read_every_way(url + "zarr-zstd")


# -- row 6: shardload.json that contradicts itself or the array files --------------------------------
def _length_plus_1000(d):
    d["length"] += 1000


def _features_10_12(d):
    d["arrays"]["x"]["shape"][1] = 10**12
    if d["arrays"]["x"].get("num_features") is not None:
        d["arrays"]["x"]["num_features"] = 10**12


def _last_bound_past_the_data(d):
    d["chunk_bounds"][-1] += 37


def _everything_past_the_data(d):  # consistent with itself: only the array files tell
    d["chunk_bounds"][-1] += 37
    d["length"] += 37
    for a in d["arrays"].values():
        a["shape"][0] += 37
    if d.get("options", {}).get("blocks"):
        d["options"]["blocks"][-1] += 37


MANIFEST_EDITS = {
    "length+1000": _length_plus_1000,
    "features=1e12": _features_10_12,
    "last_bound+37": _last_bound_past_the_data,
    "all_lengths+37": _everything_past_the_data,
}


@pytest.mark.parametrize("edit", list(MANIFEST_EDITS))
@pytest.mark.parametrize("fmt", LAYOUTS)
def test_manifest_that_lies_is_a_store_error_naming_it_on_open(pristine, tmp_path, fmt, edit):
    root = _copy(pristine, fmt, tmp_path)
    _edit_json(root / "shardload.json", MANIFEST_EDITS[edit])
    with pytest.raises(StoreError) as err:
        shardload.open_store(root)
    assert str(root / "shardload.json") in str(err.value), err.value
    # and so on every path: never an IndexError, a MemoryError or wrong rows
    with pytest.raises(StoreError, match=r"shardload\.json"):
        _read_every_way(root)


@pytest.mark.parametrize("fmt", LAYOUTS)
def test_truthful_stores_open_and_read(pristine, fmt):
    """The checks pass on the stores as written (the errors above come from the edits)."""
    _read_every_way(pristine[fmt])
