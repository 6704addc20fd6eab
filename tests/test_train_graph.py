"""The vectorised graph batch equals PyTorch Geometric's Batch.from_data_list."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data

from shardload.train.graph import GraphBatcher, batch_graphs, shared_graph


def _radiation_static(nodes: int = 138) -> dict:
    fwd = [list(range(nodes - 1)), list(range(1, nodes))]
    return {
        "edge_index": [fwd[0] + fwd[1], fwd[1] + fwd[0]],
        "num_nodes": nodes,
        "num_undirected_edges": nodes - 1,
        "edge_order": "forward edges k->k+1 first, then backward",
    }


def test_batch_equals_from_data_list():
    g = torch.Generator().manual_seed(0)
    b, nodes = 5, 138
    x = torch.randn(b, nodes, 20, generator=g)
    ea = torch.randn(b, nodes - 1, 27, generator=g)
    y = torch.randn(b, nodes, 4, generator=g)
    ei, rows = shared_graph(_radiation_static(nodes))
    got = batch_graphs(x, ea, ei, rows, y)
    want = Batch.from_data_list(
        [Data(x=x[i], edge_index=ei, edge_attr=torch.cat([ea[i], ea[i]]), y=y[i]) for i in range(b)]
    )
    for key in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
        assert torch.equal(got[key], want[key]), key
    assert got.num_graphs == want.num_graphs == b


def test_batcher_undirected_rows_and_batch_sizes():
    static = _radiation_static(10)
    batcher = GraphBatcher(static)
    ei, _ = shared_graph(static)
    g = torch.Generator().manual_seed(1)
    for b in (3, 2, 3):  # a cached layout reused, another batch size in between
        x, ea = torch.randn(b, 10, 5, generator=g), torch.randn(b, 9, 2, generator=g)
        got = batcher(x, ea, directed_edge_attr=False)
        want = Batch.from_data_list(
            [Data(x=x[i], edge_index=ei, edge_attr=torch.cat([ea[i], ea[i]])) for i in range(b)]
        )
        assert torch.equal(got.edge_index, want.edge_index)
        assert torch.equal(got.batch, want.batch) and torch.equal(got.x, want.x)
        assert torch.equal(got.edge_attr.index_select(0, got.edge_attr_index), want.edge_attr)
        assert torch.equal(batcher(x, ea).edge_attr, want.edge_attr)


def test_not_a_graph_store():
    from shardload.errors import ShardloadError

    with pytest.raises(ShardloadError, match="edge_index"):
        shared_graph({})


def test_gnn_learns_a_column_sum_of_edge_features():
    """A target at each node that sums the edge features from the top of the column down to
    it (as fluxes integrate clouds): the example GNN must carry edge features into the nodes
    and see past its 3 hops. Before, GATv2 used edge features only as attention weights and
    the model ended at the mean predictor's loss."""
    from shardload.train.models import GNN

    torch.manual_seed(0)
    torch.set_num_threads(1)
    nodes, b = 24, 32
    batcher = GraphBatcher(_radiation_static(nodes))
    edges = torch.rand(b, nodes - 1, 1)
    y = torch.cat([torch.zeros(b, 1, 1), edges.cumsum(1)], dim=1)
    y = y - y.mean(0)  # the part a node's depth alone does not give
    y = y / y.std()
    x = torch.linspace(0, 1, nodes).expand(b, nodes)[..., None].contiguous()
    graph = batcher(x, edges, directed_edge_attr=False)
    model = GNN(1, 1, 1, hidden=32)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(100):
        loss = torch.nn.functional.mse_loss(model(graph).reshape(y.shape), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2, loss.item()
