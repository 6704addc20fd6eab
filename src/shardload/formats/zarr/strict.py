"""zarr-python's fsspec store for a shardload store read by URL: a missing chunk is an error.

zarr-python serves a chunk (or shard) it cannot find as the array's fill value: an HTTP 404
becomes rows of zeros. In a shardload store every chunk was written (``write_empty_chunks``)
and the manifest lists them, so a missing one is damage, and reading it raises
:class:`~shardload.errors.ChunkReadError` naming the file, as a local read does. Metadata keys
keep zarr's semantics (opening a group probes keys that may be absent).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zarr.storage import FsspecStore

from shardload.errors import ChunkReadError

#: Keys of Zarr metadata (v3 and v2), which may legitimately be absent; every other key is a
#: chunk or a shard.
_METADATA = ("zarr.json", ".zarray", ".zgroup", ".zattrs", ".zmetadata")


class StrictFsspecStore(FsspecStore):
    """An :class:`~zarr.storage.FsspecStore` whose missing chunk keys raise instead of
    reading as the fill value."""

    def _missing(self, key: str) -> ChunkReadError:
        array, _, coords = key.rpartition("/c/")
        where = f"{self.path.rstrip('/')}/{key}"
        if array and coords:
            what = f"chunk file c/{coords} of array {array.rsplit('/', 1)[-1]!r}"
        else:
            what = f"Zarr key {key!r}"
        return ChunkReadError(
            f"{what} is missing: {where} (the store's manifest lists it; it is not read as "
            "the fill value)"
        )

    async def get(self, key: str, prototype: Any, byte_range: Any = None) -> Any:
        value = await super().get(key, prototype, byte_range)
        if value is None and not key.endswith(_METADATA):
            raise self._missing(key)
        return value

    async def get_partial_values(
        self, prototype: Any, key_ranges: Iterable[tuple[str, Any]]
    ) -> list[Any]:
        key_ranges = list(key_ranges)
        values = await super().get_partial_values(prototype, key_ranges)
        for (key, _), value in zip(key_ranges, values, strict=True):
            if value is None and not key.endswith(_METADATA):
                raise self._missing(key)
        return values


def widen_zarr_threads() -> None:
    """zarr-python runs a sync filesystem's calls (ours) in its thread pool, by default of
    ``min(32, CPUs + 4)`` threads: 6 requests in flight on 2 CPUs, whatever the loader asks.
    Before that pool exists, ask for ``URL_IN_FLIGHT`` threads (they wait on the network)."""
    import zarr
    import zarr.core.sync as zsync

    from shardload.move.remote import URL_IN_FLIGHT

    if (
        getattr(zsync, "_executor", None) is None
        and zarr.config.get("threading.max_workers") is None
    ):
        zarr.config.set({"threading.max_workers": URL_IN_FLIGHT})
