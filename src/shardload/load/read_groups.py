"""Read groups at load time: the options checked against a store (the plan is
:mod:`shardload.plan.read_groups`; a member's reads, :mod:`shardload.store.sliced`)."""

from __future__ import annotations

from collections.abc import Sequence

from shardload.errors import PlanError
from shardload.load.ragged import ragged_names
from shardload.plan.read_groups import ReadGroupAxis, plan_row_slices
from shardload.store.core import Store

__all__ = ["check_read_groups"]


def check_read_groups(store: Store, names: Sequence[str], size: int, axis: ReadGroupAxis) -> None:
    """Read groups of ``size`` over ``names``: fixed-shape arrays, and an axis every member
    has a part of (a :class:`PlanError` naming the option and the array)."""
    ragged = ragged_names(store, names)
    if ragged:
        raise PlanError(
            f"read_group_size={size}: variable-length arrays {ragged} of {store.url} cannot be "
            f"split along an axis; select the fixed-shape arrays (arrays=...)"
        )
    rows = {a: store.manifest.arrays[a].row_shape for a in names}
    plan_row_slices(rows, read_group_size=size, member=0, axis=axis)
