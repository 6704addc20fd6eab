"""The vectorised graph batch equals PyTorch Geometric's Batch.from_data_list."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("torch_geometric")
from torch_geometric.data import Batch, Data  # noqa: E402

from shardload.train.graph import batch_graphs, shared_graph  # noqa: E402


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
    want = Batch.from_data_list([
        Data(x=x[i], edge_index=ei, edge_attr=torch.cat([ea[i], ea[i]]), y=y[i]) for i in range(b)
    ])  # fmt: skip
    for key in ("x", "edge_index", "edge_attr", "y", "batch", "ptr"):
        assert torch.equal(got[key], want[key]), key
    assert got.num_graphs == want.num_graphs == b


def test_not_a_graph_store():
    from shardload.errors import ShardloadError

    with pytest.raises(ShardloadError, match="edge_index"):
        shared_graph({})
