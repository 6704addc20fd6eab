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

import base64
import io
import itertools
import json
import warnings
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from shardload.manifest.core import ArraySpec
from shardload.manifest.names import GridNames
from shardload.plan.grids import expand_axis, expand_axis_rows

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

    def rows(self, name: str, start: int, stop: int) -> np.ndarray:
        """Samples ``[start, stop)`` of :meth:`full`, without the rest."""
        if self.shape is None:
            return np.asarray(self.values[name])[start:stop]
        return expand_axis_rows(self.values[name], self.shape, self.axes[name], start, stop)

    def dtype(self, name: str) -> np.dtype:
        return np.asarray(self.values[name]).dtype

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
    write, sync and later delete, and zarr's shards cost as much again in per-chunk calls.

    Numbers, booleans, strings, dates and feature names get the metadata xarray's ``to_zarr``
    gives them (:func:`_create_like_xarray`; dates CF-encoded by xarray's own
    ``encode_cf_datetime``, :func:`_as_stored`; tests compare every file's bytes) and their
    chunks written here: no ``xarray.Variable``, which imports ``dask.array`` (0.25-0.4 s in a
    fresh process) to check for dask arrays. Others (durations) are CF-encoded and written
    whole by xarray."""
    variables: dict[str, Any] = {}  # through xarray: encoded and written whole
    encoding: dict[str, Any] = {}
    native: dict[str, int] = {}  # written here: their chunks by prepare's own writer
    length = _coord_length(coords)
    stored: dict[str, dict[str, str]] = {}  # dates: their CF attributes
    for name in coords.values:
        if name not in specs:
            dtype = coords.dtype(name)
            rows = coord_chunk_rows(length, dtype.itemsize, chunk_rows)
            as_stored = _as_stored(coords, name) if dtype.kind in _OWN_KINDS else None
            if as_stored is not None:
                coords, stored[name] = as_stored
                native[name] = rows
                continue
            variables[name] = coords.full(name)
            encoding[name] = {"chunks": (rows,), "compressors": (_coord_codec(),)}
    named: dict[str, tuple[Sequence[str], int]] = {}  # feature names: written here in slabs
    for name, spec in specs.items():
        dim = f"{name}_feature"
        names = spec.features
        wide = names and not spec.ragged and len(spec.shape) > 1 and dim not in specs
        if wide and names is not None and len(names) == spec.shape[-1]:
            dtype = np.dtype(f"<U{max(1, _longest_name(names))}")
            named[dim] = (names, coord_chunk_rows(len(names), dtype.itemsize, 1))
    written = [*variables, *native, *named]
    with warnings.catch_warnings():
        # zarr's notes that consolidated metadata and fixed-length strings are not yet in the
        # Zarr v3 specification, and that the manifest and other files are not Zarr nodes
        warnings.simplefilter("ignore")
        import zarr

        group = _group_without(root, written)
        arrays: dict[str, Any] = {}  # the feature names' arrays, as created
        if variables:
            import xarray as xr

            plain = {k: xr.Variable(("sample",), v) for k, v in variables.items()}
            xr.Dataset(coords=xr.Coordinates(plain, indexes={})).to_zarr(
                str(root), mode="a", consolidated=False, zarr_format=3, encoding=encoding
            )
        if native or named:
            group = group or zarr.open_group(str(root), mode="a", zarr_format=3)
            for name, rows in native.items():
                dtype = coords.dtype(name)
                codec, cf = _coord_codec(), stored[name]
                _create_like_xarray(group, name, "sample", dtype, length, rows, codec, cf)
            for dim, (names, rows) in named.items():
                dtype = np.dtype(f"<U{max(1, _longest_name(names))}")
                arrays[dim] = _create_like_xarray(group, dim, dim, dtype, len(names), rows)
            # xarray's global attribute naming the coordinates that are not dimensions
            others = sorted(n for n in [*variables, *native] if n != "sample")
            attrs: dict[str, Any] = {"coordinates": " ".join(others)} if others else {}
            if group.attrs.asdict() != attrs:
                group.attrs.put(attrs)
        for name, rows in native.items():
            _write_coord_chunks(Path(root) / name, coords, name, length, rows)
        for dim, (names, rows) in named.items():
            _write_names(arrays[dim], names, rows)
        zarr.consolidate_metadata(str(root), zarr_format=3)


#: The kinds of sample coordinates written here: numbers, booleans, strings and dates.
_OWN_KINDS = "biufcUM"


def _as_stored(coords: SampleCoords, name: str) -> tuple[SampleCoords, dict[str, str]] | None:
    """``coords`` with coordinate ``name`` as xarray's ``to_zarr`` stores it, and the
    attributes it gives it: dates as the integers of xarray's CF encoding
    (``encode_cf_datetime``: the units and calendar it infers, after pandas' conversion of
    their resolution as ``xarray.Variable`` does), others as they are. None where xarray would
    store dates as floats (then xarray writes them).

    A grid's axis is encoded rather than its expansion: xarray infers the units from the
    first date that is not NaT and the unit that divides every step between consecutive
    values, the same in both (a step of the expansion is 0 or a sum of the axis' steps, of
    either sign), and the encoding is elementwise."""
    values = np.asarray(coords.values[name])
    if values.dtype.kind != "M":
        return coords, {}
    import pandas as pd
    from xarray.coding.times import encode_cf_datetime

    values = np.asarray(pd.Series(values.ravel(), copy=False)).reshape(values.shape)
    num, units, calendar = encode_cf_datetime(values)
    num = np.asarray(num)
    if num.dtype != np.dtype("int64"):
        return None
    coded = replace(coords, values={**coords.values, name: num})
    return coded, {"units": units, "calendar": calendar}


def _coord_codec() -> Any:
    """A sample coordinate's compressor. lz4: a repeated axis packs to a few percent at
    memory speed."""
    from zarr.codecs import BloscCodec

    return BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")


def _group_without(root: Path, names: Sequence[str]) -> Any:
    """The Zarr group at ``root`` without arrays ``names``, where a resumed publish wrote them
    before; None where none exists (a first publish opens no group to look: each zarr-python
    call is a round trip to its event loop's thread, 0.05 s of wall time at a load average of
    5 on 2 cores)."""
    import zarr

    if not any((Path(root) / name).exists() for name in names):
        return None
    group = zarr.open_group(str(root), mode="a", zarr_format=3)
    for name in names:
        if name in group:
            del group[name]
    return group


#: ``_FillValue`` as xarray's ``to_zarr`` writes it for a float variable (NaN, float64, base64)
_NAN_FILL_VALUE = base64.standard_b64encode(np.float64(np.nan).tobytes()).decode()


def _create_like_xarray(
    group: Any,
    name: str,
    dim: str,
    dtype: np.dtype,
    length: int,
    rows: int,
    compressor: Any = None,
    attributes: Mapping[str, str] | None = None,
) -> Any:
    """The metadata of a 1-D array ``name`` along ``dim`` as xarray's ``to_zarr`` (Zarr v3)
    writes it for a variable without encoding but ``chunks`` (and ``compressors``), its
    ``attributes`` (the CF ones of dates) stored: floats with fill value NaN and attribute
    ``_FillValue``, others with zarr's default fill value and compressors. No chunk is
    written; returns the array."""
    floating = dtype.kind == "f"
    return group.create_array(
        name=name,
        shape=(length,),
        dtype=dtype,
        chunks=(rows,),
        fill_value=np.nan if floating else None,
        compressors=(compressor,) if compressor is not None else "auto",
        dimension_names=(dim,),
        attributes={"_FillValue": _NAN_FILL_VALUE} if floating else dict(attributes or {}),
    )


def _longest_name(names: Sequence[str]) -> int:
    """The length of the longest name (a grid's from its labels, without the names)."""
    if isinstance(names, GridNames):
        labels = [max(map(len, lab), default=0) for lab in names.labels]
        return len(names.name) + 2 + sum(labels) + max(0, len(labels) - 1)
    return max(map(len, names), default=0)


def _write_names(arr: Any, names: Sequence[str], rows: int) -> None:
    """A feature-name coordinate (the zarr array ``arr``, its metadata written), a chunk of
    ``rows`` names at a time: the whole array of fixed-length strings (4 bytes a character of
    the longest name) and xarray's copies of it took 1.6 GB for the 2 M names of a
    110 x 308 x 60 grid, most of the memory of its prepare, and would take tens of GB at N320."""
    it = iter(names)
    for a in range(0, len(names), rows):
        slab = list(itertools.islice(it, rows))
        arr[a : a + len(slab)] = np.array(slab, dtype=arr.dtype)


def _coord_length(coords: SampleCoords) -> int:
    if coords.shape is not None:
        return int(np.prod(coords.shape, dtype=np.int64))
    return len(next(iter(coords.values.values()))) if coords.values else 0


def _write_coord_chunks(
    folder: Path, coords: SampleCoords, name: str, length: int, rows: int
) -> None:
    """The chunks of a sample coordinate whose metadata is written (its values as stored:
    dates CF-encoded), each expanded from the grid's axis, encoded and written here as the
    store's arrays are (:func:`~shardload.formats.zarr.write.write_chunk`; fsynced by the
    publish): zarr-python's pipeline and the whole expanded coordinates took 0.4-0.9 s for the
    75 MB of a 9.3 M-sample grid's ``lat`` and ``lon``. Through zarr-python where the values
    are not numbers (booleans, strings) or the layout is not one prepare writes."""
    import zarr

    from shardload.formats.zarr.chunks import load_chunk_layout
    from shardload.formats.zarr.write import write_chunk
    from shardload.util.durable import collect_written

    dtype = coords.dtype(name)
    bounds = (*range(0, length, rows), length)
    layout = None
    if dtype.kind in "fiu":
        meta = json.loads((folder / "zarr.json").read_text())
        if np.dtype(meta.get("data_type")) == dtype:
            layout = load_chunk_layout(
                str(folder), dtype=dtype, shape=(length,), chunk_bounds=bounds, strict=True
            )
    if layout is None:
        zarr.open_array(str(folder), mode="r+")[:] = coords.full(name)
        return
    with collect_written(defer=True):  # the publish's pass fsyncs the store's files
        for i, a in enumerate(bounds[:-1]):
            write_chunk(layout, i, coords.rows(name, a, min(a + rows, length)))
