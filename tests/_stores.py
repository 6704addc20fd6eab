"""Small synthetic stores for loader tests (imported by the test modules)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import xarray as xr

import shardload
from shardload.store.core import Store


def make_store(
    tmp: Path,
    *,
    fmt: str = "npy",
    compression: str = "none",
    n: int = 203,
    chunk_rows: int = 7,
    splits: dict[str, float] | None = None,
    name: str = "store",
    **config: object,
) -> Store:
    """A prepared store with arrays x (n, 4) float32 and y (n, 1) int64; row i holds values
    derived from i, so a batch can be checked against its "index"."""
    rng = np.random.default_rng(n)
    ds = xr.Dataset(
        {
            "a": ("sample", np.arange(n, dtype="f4")),
            "b": (("sample", "lev"), rng.standard_normal((n, 3)).astype("f4")),
            "c": ("sample", np.arange(n, dtype="i8") * 10),
        }
    )
    tmp.mkdir(parents=True, exist_ok=True)
    src = tmp / f"{name}.nc"
    ds.to_netcdf(src)
    # shardload.prepare is both a submodule and the function the package exports lazily;
    # once the submodule is imported the attribute is the module (fixed on main by a rename).
    prepare = shardload.prepare
    prepare = getattr(prepare, "prepare", prepare)
    return prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a", "b"], "y": ["c"]},
            "chunk_rows": chunk_rows,
            "format": fmt,
            "compression": compression,
            "out": str(tmp / name),
            "splits": splits or {"train": 0.8, "val": 0.1, "test": 0.1},
            **config,
        }
    )


def sharded_store(tmp: Path, values: np.ndarray, *, name: str = "sharded") -> Store:
    """A zstd Zarr store prepared with shards: one array ``x`` of ``values`` (1-D float32, one
    feature), 8-row inner chunks, 2 to a shard."""
    src = tmp / f"{name}.nc"
    xr.Dataset({"a": ("sample", np.asarray(values, dtype="f4"))}).to_netcdf(src)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    return prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a"]},
            "chunk_rows": 8,
            "format": "zarr",
            "compression": "zstd",
            "shard_chunks": 2,
            "out": str(tmp / name),
        }
    )


def split_rows(store, split: str | None) -> np.ndarray:
    m = store.manifest
    ids = m.split_chunks(split) if split else range(m.num_chunks)
    return np.sort(np.concatenate([np.arange(*m.chunk_range(i)) for i in ids]))


def check_values(store, batch) -> None:
    """Every array of ``batch`` equals the store's rows at ``batch["index"]``."""
    idx = np.asarray(batch["index"])
    for a in store.arrays:
        full = store.read(a)
        np.testing.assert_array_equal(np.asarray(batch[a]), full[idx])
