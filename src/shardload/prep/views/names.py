"""Lazy feature names of wide variables: see :mod:`shardload.manifest.names` (they live outside
``views`` so that the read side, which decodes them from feature files, imports no xarray)."""

from shardload.manifest.names import ChainedNames, GridNames

__all__ = ["ChainedNames", "GridNames"]
