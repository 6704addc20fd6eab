"""PyTorch Lightning integration by its public name: ``from shardload.lightning import ShardloadDataModule``.

The module lives in :mod:`shardload.torch.lightning`, with the rest of the torch layer.
"""

from shardload.torch.lightning import ShardloadDataModule

__all__ = ["ShardloadDataModule"]
