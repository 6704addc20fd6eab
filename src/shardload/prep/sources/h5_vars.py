"""How a plain netCDF-4/HDF5 variable is stored (:class:`H5Var`), planned with h5py alone for
:class:`~shardload.prep.sources.h5_rows.H5Rows` (:func:`plan_var`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from shardload.prep.sources.cf_decode import CFDecode, plan_cf_decode


@dataclass(frozen=True)
class H5Var:
    """How one variable is stored: ``axes`` are the storage axes of the sample dims (in
    ``sample_dims`` order) followed by the other axes (in storage order)."""

    name: str
    path: str  # inside the HDF5 file
    shape: tuple[int, ...]
    chunks: tuple[int, ...] | None
    filtered: bool
    num_sample: int
    axes: tuple[int, ...]
    decode: CFDecode | None = None  # packed / masked: read raw, decoded as xarray does

    @property
    def row_shape(self) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in self.axes[self.num_sample :])

    @property
    def sample_sizes(self) -> tuple[int, ...]:
        return tuple(self.shape[a] for a in self.axes[: self.num_sample])


#: netCDF-4's name for a variable named as a dimension it is not the coordinate of
_NON_COORD = "_nc4_non_coord_"


def _dataset(node: Any, name: str) -> Any:
    """The h5py dataset of netCDF variable ``name`` in group ``node``, or None."""
    import h5py

    for key in (_NON_COORD + name, name):
        obj = node.get(key)
        if isinstance(obj, h5py.Dataset):
            return obj
    return None


def plan_var(name: str, da: Any, node: Any, sample_dims: Sequence[str]) -> H5Var | None:
    import h5py
    from h5netcdf.attrs import Attributes

    dset = _dataset(node, name)
    if dset is None or not all(d in da.dims for d in sample_dims):
        return None
    dims = tuple(da.dims)
    if len(dims) != dset.ndim or tuple(dset.shape) != tuple(da.shape) or not sample_dims:
        return None
    attrs = Attributes(dset.attrs, lambda dtype: None, h5py)  # as h5netcdf returns them
    decode = plan_cf_decode(attrs, dset.dtype, da.dtype)  # the attributes as xarray reads them
    if decode is None:
        return None
    sample_axes = tuple(dims.index(d) for d in sample_dims)
    rest = tuple(i for i in range(len(dims)) if i not in sample_axes)
    return H5Var(
        name=name,
        path=dset.name,
        shape=tuple(int(s) for s in dset.shape),
        chunks=tuple(int(c) for c in dset.chunks) if dset.chunks else None,
        filtered=bool(dset.id.get_create_plist().get_nfilters()),
        num_sample=len(sample_axes),
        axes=sample_axes + rest,
        decode=None if decode.identity else decode,
    )
