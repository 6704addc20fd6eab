"""The flat view (MLP input): each named array is the concatenation of listed variables, each
flattened after the (stacked) sample axis."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from shardload.errors import ViewError
from shardload.manifest.core import ArraySpec
from shardload.manifest.names import ChainedNames, GridNames
from shardload.prep.views.base import check_features, check_lengths, check_numeric
from shardload.prep.views.rows import RowReader, read_vars, sample_length, sample_major


def feature_names(da: xr.DataArray, sample_dims: Sequence[str]) -> tuple[str, ...]:
    """Names of the flattened features of one variable: ``var`` or ``var[label,...]``."""
    return tuple(feature_name_seq(da, sample_dims))


def feature_name_seq(da: xr.DataArray, sample_dims: Sequence[str]) -> Sequence[str]:
    """:func:`feature_names` as a sequence; for two or more feature dims, a lazy
    :class:`~shardload.manifest.names.GridNames` (millions of names are never built as strings)."""
    name = str(da.name)
    rest = [d for d in da.dims if d not in sample_dims]
    if not rest:
        return (name,)
    labels = []
    for d in rest:
        if d in da.coords and da.coords[d].ndim == 1:
            labels.append([str(v) for v in np.asarray(da.coords[d].values)])
        else:
            labels.append([str(i) for i in range(da.sizes[d])])
    if len(labels) == 1:  # the common wide case: one string per feature, nothing else
        return tuple([f"{name}[{lab}]" for lab in labels[0]])
    return GridNames(name, labels)


class FlatView:
    """``arrays = {"x": ["t", "z"]}`` -> ``x`` of shape ``(samples, F_t + F_z)``."""

    def __init__(
        self,
        ds: xr.Dataset,
        arrays: Mapping[str, Sequence[str]],
        *,
        sample_dims: Sequence[str],
        dtype: str | None = None,
        rows: RowReader | None = None,
    ) -> None:
        self.rows = rows  # a RowReader that bypasses dask, or None
        if not sample_dims:
            raise ViewError("sample_dims: the flat view needs at least one sample dimension")
        self.sample_dims = tuple(sample_dims)
        self._vars: dict[str, list[xr.DataArray]] = {}
        specs: dict[str, ArraySpec] = {}
        lengths: dict[str, int] = {}
        for out, names in arrays.items():
            das = []
            for v in names:
                if v not in ds.variables:
                    raise ViewError(
                        f"arrays.{out}: variable {v!r} not found; the source has {sorted(map(str, ds.data_vars))}"
                    )
                da = ds[v]
                check_numeric(v, da.dtype, where=f"arrays.{out}")
                check_features(v, da.sizes, self.sample_dims, where=f"arrays.{out}")
                lengths[f"{out}.{v}"] = sample_length(da, self.sample_dims)
                das.append(sample_major(da, self.sample_dims))
            self._vars[out] = das
            n_feat = [int(np.prod(d.shape[len(self.sample_dims) :], dtype=np.int64)) for d in das]
            dt = np.dtype(dtype) if dtype else np.result_type(*[d.dtype for d in das])
            parts = [feature_name_seq(d, self.sample_dims) for d in das]
            feats: Sequence[str] = (
                parts[0]
                if len(parts) == 1
                else tuple(itertools.chain.from_iterable(parts))
                if all(isinstance(p, tuple) for p in parts)
                else ChainedNames(parts)
            )
            specs[out] = ArraySpec(
                out, (0, int(sum(n_feat))), dt, feats, {"variables": list(names)}
            )
        self._length = check_lengths(lengths)
        self._specs = {
            k: ArraySpec(s.name, (self._length, *s.shape[1:]), s.dtype, s.features, s.attrs)
            for k, s in specs.items()
        }

    @property
    def length(self) -> int:
        return self._length

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        return self._specs

    @property
    def static(self) -> Mapping[str, Any]:
        return {}

    @property
    def read_by_rows(self) -> bool:
        """Whether its row reader serves every variable it reads (then the lazy dataset's
        chunks play no part in a read)."""
        names = {str(d.name) for das in self._vars.values() for d in das}
        return self.rows is not None and names <= set(self.rows.names)

    @property
    def sample_source(self) -> xr.DataArray:
        """A source variable, sample-major: its coords hold the sample dims' coordinates."""
        return next(iter(self._vars.values()))[0]

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        out: dict[str, np.ndarray] = {}
        n = stop - start
        for name, das in self._vars.items():
            spec = self._specs[name]
            buf = np.empty((n, spec.shape[1]), dtype=spec.dtype)
            # each variable's columns of buf; a RowReader fills the reshaped views in place
            rests = [d.shape[len(self.sample_dims) :] for d in das]
            cols = np.cumsum([0, *(int(np.prod(r, dtype=np.int64)) for r in rests)])
            targets = [buf[:, a:b] for a, b in itertools.pairwise(cols.tolist())]
            places = [_view_as(t, (n, *r)) for t, r in zip(targets, rests, strict=True)]
            blocks = read_vars(das, self.sample_dims, start, stop, self.rows, out=places)
            for block, target in zip(blocks, targets, strict=True):
                if not np.shares_memory(block, target):  # not read in place: copy it there
                    target[...] = block.reshape(n, -1)
            out[name] = buf
        return out


def _view_as(a: np.ndarray, shape: tuple[int, ...]) -> np.ndarray | None:
    """``a`` reshaped to ``shape`` without a copy, or None where that needs a copy."""
    try:
        v = a.view()
        v.shape = shape  # raises rather than copying
    except (AttributeError, ValueError):
        return None
    return v
