"""shardload: from raw scientific files to a fast, correct training loop.

Public API::

    shardload.prepare(config)            # raw files -> sharded store (see docs/config.md)
    shardload.prepare(config, dataset=ds)  # ... or a lazy xarray.Dataset you already hold
    shardload.compute(config)            # attributes block by block (see docs/compute.md)
    shardload.copy(src, dst)             # any store -> prepare's layout, values equal
    shardload.open_store(path_or_url)    # a store handle: len(store), store.read(name, a, b)
    store.to_xarray()                    # the store as a lazy xarray.Dataset
    shardload.iter_batches(store, ...)   # numpy batches for any framework
    shardload.torch.StreamingDataset     # PyTorch (imports torch; not imported here)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from shardload.version import __version__

__all__ = [
    "__version__",
    "compute",
    "concat",
    "copy",
    "iter_batches",
    "join",
    "open_store",
    "prepare",
    "select",
]

if TYPE_CHECKING:  # pragma: no cover
    from shardload.blockwise import compute
    from shardload.load.batches import iter_batches
    from shardload.prep.copy import copy_store as copy
    from shardload.prep.driver import prepare
    from shardload.store.combine import concat, join, select
    from shardload.store.core import open_store


def __getattr__(name: str) -> Any:
    # PEP 562: lazy imports keep `import shardload` fast, and the read side (open_store,
    # iter_batches) free of xarray, dask and pandas, which only prepare needs.
    if name == "open_store":
        from shardload.store.core import open_store

        return open_store
    if name in ("select", "join", "concat"):  # open-time selection and combination
        from shardload.store import combine

        return getattr(combine, name)
    if name == "prepare":
        from shardload.prep.driver import prepare

        return prepare
    if name == "copy":
        from shardload.prep.copy import copy_store

        return copy_store
    if name == "compute":
        from shardload.blockwise import compute

        return compute
    if name == "iter_batches":
        from shardload.load.batches import iter_batches

        return iter_batches
    raise AttributeError(f"module 'shardload' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
