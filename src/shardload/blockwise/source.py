"""Windowed reads of one source variable, without a dask graph.

A local Zarr source is read by slicing the zarr array (one windowed read per block); a SEG-Y
file by ranges of traces (:class:`shardload.prep.sources.segy.SegyVolume`, no dask); any other
source (netCDF, HDF5, GRIB, several files) is opened lazily like ``prepare``'s source and the
window of the variable is computed on its own (synchronously, inside the worker).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from shardload.errors import SourceError
from shardload.prep.config import SourceConfig


@dataclass(frozen=True)
class SourceInfo:
    shape: tuple[int, ...]
    dtype: str
    chunks: tuple[tuple[int, ...], ...]  # the source's own blocks per axis
    dims: tuple[str, ...]
    #: a read decodes whole source chunks (Zarr, netCDF/HDF5 through dask); SEG-Y reads traces
    decodes_chunks: bool = True


class SourceArray:
    """``read(slices)`` -> numpy; built once per process from the (picklable) config."""

    def __init__(self, cfg: SourceConfig, variable: str) -> None:
        self.cfg, self.variable = cfg, variable
        self._zarr: Any = None
        self._dask: Any = None
        self._segy: Any = None
        paths = list(cfg.paths)
        from shardload.prep.sources.paths import expand_paths, guess_engine, is_url

        engine = cfg.engine or (guess_engine(paths[0]) if paths else None)
        if engine == "segy":
            from shardload.prep.sources.segy import DIMS, VARIABLE, open_segy_volume

            if variable != VARIABLE:
                raise SourceError(
                    f"source.variable: {variable!r}; the volume of a SEG-Y source "
                    f"({paths[0]}) is variable {VARIABLE!r}"
                )
            vol = self._segy = open_segy_volume(expand_paths(paths), dict(cfg.open_kwargs))
            ci = vol.block_inlines()
            n = vol.shape[0]
            self.info = SourceInfo(
                vol.shape,
                vol.dtype.name,
                (tuple(min(ci, n - s) for s in range(0, n, ci)), (vol.shape[1],), (vol.shape[2],)),
                DIMS,
                decodes_chunks=False,
            )
        elif len(paths) == 1 and not is_url(paths[0]) and engine == "zarr":
            import zarr

            try:
                node: Any = zarr.open_group(store=expand_paths(paths)[0], mode="r")
                if cfg.group:
                    node = node[cfg.group]
                if variable not in node:
                    raise SourceError(
                        f"variable {variable!r} not found in {paths[0]}; it has "
                        f"{sorted(k for k, _ in node.arrays())}"
                    )
                self._zarr = node[variable]
            except SourceError:
                raise
            except Exception as exc:
                raise SourceError(f"cannot open Zarr source {paths[0]}: {exc}") from exc
            arr = self._zarr
            dims = (
                tuple(arr.metadata.dimension_names or ())
                if hasattr(arr.metadata, "dimension_names")
                else ()
            )
            if not dims:
                dims = tuple(arr.attrs.get("_ARRAY_DIMENSIONS", ())) or tuple(
                    f"dim_{i}" for i in range(arr.ndim)
                )
            shape = tuple(int(s) for s in arr.shape)
            chunks = tuple(
                tuple(min(c, n - s) for s in range(0, n, c)) if n else (0,)
                for n, c in zip(shape, arr.chunks, strict=True)
            )
            self.info = SourceInfo(shape, np.dtype(arr.dtype).name, chunks, tuple(map(str, dims)))
        else:
            from shardload.prep.sources.open import open_source

            ds = open_source(cfg)
            if variable not in ds.variables:
                raise SourceError(f"variable {variable!r} not found in {paths[0]}")
            var = ds[variable]
            self._dask = var.data
            chunks = getattr(var.data, "chunks", None) or tuple((n,) for n in var.shape)
            self.info = SourceInfo(
                tuple(int(s) for s in var.shape),
                np.dtype(var.dtype).name,
                tuple(tuple(int(c) for c in ax) for ax in chunks),
                tuple(map(str, var.dims)),
            )

    @property
    def decodes_chunks(self) -> bool:
        return self.info.decodes_chunks

    def read(self, box: Sequence[tuple[int, int]]) -> np.ndarray:
        if self._segy is not None:
            return self._segy.read(box)  # type: ignore[no-any-return]
        sl = tuple(slice(a, b) for a, b in box)
        if self._zarr is not None:
            return np.asarray(self._zarr[sl])
        part = self._dask[sl]
        if hasattr(part, "compute"):
            part = part.compute(scheduler="sync")  # this worker reads its own window
        return np.asarray(part)
