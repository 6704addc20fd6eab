"""Read groups at load time: the options checked against a store (the plan is
:mod:`shardload.plan.read_groups`; a member's reads, :mod:`shardload.store.sliced`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from shardload.errors import PlanError
from shardload.load.ragged import ragged_names
from shardload.plan.read_groups import (
    ReadGroupAxis,
    ReadGroupSize,
    RowSlice,
    check_read_group_size,
    plan_level_slices,
    read_group_levels,
)
from shardload.store.core import Store

__all__ = ["check_read_groups", "level_slices", "merged_slices"]


def check_read_groups(
    store: Store, names: Sequence[str], size: ReadGroupSize, axis: ReadGroupAxis
) -> None:
    """Read groups of ``size`` (one level or several) over ``names``: fixed-shape arrays, and
    at each level an axis every member has a part of (a :class:`PlanError` naming the option
    and the array)."""
    ragged = ragged_names(store, names)
    if ragged:
        raise PlanError(
            f"read_group_size={size!r}: variable-length arrays {ragged} of {store.url} cannot be "
            f"split along an axis; select the fixed-shape arrays (arrays=...)"
        )
    rows = {a: store.manifest.arrays[a].row_shape for a in names}
    plan_level_slices(rows, read_group_size=size, member=0, axis=axis)


def level_slices(
    store: Store, names: Sequence[str], spec: Any, member: int
) -> tuple[dict[str, RowSlice], ...]:
    """The slices of ``names`` that read group member ``member`` of ``spec``'s read groups
    (its ``read_group_size`` and ``read_group_axis``) reads, one dict per level; levels of one
    rank, and levels that cut nothing, left out (nothing without read groups)."""
    if check_read_group_size(spec.read_group_size) == 1:
        return ()
    rows = {a: store.manifest.arrays[a].row_shape for a in names}
    levels = read_group_levels(spec.read_group_size)
    slices = plan_level_slices(
        rows, read_group_size=levels, member=member, axis=spec.read_group_axis
    )
    return tuple(s for g, s in zip(levels, slices, strict=True) if g > 1 and s)


def merged_slices(
    per_level: Sequence[dict[str, RowSlice]], size: ReadGroupSize
) -> dict[str, RowSlice] | dict[str, tuple[RowSlice, ...]]:
    """One level (``size`` an int): its slices; several: each array's slices, one per level
    that cuts it, outermost first."""
    if isinstance(size, int):
        return dict(per_level[0]) if per_level else {}
    names = [a for s in per_level for a in s]
    return {a: tuple(s[a] for s in per_level if a in s) for a in dict.fromkeys(names)}
