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
    message passing layers using the encoded edges, with residual connections, a node decoder.

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
        self.decode = nn.Linear(hidden, n_out)
        self.act = nn.SiLU()

    def forward(self, graph: Any) -> torch.Tensor:
        h = self.act(self.encode(graph.x))
        e = self.act(self.encode_edge(graph.edge_attr))
        index = getattr(graph, "edge_attr_index", None)
        if index is not None:  # undirected rows (GraphBatcher(directed_edge_attr=False))
            e = e.index_select(0, index)
        for conv in self.convs:
            h = h + self.act(conv(h, graph.edge_index, e))
        return self.decode(h)
