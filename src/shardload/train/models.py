"""The example models (plain ``torch.nn`` modules): MLP on flat vectors, GNN on the radiation
path graphs (PyTorch Geometric), LSTM on look-back windows."""

from __future__ import annotations

import itertools
from typing import Any

import torch
from torch import nn


class MLP(nn.Module):
    """``(B, n_in) -> (B, n_out)``: ``layers`` hidden layers of ``hidden`` units, SiLU."""

    def __init__(self, n_in: int, n_out: int, *, hidden: int = 256, layers: int = 2) -> None:
        super().__init__()
        dims = [n_in] + [hidden] * layers
        mods: list[nn.Module] = []
        for a, b in itertools.pairwise(dims):
            mods += [nn.Linear(a, b), nn.SiLU()]
        mods.append(nn.Linear(dims[-1], n_out))
        self.net = nn.Sequential(*mods)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(x.shape[0], -1))


class LSTMRegressor(nn.Module):
    """``(B, lookback, n_in) -> (B, n_out)`` from the last time step's hidden state."""

    def __init__(self, n_in: int, n_out: int, *, hidden: int = 64, layers: int = 1) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_in, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out, _ = self.lstm(x.reshape(x.shape[0], x.shape[1], -1))
        return self.head(out[:, -1])


class GNN(nn.Module):
    """Node regression on graphs with edge features: node and edge encoders, ``layers`` GATv2
    message passing layers using the encoded edges, each followed by a column context, with
    residual connections, then a node decoder.

    Two things make it learn the radiation columns (without them it ended at the mean
    predictor's loss):

    - **Edge features reach the nodes.** GATv2 uses edge features only in its attention
      weights, and the radiation graphs keep most inputs (clouds, gases: ``col_inputs``) on
      the edges; each node therefore starts with the mean of its incident edges' encodings.
    - **Column context.** ``layers`` rounds of message passing reach ``layers`` hops, but the
      flux at a level depends on every level above and below it. Graphs of the same node
      count in a batch (all radiation columns: node 0 at the top) get, after each layer, the
      running mean of the node states from the top and from the bottom down to each node,
      through a linear layer (an ordered readout; a virtual node is its order-free cousin).
      Batches of graphs of unequal sizes get the graph mean instead.

    Takes a PyG batch whose ``edge_attr`` is per directed edge, or per undirected edge with an
    ``edge_attr_index`` (edges are encoded before they are gathered per direction).
    """

    def __init__(
        self, n_node: int, n_edge: int, n_out: int, *, hidden: int = 64, layers: int = 3
    ) -> None:
        super().__init__()
        try:
            from torch_geometric.nn import GATv2Conv
        except ImportError as exc:
            raise ImportError(
                "the GNN example needs PyTorch Geometric: pip install 'shardload[gnn]'"
            ) from exc
        self.encode = nn.Linear(n_node, hidden)
        self.encode_edge = nn.Linear(n_edge, hidden)
        self.convs = nn.ModuleList(
            GATv2Conv(hidden, hidden, edge_dim=hidden, add_self_loops=False) for _ in range(layers)
        )
        self.context = nn.ModuleList(nn.Linear(2 * hidden, hidden) for _ in range(layers))
        self.decode = nn.Sequential(nn.Linear(hidden, hidden), nn.SiLU(), nn.Linear(hidden, n_out))
        self.act = nn.SiLU()

    def _context(self, h: torch.Tensor, graph: Any) -> torch.Tensor:
        b = int(graph.num_graphs)
        if h.shape[0] % b == 0 and bool((graph.ptr.diff() == h.shape[0] // b).all()):
            hv = h.reshape(b, h.shape[0] // b, h.shape[1])
            count = torch.arange(1, hv.shape[1] + 1, device=h.device, dtype=h.dtype)[:, None]
            down = hv.cumsum(1) / count
            up = hv.flip(1).cumsum(1).flip(1) / count.flip(0)
            return torch.cat([down, up], dim=-1).reshape(h.shape[0], -1)
        from torch_geometric.nn import global_mean_pool

        g = global_mean_pool(h, graph.batch, size=b).index_select(0, graph.batch)
        return torch.cat([g, g], dim=-1)

    def forward(self, graph: Any) -> torch.Tensor:
        from torch_geometric.utils import scatter

        h = self.act(self.encode(graph.x))
        e = self.act(self.encode_edge(graph.edge_attr))
        index = getattr(graph, "edge_attr_index", None)
        if index is not None:  # undirected rows (GraphBatcher(directed_edge_attr=False))
            e = e.index_select(0, index)
        h = h + scatter(e, graph.edge_index[1], dim=0, dim_size=h.shape[0], reduce="mean")
        for conv, context in zip(self.convs, self.context, strict=True):
            h = h + self.act(conv(h, graph.edge_index, e))
            h = h + self.act(context(self._context(h, graph)))
        return self.decode(h)
