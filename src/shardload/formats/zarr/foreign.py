"""Zarr layouts written by other tools that the native chunk reader (:mod:`.chunks`) also
reads: a Zarr v2 array as the Zarr v3 metadata of the same stored bytes, and chunks that cut
each row along one axis besides axis 0 (an anemoi-datasets store with several ensemble
members is chunked ``(1, variables, 1, cells)``: one chunk per date and member). Pure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class BlockSplit:
    """Chunks that cut a row along one axis besides axis 0: chunk ``(i, j)`` holds rows of
    chunk ``i`` and indices ``[j * block, (j + 1) * block)`` of ``axis`` (the last block padded
    to ``block`` in the stored chunk, as Zarr stores edge chunks)."""

    axis: int  # >= 1, an axis of the array
    block: int  # the chunk's length along ``axis``
    row_shape: tuple[int, ...]  # the array's shape without axis 0

    @property
    def length(self) -> int:
        return self.row_shape[self.axis - 1]

    @property
    def count(self) -> int:
        """Chunks per row along ``axis``."""
        return -(-self.length // self.block)

    @property
    def chunk_row_shape(self) -> tuple[int, ...]:
        """A row of one stored chunk."""
        shape = list(self.row_shape)
        shape[self.axis - 1] = self.block
        return tuple(shape)

    def where(self, j: int) -> tuple[slice, int]:
        """Block ``j``'s indices along ``axis`` in the row, and how many of the chunk's are
        real (the last block's padding is not)."""
        lo = j * self.block
        hi = min(lo + self.block, self.length)
        return slice(lo, hi), hi - lo


def plan_block_split(chunk_shape: tuple[int, ...], shape: tuple[int, ...]) -> BlockSplit | None:
    """The split of chunks that differ from whole rows along exactly one axis (pure).

    >>> plan_block_split((1, 3, 1, 10), (8, 3, 4, 10))
    BlockSplit(axis=2, block=1, row_shape=(3, 4, 10))
    >>> plan_block_split((1, 1, 1, 10), (8, 3, 4, 10)) is None  # two axes cut
    True
    """
    cut = [k for k in range(1, len(shape)) if chunk_shape[k] != shape[k]]
    if len(cut) != 1 or not 0 < chunk_shape[cut[0]] < shape[cut[0]]:
        return None
    return BlockSplit(cut[0], chunk_shape[cut[0]], tuple(shape[1:]))


def v2_as_v3(meta: Any) -> dict[str, Any] | None:
    """A Zarr v2 array's ``.zarray`` as the ``zarr.json`` of the same stored bytes (pure), or
    None unless C order, no filters, no compressor or Blosc, little endian, a fill value.

    >>> v3 = v2_as_v3({"zarr_format": 2, "shape": [4, 3], "chunks": [1, 3], "dtype": "<f4",
    ...                "order": "C", "filters": None, "fill_value": "NaN",
    ...                "compressor": {"id": "blosc", "cname": "lz4", "clevel": 5, "shuffle": 1}})
    >>> [c["name"] for c in v3["codecs"]], v3["chunk_key_encoding"]["configuration"]
    (['bytes', 'blosc'], {'separator': '.'})
    """
    if not isinstance(meta, dict) or meta.get("zarr_format") != 2:
        return None
    if meta.get("order", "C") != "C" or meta.get("filters") or meta.get("fill_value") is None:
        return None
    try:
        dtype = np.dtype(meta["dtype"])
    except (KeyError, TypeError, ValueError):
        return None
    if dtype.byteorder == ">" or dtype.hasobject:
        return None
    codecs: list[dict[str, Any]] = [{"name": "bytes", "configuration": {"endian": "little"}}]
    comp = meta.get("compressor")
    if comp is not None:
        if not isinstance(comp, dict) or comp.get("id") != "blosc":
            return None
        shuffle = {0: "noshuffle", 1: "shuffle", 2: "bitshuffle"}.get(comp.get("shuffle", 1))
        config = {k: comp[k] for k in ("cname", "clevel", "blocksize") if k in comp}
        codecs.append({"name": "blosc", "configuration": {**config, "shuffle": shuffle}})
    return {
        "zarr_format": 3,
        "node_type": "array",
        "shape": meta.get("shape"),
        "data_type": dtype.str,
        "fill_value": meta["fill_value"],
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": meta.get("chunks")}},
        "chunk_key_encoding": {
            "name": "default",
            "configuration": {"separator": meta.get("dimension_separator") or "."},
        },
        "codecs": codecs,
    }
