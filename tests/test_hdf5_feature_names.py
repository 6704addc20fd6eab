"""The HDF5 writer's ``/_features/NAME`` datasets are written in pieces (issue 27): a wide
array's lazy names (``GridNames``, 32.5 M at N320) are never all held as Python strings; the
names read back are the same. Measured with tracemalloc (numpy and str report to it)."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import h5py
import numpy as np

from shardload.formats.base import FormatOptions
from shardload.formats.hdf5.read import FILE_NAME
from shardload.formats.hdf5.write import FEATURES_GROUP, Hdf5Writer
from shardload.manifest.core import ArraySpec
from shardload.manifest.names import ChainedNames, GridNames


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


def test_hdf5_feature_names_are_written_in_pieces(tmp_path: Path) -> None:
    lab = lambda n: [f"{x:.3f}" for x in range(n)]  # noqa: E731
    names = ChainedNames([GridNames("t_1", [lab(200), lab(800)]), GridNames("q", [lab(300)])])
    spec = ArraySpec("state", (4, len(names)), np.dtype("float32"), features=names)
    small = ArraySpec("y", (4, 3), np.dtype("float32"), features=("a", "b", "é"))
    opts = FormatOptions(compression="none")
    writer = Hdf5Writer()
    peak = _peak_bytes(
        lambda: writer.create(tmp_path, {"state": spec, "y": small}, [0, 2, 4], opts)
    )
    # all 160,300 names as str objects and one object array: ~13 MB; pieces of 16,384: ~1.3 MB
    assert peak < 4_000_000, peak
    with h5py.File(tmp_path / FILE_NAME, "r") as f:
        got = f[FEATURES_GROUP]["state"].asstr()[...]
        assert f["state"].attrs["features"] == f"/{FEATURES_GROUP}/state"
        assert got.tolist() == list(names)
        assert f[FEATURES_GROUP]["y"].asstr()[...].tolist() == ["a", "b", "é"]
