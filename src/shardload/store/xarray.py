"""``Store.to_xarray``: a store as a lazy ``xarray.Dataset`` (one dask chunk per store chunk).

The read side's only xarray and dask import, made when a user asks for a Dataset.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import dask.array as da
import numpy as np
import xarray as xr

from shardload.errors import StoreError
from shardload.layout import COORDS_NAME
from shardload.plan.grids import expand_sample_coords

if TYPE_CHECKING:
    from shardload.store.core import Store


def store_to_xarray(store: Store, names: Sequence[str] | None = None) -> xr.Dataset:
    """See :meth:`shardload.store.core.Store.to_xarray`."""
    chunks = tuple(int(c) for c in np.diff(store.chunk_bounds))
    data_vars = {}
    for name in names or [a for a in store.arrays if a not in store.ragged]:
        if name not in store.manifest.arrays:
            raise StoreError(
                f"array {name!r} is not in store {store.url}; it has {list(store.arrays)}"
            )
        if store.manifest.arrays[name].is_ragged:
            raise StoreError(
                f"array {name!r} of {store.url} is variable-length: xarray has no form for it "
                "(read it with Store.read, which returns (values, lengths))"
            )
        info = store.manifest.arrays[name]
        named = info.attrs.get("dims")  # a compute store: the source's dims
        if named is not None and len(named) == len(info.shape) and info.features is None:
            dims = [str(d) for d in named]
        else:
            dims = ["sample", *(f"{name}_dim{i}" for i in range(1, len(info.shape)))]
        coords = {}
        if info.features is not None and len(info.shape) > 1:
            if len(info.features) != info.shape[-1]:
                raise StoreError(
                    f"array {name!r} of {store.url} has {len(info.features)} feature names "
                    f"for {info.shape[-1]} features"
                )
            dims[-1] = f"{name}_feature"
            coords[dims[-1]] = np.asarray(list(info.features), dtype=str)
        lazy = da.from_array(
            _Rows(store, name),
            chunks=(chunks or (0,), *info.shape[1:]),
            lock=False,
            asarray=False,
            inline_array=True,
            name=f"shardload-{name}-{_digest(store._identity())}",
            meta=np.empty((0,) * len(info.shape), dtype=info.dtype),  # no probing read
        )
        data_vars[name] = xr.Variable(dims, lazy, attrs=dict(info.attrs))
        for d, c in coords.items():
            data_vars[d] = xr.Variable((d,), c)
    ds = xr.Dataset(data_vars, attrs={"shardload_store": store.url})
    if "sample" in ds.dims:
        ds = ds.assign_coords(_sample_coords(store))
    return ds


def _sample_coords(store: Store) -> dict[str, xr.Variable]:
    """The sample dims' coordinates along ``sample`` (``_coords.npz``, written by prepare)."""
    import io

    names = store.manifest.options.get("sample_coords") or []
    if not names:
        return {}
    path = f"{store.root}/{COORDS_NAME}"
    if store.is_local:
        with open(path, "rb") as f:
            raw = f.read()
    else:
        from shardload.move.remote import read_bytes

        raw = read_bytes(store.fs, path, what=f"{COORDS_NAME} of {store.url}")
    with np.load(io.BytesIO(raw), allow_pickle=False) as npz:
        values = {str(n): npz[n] for n in names}
    try:
        full = expand_sample_coords(values, store.manifest.options, len(store))
    except ValueError as exc:
        raise StoreError(f"{COORDS_NAME} of {store.url}: {exc}") from exc
    coords = {n: xr.Variable(("sample",), v) for n, v in full.items()}
    for n, v in coords.items():
        if v.shape != (len(store),):
            raise StoreError(
                f"{COORDS_NAME} of {store.url}: coordinate {n!r} has {v.shape[0]} values "
                f"for {len(store)} samples"
            )
    return coords


def _digest(text: str) -> str:
    import hashlib

    return hashlib.sha1(text.encode()).hexdigest()[:16]


class _Rows:
    """An array-like over one array of a store for ``dask.array.from_array``: indexing with
    slices reads the rows through :meth:`Store.read` (picklable: the store drops its handles)."""

    def __init__(self, store: Store, name: str) -> None:
        info = store.manifest.arrays[name]
        self.store, self.name = store, name
        self.shape, self.dtype, self.ndim = tuple(info.shape), np.dtype(info.dtype), len(info.shape)

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows = key[0] if key else slice(None)
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = rows.indices(self.shape[0])
            return self.store.read(self.name, start, max(start, stop))[(slice(None), *key[1:])]
        return self.store.read(self.name)[key]
