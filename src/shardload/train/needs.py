"""What each example model needs of a store: its arrays, and the shape of ``x``.

Checked by the task that builds the model, and by ``shardload train`` before it imports
Lightning and torch (seconds), so that a model given the wrong kind of store is refused at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from shardload.errors import ShardloadError

#: the arrays each model reads
NEEDS = {"mlp": ("x", "y"), "gnn": ("x", "edge_attr", "y"), "lstm": ("x", "y")}
_WHAT = {
    "mlp": "a flat store (x, y)",
    "gnn": "a graph store (x, edge_attr, y)",
    "lstm": "a window store with targets (x, y)",
}


def check_store_fits(kind: str, arrays: Mapping[str, Any]) -> None:
    """Raise :class:`ShardloadError` unless a store with ``arrays`` (a manifest's: name ->
    info with a ``shape``) suits the model ``kind`` (one of :data:`NEEDS`)."""
    missing = [a for a in NEEDS[kind] if a not in arrays]
    if missing:
        raise ShardloadError(
            f"model {kind} needs {_WHAT[kind]}; the store lacks {missing} (it has {sorted(arrays)})"
        )
    xs = tuple(arrays["x"].shape)
    if kind == "lstm" and len(xs) != 3:
        raise ShardloadError(
            f"model lstm needs x of shape (samples, lookback, features); the store's x is {xs}"
        )
