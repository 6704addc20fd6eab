"""The formats a store can be written in, by name: the one place a format is named.

Each entry says where the format's package lives (``read.py`` holds ``open_reader`` and, if it
stores variable-length arrays, ``open_ragged``; ``write.py`` holds ``WRITER``; ``url.py``, if
the entry says so, ``open_reader`` for a store read by URL) and what a config
may ask of it, so that validating a config imports no format. The modules are imported on first
use, as fsspec imports a filesystem: a missing optional dependency raises
:class:`~shardload.errors.MissingDependencyError` naming the extra to install.

Adding a format is one folder (``formats/NAME/read.py``, ``write.py``), one line in
:data:`REGISTRY` and one test subclass of :class:`shardload.testing.formats.FormatTests`
(docs/design.md, "Formats as plug-ins").
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shardload.errors import ConfigError, MissingDependencyError

COMPRESSIONS = ("auto", "none", "zstd", "lz4")


@dataclass(frozen=True)
class FormatEntry:
    """One format: where it lives and what it supports (nothing here imports it).

    ``requires``: the third-party modules its reader and writer import, and ``extra`` the
    ``shardload[extra]`` that installs them (None: base dependencies)."""

    name: str
    package: str
    compressions: tuple[str, ...] = COMPRESSIONS
    shards: bool = False
    ragged: bool = False
    requires: tuple[str, ...] = ()
    extra: str | None = None
    #: its reader by URL is ``url.py``'s ``open_reader`` (else ``read.py``'s, as locally)
    url: bool = False

    @property
    def default_compression(self) -> str:
        """``auto`` (lz4 where it shrinks an array, else none) where the format compresses."""
        return "auto" if "auto" in self.compressions else self.compressions[0]

    def module(self, side: str) -> Any:
        """``read`` or ``write``, imported on first use."""
        for dep in self.requires:
            try:
                importlib.import_module(dep)
            except ImportError as exc:
                raise MissingDependencyError(
                    f"format {self.name!r} needs {dep!r}: pip install 'shardload[{self.extra}]'"
                ) from exc
        return importlib.import_module(f"{self.package}.{side}")


REGISTRY: Mapping[str, FormatEntry] = {
    e.name: e
    for e in (
        FormatEntry("zarr", "shardload.formats.zarr", shards=True, ragged=True),
        FormatEntry("npy", "shardload.formats.npy", compressions=("none",), ragged=True, url=True),
        FormatEntry("hdf5", "shardload.formats.hdf5", ragged=True),
        FormatEntry("parquet", "shardload.formats.parquet", requires=("pyarrow",), extra="parquet"),
    )
}
#: every format's name, in the registry's order (the config's ``format`` values)
FORMAT_NAMES: tuple[str, ...] = tuple(REGISTRY)


def format_entry(name: str) -> FormatEntry:
    if name not in REGISTRY:
        raise ConfigError(f"format: unknown format {name!r}; choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]


def get_writer(name: str) -> Any:
    """The writer of format ``name`` (:class:`shardload.formats.base.FormatWriter`)."""
    return format_entry(name).module("write").WRITER


def open_reader(name: str, fs: Any, root: str, manifest: Any, *, verify: str) -> Any:
    """A reader (:class:`shardload.formats.base.ArrayReader`) of the fixed-shape arrays of a
    store in format ``name`` (by URL its ``url.py``'s where it has one)."""
    from shardload.formats.base import is_local

    entry = format_entry(name)
    side = "url" if entry.url and not is_local(fs) else "read"
    return entry.module(side).open_reader(fs, root, manifest, verify=verify)


def open_ragged(name: str, fs: Any, root: str, manifest: Any) -> Any:
    """Where format ``name`` keeps its variable-length arrays' offsets and values
    (:class:`shardload.formats.ragged.read.RaggedSource`)."""
    entry = format_entry(name)
    if not entry.ragged:
        raise ConfigError(f"format {name!r} cannot store variable-length arrays")
    return entry.module("read").open_ragged(fs, root, manifest)
