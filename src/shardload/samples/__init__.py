"""Sample data generators: synthetic raw files in the schemas of real data sets.

The generators are imported when used: the command line's parser imports this package's
``cli`` module for every command (``shardload prepare`` too), and the radiation generator's
fields and writer would come with it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from shardload.samples.radiation import radiation_file_names, write_radiation_sample

__all__ = ["radiation_file_names", "write_radiation_sample"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from shardload.samples import radiation

        return getattr(radiation, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
