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

from shardload.errors import ShardloadError


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


class GraphBatcher:
    """Builds PyTorch Geometric batches of graphs that all share one ``edge_index``.

    The batched ``edge_index``, ``batch`` and ``ptr`` depend only on the batch size, so they
    are computed once per batch size (one broadcast add offsets the shared edges by
    ``nodes * b``, ``repeat_interleave`` numbers the nodes' graphs) and reused: the tensors are
    shared between batches, so treat them as read-only (PyG's layers do). Node features and
    targets are reshaped views of the loader's tensors (no copy).

    Parameters
    ----------
    static
        The graph store manifest's ``static`` (``edge_index``, ``num_undirected_edges``).
    """

    def __init__(self, static: Mapping[str, Any]) -> None:
        self.edge_index, self.edge_rows = shared_graph(static)
        self._layouts: dict[tuple[int, int, int, str], tuple[torch.Tensor, ...]] = {}

    def _layout(
        self, b: int, nodes: int, undirected: int, device: torch.device
    ) -> tuple[torch.Tensor, ...]:
        key = (b, nodes, undirected, str(device))
        got = self._layouts.get(key)
        if got is None:
            directed = int(self.edge_index.shape[1])
            offsets = torch.arange(b, dtype=torch.int64, device=device)
            ei = self.edge_index.to(device)[:, None, :] + (offsets * nodes)[None, :, None]
            rows = self.edge_rows.to(device)[None, :] + (offsets * undirected)[:, None]
            got = (
                ei.reshape(2, b * directed),
                offsets.repeat_interleave(nodes),
                torch.arange(b + 1, dtype=torch.int64, device=device) * nodes,
                rows.reshape(b * directed),
            )
            if len(self._layouts) > 8:  # a few batch sizes in use (e.g. a short last batch)
                self._layouts.clear()
            self._layouts[key] = got
        return got

    def __call__(
        self,
        x: torch.Tensor,
        edge_attr: torch.Tensor,
        y: torch.Tensor | None = None,
        *,
        directed_edge_attr: bool = True,
    ) -> Any:
        """One ``torch_geometric.data.Batch`` of the ``B`` graphs in ``x`` (B, nodes, F) and
        ``edge_attr`` (B, undirected, E) (and ``y`` (B, nodes, ...)).

        ``directed_edge_attr=True``: ``edge_attr`` per directed edge (B * directed, E), equal
        to ``Batch.from_data_list`` of the per-sample ``Data``; this copies every edge's
        features once per direction. ``False``: ``edge_attr`` is the undirected rows
        (B * undirected, E, a view) and ``edge_attr_index`` (B * directed,) says which row each
        directed edge uses; a model can encode the rows first and gather the encodings.
        """
        data = _pyg()
        b, nodes, undirected = int(x.shape[0]), int(x.shape[1]), int(edge_attr.shape[1])
        if self.edge_rows.numel() and int(self.edge_rows.max()) >= undirected:
            raise ShardloadError(
                f"edge_attr has {undirected} edges per graph; the shared graph needs "
                f"{int(self.edge_rows.max()) + 1}"
            )
        ei, batch, ptr, rows = self._layout(b, nodes, undirected, x.device)
        ea = edge_attr.reshape(b * edge_attr.shape[1], -1)
        kw: dict[str, Any] = {"x": x.reshape(b * nodes, -1), "edge_index": ei}
        if directed_edge_attr:
            kw["edge_attr"] = ea.index_select(0, rows)
        else:
            kw["edge_attr"], kw["edge_attr_index"] = ea, rows
        if y is not None:
            kw["y"] = y.reshape(b * nodes, *y.shape[2:])
        out = data.Batch(batch=batch, ptr=ptr, **kw)
        out._num_graphs = b
        return out


def batch_graphs(
    x: torch.Tensor,
    edge_attr: torch.Tensor,
    edge_index: torch.Tensor,
    edge_rows: torch.Tensor,
    y: torch.Tensor | None = None,
) -> Any:
    """One-off :class:`GraphBatcher` call with per-directed-edge ``edge_attr`` (equal to
    ``Batch.from_data_list``); reuse a :class:`GraphBatcher` in a training loop."""
    batcher = GraphBatcher.__new__(GraphBatcher)
    batcher.edge_index, batcher.edge_rows = edge_index, edge_rows
    batcher._layouts = {}
    return batcher(x, edge_attr, y)
