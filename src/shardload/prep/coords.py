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
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.manifest.core import ArraySpec

#: Above this many samples the coordinates are not written (8 bytes a sample and dim, held in
#: memory while published).
MAX_COORD_SAMPLES = 100_000_000


def plan_sample_coords(
    dataset: Any, sample_dims: Sequence[str], length: int
) -> dict[str, np.ndarray]:
    """The coordinate of each sample dim along the stacked samples (``{}`` when the samples are
    not the stacked sample dims, or no sample dim has a 1-D coordinate)."""
    if dataset is None or not sample_dims or length > MAX_COORD_SAMPLES:
        return {}
    try:
        shape = tuple(int(dataset.sizes[d]) for d in sample_dims)
    except KeyError:
        return {}
    if int(np.prod(shape, dtype=np.int64)) != length:
        return {}
    out: dict[str, np.ndarray] = {}
    for k, d in enumerate(sample_dims):
        if d not in dataset.coords or dataset[d].dims != (d,):
            continue
        values = np.asarray(dataset[d].values)
        if values.dtype.kind not in "biufcMmU":  # objects (cftime, mixed) stay out
            continue
        # row i holds values[(i // inner) % size]: one broadcast copy, no index arrays
        outer = int(np.prod(shape[:k], dtype=np.int64))
        inner = int(np.prod(shape[k + 1 :], dtype=np.int64))
        grid = np.broadcast_to(values.reshape(1, shape[k], 1), (outer, shape[k], inner))
        out[str(d)] = grid.reshape(-1)
    return out


def encode_coords(coords: Mapping[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    arrays: dict[str, Any] = {str(k): np.asarray(v) for k, v in coords.items()}
    np.savez(buf, **arrays)
    return buf.getvalue()


def write_zarr_metadata(
    root: Path,
    specs: Mapping[str, ArraySpec],
    coords: Mapping[str, np.ndarray],
    *,
    chunk_rows: int,
) -> None:
    """The sample coordinates and feature names as coordinate arrays of the Zarr group at
    ``root``, then its consolidated metadata (what ``xr.open_zarr`` reads in one request)."""
    import xarray as xr
    import zarr

    variables: dict[str, Any] = {}
    encoding: dict[str, Any] = {}
    for name, values in coords.items():
        if name not in specs:
            variables[name] = xr.Variable(("sample",), values)
            encoding[name] = {"chunks": (max(1, min(chunk_rows, len(values))),)}
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
