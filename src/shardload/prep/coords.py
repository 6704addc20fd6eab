"""The sample coordinates of a store, and the xarray metadata of a Zarr store.

A flat view stacks its ``sample_dims`` into one sample axis in C order (the first dim
slowest). Each sample dim with a 1-D coordinate in the source (``number``, ``time``) becomes a
coordinate along the samples: row ``i`` holds the values of the sample dims it came from, so
``Store.to_xarray()`` and ``xr.open_zarr`` give them back, and
``ds.set_index(sample=["number", "time"]).unstack("sample")`` restores the source's grid.

They are published with the manifest as ``_coords.npz`` (every format; read by
``Store.to_xarray``). A Zarr store also gets them as Zarr arrays along ``sample``, one
coordinate array of feature names per array that has them (``NAME_feature``), and
consolidated metadata, so that ``xr.open_zarr`` of the store, local or served, opens it with
named dims and no warnings (without consolidated metadata zarr lists the store's folder and
warns about each file that is not Zarr: the manifest, ``metadata.json``, ...).
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from shardload.manifest.core import ArraySpec
from shardload.plan.grids import expand_axis

#: Above this many samples the coordinates are not written (8 bytes a sample and dim, held in
#: memory while published).
MAX_COORD_SAMPLES = 100_000_000


@dataclass(frozen=True)
class SampleCoords:
    """The sample coordinates to publish: each dim's 1-D axis over the grid ``shape`` (what
    :func:`plan_sample_axes` gives; ``axes`` names each one's dim), or, with ``shape`` None,
    one value per sample (a copied store's)."""

    values: Mapping[str, np.ndarray]
    shape: tuple[int, ...] | None = None
    axes: Mapping[str, int] = field(default_factory=dict)

    def full(self, name: str) -> np.ndarray:
        """Coordinate ``name`` with one value per sample."""
        if self.shape is None:
            return np.asarray(self.values[name])
        return expand_axis(self.values[name], self.shape, self.axes[name])

    def without(self, names: Collection[str]) -> SampleCoords:
        keep = {k: v for k, v in self.values.items() if k not in names}
        return replace(self, values=keep, axes={k: a for k, a in self.axes.items() if k in keep})

    def options(self) -> dict[str, Any]:
        """The manifest options naming them (and, for axes, the grid they expand over)."""
        if not self.values:
            return {}
        out: dict[str, Any] = {"sample_coords": list(self.values)}
        if self.shape is not None:
            out["sample_coords_grid"] = {"shape": list(self.shape), "axes": dict(self.axes)}
        return out

    def encode(self) -> bytes:
        """``_coords.npz``: the axes (or per-sample values) by name."""
        return encode_coords(self.values)


def plan_sample_axes(dataset: Any, sample_dims: Sequence[str], length: int) -> SampleCoords:
    """The 1-D coordinate of each sample dim that has one, over the grid of the sample dims
    (no values when the samples are not the stacked sample dims, or no sample dim has a 1-D
    coordinate)."""
    none = SampleCoords({})
    if dataset is None or not sample_dims or length > MAX_COORD_SAMPLES:
        return none
    try:
        shape = tuple(int(dataset.sizes[d]) for d in sample_dims)
    except KeyError:
        return none
    if int(np.prod(shape, dtype=np.int64)) != length:
        return none
    values: dict[str, np.ndarray] = {}
    axes: dict[str, int] = {}
    for k, d in enumerate(sample_dims):
        if d not in dataset.coords or dataset[d].dims != (d,):
            continue
        axis = np.asarray(dataset[d].values)
        if axis.dtype.kind not in "biufcMmU":  # objects (cftime, mixed) stay out
            continue
        values[str(d)], axes[str(d)] = axis, k
    return SampleCoords(values, shape, axes)


def plan_sample_coords(
    dataset: Any, sample_dims: Sequence[str], length: int
) -> dict[str, np.ndarray]:
    """The coordinate of each sample dim along the stacked samples, one value per sample
    (``{}`` when the samples are not the stacked sample dims, or no sample dim has a 1-D
    coordinate)."""
    coords = plan_sample_axes(dataset, sample_dims, length)
    return {n: coords.full(n) for n in coords.values}


def encode_coords(coords: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    arrays: dict[str, Any] = {str(k): np.asarray(v) for k, v in coords.items()}
    np.savez(buf, **arrays)
    return buf.getvalue()


#: The size of a chunk of a sample coordinate in a Zarr store (a whole number of the arrays'
#: chunks, so that xr.open_zarr's dask chunks line up).
COORD_CHUNK_BYTES = 8 << 20


def coord_chunk_rows(length: int, itemsize: int, chunk_rows: int) -> int:
    """Rows per chunk of a sample coordinate of ``length`` values.

    >>> coord_chunk_rows(9_331_200, 8, 1139)
    1047880
    >>> coord_chunk_rows(50, 8, 8)
    50
    """
    chunk_rows = max(1, chunk_rows)
    per = max(1, COORD_CHUNK_BYTES // max(1, itemsize) // chunk_rows) * chunk_rows
    return max(1, min(per, length))


def write_zarr_metadata(
    root: Path,
    specs: Mapping[str, ArraySpec],
    coords: SampleCoords,
    *,
    chunk_rows: int,
) -> None:
    """The sample coordinates and feature names as coordinate arrays of the Zarr group at
    ``root``, then its consolidated metadata (what ``xr.open_zarr`` reads in one request).

    Each sample coordinate is written in chunks of a whole number of the arrays' chunks, about
    :data:`COORD_CHUNK_BYTES` each: one file per array chunk would be thousands of files to
    write, sync and later delete, and zarr's shards cost as much again in per-chunk calls."""
    import xarray as xr
    import zarr
    from zarr.codecs import BloscCodec

    variables: dict[str, Any] = {}
    encoding: dict[str, Any] = {}
    for name in coords.values:
        if name not in specs:
            values = coords.full(name)
            variables[name] = xr.Variable(("sample",), values)
            encoding[name] = {
                "chunks": (coord_chunk_rows(len(values), values.dtype.itemsize, chunk_rows),),
                # lz4: a repeated axis packs to a few percent at memory speed
                "compressors": (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),),
            }
    for name, spec in specs.items():
        dim = f"{name}_feature"
        if spec.features and not spec.ragged and len(spec.shape) > 1 and dim not in specs:
            names = np.asarray(list(spec.features), dtype=str)
            if len(names) == spec.shape[-1]:
                variables[dim] = xr.Variable((dim,), names)
    with warnings.catch_warnings():
        # zarr's notes that consolidated metadata and fixed-length strings are not yet in the
        # Zarr v3 specification, and that the manifest and other files are not Zarr nodes
        warnings.simplefilter("ignore")
        if variables:
            group = zarr.open_group(str(root), mode="a", zarr_format=3)
            for name in variables:  # a resumed publish writes them again
                if name in group:
                    del group[name]
            xr.Dataset(coords=variables).to_zarr(
                str(root), mode="a", consolidated=False, zarr_format=3, encoding=encoding
            )
        zarr.consolidate_metadata(str(root), zarr_format=3)
