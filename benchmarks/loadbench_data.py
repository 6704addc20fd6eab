"""Synthetic stores for ``bench_load.py``: one dataset written by ``shardload.prepare`` four ways.

The data come from a shardload *function view* (``loadbench_data:make``): a float32 array
``x`` of shape ``(rows, features)`` generated block by block from a seed, so that every store
holds the same values and nothing but a tiny placeholder source file is written. Values are
rounded to 2 decimals with per-feature offsets and scales, so zstd with byte shuffle has
something to compress (random mantissas only would make zstd a pure copy).

Stores (under the work folder): ``zarr-none``, ``zarr-zstd`` (Zarr v3, Blosc zstd level 3 with
byte shuffle), ``npy`` (one .npy per chunk) and ``hdf5`` (``data.h5``, chunked by
``chunk_rows``, no filter). A ``bench-spec.json`` next to them lets a later run reuse them.
Compressed stores of other chunkings, same values (issue 14: a compressed chunk is decoded
whole, so smaller chunks are the lever for shuffle quality): ``zarr-zstd-cN`` (zstd chunks of
``N`` rows) and ``zarr-zstd-sN`` (zstd chunks of ``N`` rows inside shards of ``chunk_rows``
rows, Zarr's sharding codec).
"""

from __future__ import annotations

import functools
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

STORE_KINDS = ("zarr-none", "zarr-zstd", "npy", "hdf5")
SPEC_FILE = "bench-spec.json"


def _block(block_id: tuple[int, ...], *, chunk_rows: int, rows: int, features: int, seed: int):
    # a store of smaller chunks slices each block many times: generate it once (a copy each
    # time, so no caller can change the cached values)
    return _cached_block(block_id[0], chunk_rows, rows, features, seed).copy()


@functools.lru_cache(maxsize=4)
def _cached_block(i: int, chunk_rows: int, rows: int, features: int, seed: int) -> np.ndarray:
    n = min(chunk_rows, rows - i * chunk_rows)
    rng = np.random.default_rng([seed, i])
    feat = np.random.default_rng([seed, 1 << 30])
    scale = feat.uniform(0.1, 100.0, features).astype(np.float32)
    offset = feat.uniform(-50.0, 50.0, features).astype(np.float32)
    x = rng.standard_normal((n, features), dtype=np.float32)
    x *= scale
    x += offset
    return np.round(x, 2)


def make(ds: Any, *, rows: int, features: int, chunk_rows: int, seed: int = 0) -> dict[str, Any]:
    """The shardload view function: ``{"x": dask array (rows, features) float32}``."""
    import dask.array as da

    chunks = (
        (chunk_rows,) * (rows // chunk_rows) + ((rows % chunk_rows,) if rows % chunk_rows else ()),
        (features,),
    )
    x = da.map_blocks(
        _block,
        chunks=chunks,
        dtype=np.float32,
        meta=np.empty((0, 0), np.float32),
        chunk_rows=chunk_rows,
        rows=rows,
        features=features,
        seed=seed,
    )
    return {"x": x}


def _placeholder_source(work: Path) -> Path:
    """A tiny netCDF file: prepare needs a source; the function view ignores its contents."""
    import xarray as xr

    path = work / "placeholder.nc"
    if not path.exists():
        xr.Dataset({"unused": ("i", np.zeros(1, np.float32))}).to_netcdf(path, engine="h5netcdf")
    return path


def store_path(work: Path, kind: str) -> Path:
    return work / kind


def small_chunk_kind(kind: str) -> tuple[int, bool] | None:
    """``zarr-zstd-c256`` -> ``(256, False)``, ``zarr-zstd-s256`` -> ``(256, True)`` (sharded);
    None for the base kinds."""
    head, _, tail = kind.rpartition("-")
    if head != "zarr-zstd" or tail[:1] not in ("c", "s") or not tail[1:].isdigit():
        return None
    return int(tail[1:]), tail[0] == "s"


def store_kind_options(kind: str, chunk_rows: int) -> dict[str, Any]:
    """prepare options of a store kind: format, compression, chunk_rows, shard_chunks."""
    small = small_chunk_kind(kind)
    if small is None:
        fmt, _, codec = kind.partition("-")
        if kind not in STORE_KINDS:
            raise ValueError(f"unknown store kind {kind!r}")
        return {"format": fmt, "compression": codec or "none", "chunk_rows": chunk_rows}
    rows, sharded = small
    if rows < 1 or chunk_rows % rows:
        raise ValueError(f"{kind}: {rows} rows must divide the base chunk of {chunk_rows} rows")
    opts: dict[str, Any] = {"format": "zarr", "compression": "zstd", "chunk_rows": rows}
    if sharded:
        opts["shard_chunks"] = chunk_rows // rows
    return opts


def build_stores(
    work: Path,
    *,
    rows: int,
    features: int,
    chunk_rows: int,
    kinds=STORE_KINDS,
    seed: int = 0,
    log=print,
) -> dict[str, Any]:
    """Prepare the stores (reused when ``bench-spec.json`` matches); return their sizes."""
    import time

    import shardload

    work.mkdir(parents=True, exist_ok=True)
    spec = {"rows": rows, "features": features, "chunk_rows": chunk_rows, "seed": seed}
    spec_path = work / SPEC_FILE
    old = json.loads(spec_path.read_text()) if spec_path.exists() else None
    if old != spec:
        for kind in (*STORE_KINDS, *(p.name for p in work.glob("zarr-zstd-*"))):
            shutil.rmtree(store_path(work, kind), ignore_errors=True)
        spec_path.unlink(missing_ok=True)
    src = _placeholder_source(work)
    info: dict[str, Any] = {}
    for kind in kinds:
        out = store_path(work, kind)
        if not (out / "shardload.json").exists():
            conf = {
                "source": {"paths": [str(src)], "engine": "h5netcdf"},
                "view": {
                    "function": "loadbench_data:make",
                    "kwargs": {
                        "rows": rows,
                        "features": features,
                        "chunk_rows": chunk_rows,
                        "seed": seed,
                    },
                },
                **store_kind_options(kind, chunk_rows),
                "splits": {},
                "nan": "ignore",
                "out": str(out),
                "overwrite": True,
            }
            t = time.perf_counter()
            shardload.prepare(conf, progress=False)
            log(f"  prepared {kind}: {time.perf_counter() - t:.1f} s")
        info[kind] = {
            "path": str(out),
            "disk_bytes": sum(os.path.getsize(p) for p in data_files(out)),
        }
    spec_path.write_text(json.dumps(spec))
    return info


def data_files(store: Path) -> list[Path]:
    """The files holding array data (chunk files, npy files or the HDF5 file), sorted."""
    out = []
    for root, _dirs, files in os.walk(store):
        for name in files:
            if name.endswith(".json") or name.startswith("."):
                continue
            out.append(Path(root) / name)
    return sorted(out)


def zarr_chunk_files(store: Path, array: str = "x") -> list[Path]:
    """Zarr v3 chunk files of one array, in chunk order (default key encoding ``c/i/0``)."""
    files = [p for p in data_files(store / array) if p.parent.parent.name == "c"]
    return sorted(files, key=lambda p: int(p.parent.name))


def npy_chunk_files(store: Path, array: str = "x") -> list[Path]:
    """The npy store's chunk files of one array, in chunk order (names sort by chunk id).

    Found by listing, without importing shardload, so the naive npy loader stays lean.
    """
    m = json.loads((store / "shardload.json").read_text())
    files = sorted((store / array).glob("*.npy"))
    if len(files) != len(m["chunk_bounds"]) - 1:
        raise RuntimeError(
            f"{store / array}: {len(files)} .npy files for {len(m['chunk_bounds']) - 1} chunks"
        )
    return files


def warm_page_cache(paths: list[Path]) -> int:
    """Read every file once (so the runs that follow read from the page cache); bytes read."""
    total = 0
    for p in paths:
        with open(p, "rb") as f:
            while chunk := f.read(1 << 24):
                total += len(chunk)
    return total


def iter_store_files(work: Path, kinds) -> Iterator[Path]:
    for kind in kinds:
        yield from data_files(store_path(work, kind))
