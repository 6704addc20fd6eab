"""The radiation ML dataset seen as one path graph per atmospheric column.

Each sample (a column) is a graph of 138 nodes, one per half level (node 0 at the top of the
atmosphere, node 137 at the surface), and 137 undirected edges, one per level: level ``k``
lies between half levels ``k`` and ``k + 1``, so edge ``k`` joins nodes ``k`` and ``k + 1``.

Arrays, rows first:

- ``x`` (n, 138, 20) node features: ``hl_inputs`` (temperature_hl, pressure_hl), then
  ``overlap_param`` from ``inter_inputs``, then the 17 ``sca_inputs`` repeated on every node.
  The 136 level interfaces are the half levels strictly inside the column, so interface ``i``
  sits on node ``i + 1``; the top (0) and surface (137) nodes have no interface and get 0.
- ``edge_attr`` (n, 137, 27): ``col_inputs``; row ``k`` is undirected edge ``k`` and serves
  both of its directions.
- ``y`` (n, 138, 4): flux_dn_sw, flux_up_sw, flux_dn_lw, flux_up_lw on the nodes (present
  when the dataset has fluxes).

``static`` holds the graph shared by all samples: ``edge_index`` (2, 274), forward edges
``k -> k + 1`` first, then the backward edges ``k + 1 -> k`` in the same order, so directed
edge ``j`` uses ``edge_attr[:, j % 137]``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import xarray as xr

from shardload.errors import ViewError
from shardload.manifest.core import ArraySpec
from shardload.prep.views.base import check_lengths, check_numeric
from shardload.prep.views.rows import RowReader, read_vars, sample_length, sample_major

FLUXES = ("flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw")
_INPUTS = ("hl_inputs", "inter_inputs", "sca_inputs", "col_inputs")
_FEATURE_DIMS = {
    "hl_inputs": "hl_feature",
    "inter_inputs": "inter_feature",
    "sca_inputs": "sca_feature",
    "col_inputs": "col_feature",
}


class GraphView:
    """Path graphs over the columns of a packed radiation dataset.

    Parameters
    ----------
    ds
        The ML view of :func:`shardload.prep.sources.radiation.open_radiation` (lazy is best):
        ``hl_inputs``, ``inter_inputs``, ``sca_inputs``, ``col_inputs`` and optionally the
        four fluxes.
    sample_dims
        Dims stacked (C order) into the sample axis; ``("column",)`` or e.g.
        ``("time", "column")``.
    dtype
        Numeric dtype of every output array.

    Raises
    ------
    ViewError
        A needed variable is missing or has inconsistent sizes or a non-numeric dtype.
    """

    def __init__(
        self,
        ds: xr.Dataset,
        *,
        sample_dims: Sequence[str] = ("column",),
        dtype: Any = "float32",
        rows: RowReader | None = None,
    ) -> None:
        self.rows = rows  # a RowReader that bypasses dask, or None
        self.sample_dims = tuple(sample_dims)
        self.dtype = np.dtype(dtype)
        check_numeric("dtype", self.dtype, where="GraphView")
        missing = [name for name in _INPUTS if name not in ds.data_vars]
        if missing:
            raise ViewError(
                f"GraphView needs variable(s) {missing}; the dataset has {list(ds.data_vars)}"
            )
        # feature dims last, whatever order the dataset stores them in
        self._vars = {
            name: sample_major(ds[name], self.sample_dims).transpose(..., _feature_dim(ds, name))
            for name in _INPUTS
        }
        self.has_fluxes = all(name in ds.data_vars for name in FLUXES)
        if self.has_fluxes:
            self._vars.update({name: sample_major(ds[name], self.sample_dims) for name in FLUXES})
        for name, var in self._vars.items():
            check_numeric(name, var.dtype, where="GraphView")
        self._length = check_lengths(
            {name: sample_length(var, self.sample_dims) for name, var in self._vars.items()}
        )
        self.num_nodes = self._check_sizes()
        self._features = {name: _feature_names(ds, name, self._vars[name]) for name in _INPUTS}

    def _check_sizes(self) -> int:
        k = len(self.sample_dims)
        shapes = {name: var.shape[k:] for name, var in self._vars.items()}
        nodes = shapes["hl_inputs"][0]
        expected = {
            "hl_inputs": (nodes, None),
            "inter_inputs": (nodes - 2, 1),
            "sca_inputs": (None,),
            "col_inputs": (nodes - 1, None),
            **{name: (nodes,) for name in FLUXES},
        }
        for name, shape in shapes.items():
            want = expected[name]
            ok = len(shape) == len(want) and all(
                w is None or s == w for s, w in zip(shape, want, strict=True)
            )
            if not ok:
                pretty = tuple("*" if w is None else w for w in want)
                raise ViewError(
                    f"variable {name!r} has row shape {shape}; GraphView expects {pretty} "
                    f"for {nodes} nodes (half levels)"
                )
        return int(nodes)

    @property
    def length(self) -> int:
        """Number of samples (columns)."""
        return self._length

    @property
    def specs(self) -> Mapping[str, ArraySpec]:
        """Shapes, dtype and feature names of ``x``, ``edge_attr`` and ``y``."""
        n, nodes = self._length, self.num_nodes
        f = self._features
        x_features = (*f["hl_inputs"], *f["inter_inputs"], *f["sca_inputs"])
        specs = {
            "x": ArraySpec("x", (n, nodes, len(x_features)), self.dtype, x_features),
            "edge_attr": ArraySpec(
                "edge_attr", (n, nodes - 1, len(f["col_inputs"])), self.dtype, f["col_inputs"]
            ),
        }
        if self.has_fluxes:
            specs["y"] = ArraySpec("y", (n, nodes, len(FLUXES)), self.dtype, FLUXES)
        return specs

    @property
    def static(self) -> Mapping[str, Any]:
        """The path graph shared by every sample (JSON-able)."""
        num_edges = self.num_nodes - 1
        forward = list(range(num_edges))
        backward = [k + 1 for k in forward]
        return {
            "edge_index": [forward + backward, backward + forward],
            "num_nodes": self.num_nodes,
            "num_undirected_edges": num_edges,
            "edge_order": "forward edges k->k+1 first, then backward",
        }

    def read(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Rows ``[start, stop)`` of ``x``, ``edge_attr`` and ``y``, reading only those rows."""
        names = list(self._vars)
        values = read_vars(list(self._vars.values()), self.sample_dims, start, stop, self.rows)
        part = dict(zip(names, values, strict=True))
        hl, inter, sca = part["hl_inputs"], part["inter_inputs"], part["sca_inputs"]
        rows, nodes = stop - start, self.num_nodes
        n_hl, n_inter = hl.shape[-1], inter.shape[-1]
        x = np.zeros((rows, nodes, n_hl + n_inter + sca.shape[-1]), dtype=self.dtype)
        x[:, :, :n_hl] = hl
        x[:, 1:-1, n_hl : n_hl + n_inter] = inter  # interface i on node i + 1; ends stay 0
        x[:, :, n_hl + n_inter :] = sca[:, None, :]
        out = {"x": x, "edge_attr": part["col_inputs"].astype(self.dtype, copy=False)}
        if self.has_fluxes:
            out["y"] = np.stack([part[name] for name in FLUXES], axis=-1).astype(self.dtype)
        return out


def _feature_dim(ds: xr.Dataset, name: str) -> str:
    dim = _FEATURE_DIMS[name]
    if dim not in ds[name].dims:
        raise ViewError(
            f"variable {name!r} lacks its feature dim {dim!r}; dims are {ds[name].dims}"
        )
    return dim


def _feature_names(ds: xr.Dataset, name: str, var: xr.DataArray) -> tuple[str, ...]:
    dim = _FEATURE_DIMS[name]
    if dim in ds.coords:
        return tuple(str(v) for v in ds[dim].values)
    return tuple(f"{name}_{i}" for i in range(var.sizes[dim]))
