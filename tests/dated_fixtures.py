"""Dated stores for the window tests: a prepared store whose manifest gets a time axis.

Until ``prepare`` writes dated stores itself, a test prepares an ordinary store with
``sample_dims: [time]`` and sets the manifest's ``time`` entry (:func:`set_time_axis`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import shardload
from shardload.layout import MANIFEST_NAME
from shardload.manifest.core import Manifest
from shardload.manifest.time import TimeAxis
from shardload.store.core import Store, open_store

START = np.datetime64("2020-01-01T00:00:00")
FREQ = np.timedelta64(6, "h")


def set_time_axis(path: Path, *, start=START, frequency=FREQ, missing: Sequence[int] = ()) -> Store:
    """Give the store at ``path`` a time axis of one date per row (``missing`` rows)."""
    path = Path(path)
    m = Manifest.from_json(
        (path / MANIFEST_NAME).read_bytes(), read=lambda rel: (path / rel).read_bytes()
    )
    axis = TimeAxis(start, frequency, m.length, tuple(missing))
    m = dataclasses.replace(m, time=axis.to_dict())
    for rel, data in m.to_files().items():  # the feature files as they were, the manifest
        (path / rel).write_bytes(data)
    return open_store(path)


def dated_store(
    tmp: Path,
    *,
    n: int = 120,
    grid: tuple[int, int] = (3, 4),
    missing: Sequence[int] = (),
    chunk_rows: int = 5,
    fmt: str = "npy",
    compression: str = "none",
    name: str = "dated",
    **config: object,
) -> Store:
    """A dated store of ``n`` states every 6 h: ``x`` (n, 2 * lat * lon) float32 of two fields
    whose values encode the row (state ``i`` holds ``i + cell / 1000`` and its negative), ``y``
    (n, 1) int64 = 10 * row. Rows ``missing`` are NaN in ``x`` (as a missing date's state)."""
    rng = np.arange(n, dtype="f8")[:, None, None]
    cells = np.arange(grid[0] * grid[1], dtype="f8").reshape(1, *grid) / 1000
    t2m = (rng + cells).astype("f4")
    t2m[list(missing)] = np.nan
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), t2m),
            "z": (("time", "lat", "lon"), -t2m),
            "step": ("time", np.arange(n, dtype="i8") * 10),
        },
        coords={"time": START + np.arange(n) * FREQ},
    )
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / f"{name}.nc"
    ds.to_netcdf(src)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "view": "flat",
            "arrays": {"x": ["t2m", "z"], "y": ["step"]},
            "chunk_rows": chunk_rows,
            "format": fmt,
            "compression": compression,
            "out": str(tmp / name),
            "splits": {"train": 0.8, "val": 0.2},
            "nan": "ignore",
            **config,
        }
    )
    return set_time_axis(tmp / name, missing=missing)


def window_stores(tmp: Path, missing: Sequence[int]) -> dict[str, Any]:
    """The same dated states with dates ``missing`` as npy, zstd Zarr and sharded zstd Zarr
    stores (``npy``, ``zstd``, ``sharded``) and ``full``: every row of ``x`` and ``y``."""
    npy = dated_store(tmp, missing=missing, name="npy")
    zstd = dated_store(tmp, missing=missing, fmt="zarr", compression="zstd", name="zstd")
    sharded = dated_store(
        tmp, missing=missing, fmt="zarr", compression="zstd", name="sharded", shard_chunks=3
    )
    full = {a: npy.read(a, 0, len(npy)) for a in ("x", "y")}
    return {"npy": npy, "zstd": zstd, "sharded": sharded, "full": full}
