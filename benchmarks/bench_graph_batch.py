"""Graphs per second of the GNN example's batching: the vectorised disjoint union
(:class:`shardload.train.graph.GraphBatcher`: one broadcast add offsets the shared edge_index,
``repeat_interleave`` builds the batch vector, both cached per batch size) against PyTorch Geometric's
``Batch.from_data_list`` of per-sample ``Data`` objects, on radiation-shaped graphs
(138 nodes x 20 features, 274 directed edges x 27 features).

Usage::

    python benchmarks/bench_graph_batch.py [--batch 256] [--seconds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import time

import torch


def rate(fn, graphs: int, seconds: float) -> float:
    fn()  # warm up
    n, t0 = 0, time.perf_counter()
    while (dt := time.perf_counter() - t0) < seconds:
        fn()
        n += 1
    return n * graphs / dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=256, help="graphs per batch")
    ap.add_argument("--seconds", type=float, default=3.0, help="time per method")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from torch_geometric.data import Batch, Data

    from shardload.train.graph import GraphBatcher, shared_graph

    nodes, b = 138, args.batch
    fwd = [list(range(nodes - 1)), list(range(1, nodes))]
    static = {"edge_index": [fwd[0] + fwd[1], fwd[1] + fwd[0]], "num_undirected_edges": nodes - 1}
    ei, rows = shared_graph(static)
    batcher = GraphBatcher(static)
    x, ea, y = torch.randn(b, nodes, 20), torch.randn(b, nodes - 1, 27), torch.randn(b, nodes, 4)

    fast = rate(lambda: batcher(x, ea, y, directed_edge_attr=False), b, args.seconds)
    copy = rate(lambda: batcher(x, ea, y), b, args.seconds)
    slow = rate(
        lambda: Batch.from_data_list(
            [
                Data(x=x[i], edge_index=ei, edge_attr=ea[i].index_select(0, rows), y=y[i])
                for i in range(b)
            ]
        ),
        b,
        args.seconds,
    )
    print(f"batch {b}, threads {args.threads}")
    print(f"GraphBatcher (undirected edge_attr, as the GNN example): {fast:12,.0f} graphs/s")
    print(f"GraphBatcher (edge_attr per directed edge, a copy)     : {copy:12,.0f} graphs/s")
    print(f"torch_geometric Batch.from_data_list                   : {slow:12,.0f} graphs/s")


if __name__ == "__main__":
    main()
