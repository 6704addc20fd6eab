"""Batched graphs for stores whose samples all share one graph (the radiation graph view).

A graph store holds node features ``x`` (n, nodes, F), per-edge features ``edge_attr``
(n, undirected_edges, E) and, in its manifest's ``static``, one ``edge_index`` (2, directed
edges) shared by every sample. :func:`batch_graphs` builds PyTorch Geometric's disjoint-union
batch of ``B`` samples with a few vectorised tensor ops (offset ``edge_index`` by ``nodes * b``
with one broadcast add, ``batch`` by ``repeat_interleave``) instead of ``B`` ``Data`` objects
and ``Batch.from_data_list``, which costs tens of microseconds per graph in Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import ShardloadError


def _pyg() -> Any:
    try:
        import torch_geometric.data
    except ImportError as exc:
        raise ImportError(
            "the GNN example needs PyTorch Geometric: pip install 'shardload[gnn]'"
        ) from exc
    return torch_geometric.data


def shared_graph(static: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, edge_attr_row)`` from a graph store's ``static``: the directed edges and,
    for each directed edge, the row of ``edge_attr`` it uses (``edge_order`` when the store
    gives it, else edge ``j`` uses row ``j % undirected_edges``)."""
    if "edge_index" not in static:
        raise ShardloadError(
            "not a graph store: its manifest has no static 'edge_index' (prepare it with view: graph)"
        )
    edge_index = torch.as_tensor(static["edge_index"], dtype=torch.int64)
    directed = edge_index.shape[1]
    undirected = int(static.get("num_undirected_edges", directed))
    order = static.get("edge_order")
    if isinstance(order, list | tuple) and len(order) == directed:
        rows = torch.as_tensor(order, dtype=torch.int64)
    else:
        rows = torch.arange(directed, dtype=torch.int64) % undirected
    return edge_index, rows


def batch_graphs(
    x: torch.Tensor, edge_attr: torch.Tensor, edge_index: torch.Tensor, edge_rows: torch.Tensor,
    y: torch.Tensor | None = None,
) -> Any:  # fmt: skip
    """One ``torch_geometric.data.Batch`` of ``B`` graphs sharing ``edge_index``.

    ``x`` (B, nodes, F), ``edge_attr`` (B, undirected, E), ``y`` (B, nodes, T) or None. Equal to
    ``Batch.from_data_list`` of the per-sample ``Data(x, edge_index, edge_attr, y)``.
    """
    data = _pyg()
    b, nodes = int(x.shape[0]), int(x.shape[1])
    directed = int(edge_index.shape[1])
    offsets = torch.arange(b, dtype=torch.int64, device=x.device) * nodes
    ei = (edge_index.to(x.device)[:, None, :] + offsets[None, :, None]).reshape(2, b * directed)
    ea = edge_attr.index_select(1, edge_rows.to(x.device)).reshape(b * directed, -1)
    batch = torch.arange(b, device=x.device).repeat_interleave(nodes)
    ptr = torch.arange(b + 1, dtype=torch.int64, device=x.device) * nodes
    kw: dict[str, Any] = {"x": x.reshape(b * nodes, -1), "edge_index": ei, "edge_attr": ea}
    if y is not None:
        kw["y"] = y.reshape(b * nodes, *y.shape[2:])
    out = data.Batch(batch=batch, ptr=ptr, **kw)
    out._num_graphs = b
    return out
