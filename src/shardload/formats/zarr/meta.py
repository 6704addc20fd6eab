"""A shardload Zarr array's ``zarr.json`` against the manifest (pure).

The manifest says what an array holds; zarr-python believes ``zarr.json``. A ``data_type``
edited to another of the same item size (float32 -> int32) would reinterpret every value, a
``shape`` or chunk grid edited would serve other rows: each is refused when the store is
opened, naming both files.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from shardload.errors import StoreError
from shardload.manifest.core import ArrayInfo


def check_zarr_meta(
    meta: Any, info: ArrayInfo, *, path: str, where: str, shard_chunks: int | None = None
) -> None:
    """Raise :class:`StoreError` unless ``meta`` (the parsed ``zarr.json`` at ``path``) has
    the data type and shape the manifest ``where`` gives array ``info``, and chunks of
    ``info.chunk_rows`` whole rows (with ``shard_chunks``, the manifest's option: inner chunks
    of those, in shards of ``shard_chunks`` chunks).

    >>> info = ArrayInfo(name="x", shape=(10, 4), dtype="float32", chunk_rows=5, path="x")
    >>> grid = {"name": "regular", "configuration": {"chunk_shape": [5, 4]}}
    >>> meta = {"zarr_format": 3, "shape": [10, 4], "data_type": "float32", "chunk_grid": grid}
    >>> check_zarr_meta(meta, info, path="x/zarr.json", where="shardload.json")
    >>> check_zarr_meta({**meta, "data_type": "int32"}, info, path="x/zarr.json", where="m")
    Traceback (most recent call last):
    ...
    shardload.errors.StoreError: array 'x': x/zarr.json says data_type int32, shape [10, 4], \
chunks of [5, 4] rows; m says float32, [10, 4], chunks of 5 rows
    """
    try:
        dtype: Any = np.dtype(meta["data_type"])
        shape = [int(s) for s in meta["shape"]]
        chunks = [int(c) for c in meta["chunk_grid"]["configuration"]["chunk_shape"]]
        outer = None
        for codec in meta.get("codecs") or []:
            if isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
                outer, chunks = chunks, [int(c) for c in codec["configuration"]["chunk_shape"]]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StoreError(
            f"array {info.name!r}: {path} is not the Zarr v3 array metadata of a shardload "
            f"store ({type(exc).__name__}: {exc}); {where} describes it as {info.dtype} "
            f"{list(info.shape)}"
        ) from None
    want_chunks = [info.chunk_rows, *info.shape[1:]]
    if (
        dtype != np.dtype(info.dtype)
        or shape != list(info.shape)
        or chunks[1:] != want_chunks[1:]
        or (chunks[:1] != want_chunks[:1] and info.shape[0] > 0)
        or (outer is None) != (not shard_chunks)
        or (outer is not None and outer != [want_chunks[0] * int(shard_chunks or 0), *shape[1:]])
    ):
        raise StoreError(
            f"array {info.name!r}: {path} says data_type {meta['data_type']}, shape {shape}, "
            f"chunks of {chunks} rows{_shards(outer)}; {where} says {info.dtype}, "
            f"{list(info.shape)}, chunks of {info.chunk_rows} rows{_shards(shard_chunks)}"
        )


def _shards(shards: Any) -> str:
    if isinstance(shards, list):
        return f" in shards of {shards}"
    return f" in shards of {shards} chunks" if shards else ""
