"""``open_store``: a handle on a prepared store (or plain Zarr data), local or by URL."""

from shardload.store.core import Store, open_store

__all__ = ["Store", "open_store"]
