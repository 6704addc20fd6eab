"""Read groups for model parallelism: which data-parallel group a rank is in, and which slice
of a row's grid (or ensemble) axis it reads (pure: no I/O, no torch).

The ranks of a world are cut into groups of ``read_group_size`` (G) consecutive ranks, as
anemoi-training cuts them for model parallelism: the G ranks of a group shard one model over a
sample's grid, so they read the *same samples in the same order*, each only its slice of the
grid axis. The epoch is planned over the ``world_size // G`` groups (a group is one
"data-parallel rank" of the epoch plan); member ``m`` of a group reads the ``m``-th of the G
slices that ``np.array_split`` cuts the axis into.

>>> split_rank(5, 8, 2)  # rank 5 of 8 in groups of 2: group 2 of 4, member 1
(2, 4, 1)
>>> [member_slice(10, 3, m) for m in range(3)]  # as np.array_split(np.arange(10), 3)
[(0, 4), (4, 7), (7, 10)]
>>> plan_row_slices({"data": (3, 2, 10), "w": (10,)}, read_group_size=2, member=1)
{'data': (2, 5, 10), 'w': (0, 5, 10)}
>>> plan_row_slices({"data": (3, 4, 10)}, read_group_size=2, member=0, axis={"data": 1})
{'data': (1, 0, 2)}

Two levels (anemoi spreads ensemble members over ranks *and* splits the grid within a
model-parallel group): ``read_group_size=(E, G)`` with ``read_group_axis=(members_axis,
grid_axis)`` makes groups of ``E * G`` consecutive ranks; member ``m`` of a group reads member
slice ``m // G`` of ``E`` and grid slice ``m % G`` of ``G`` (outermost level first, as
``np.unravel_index``):

>>> split_rank(5, 8, (2, 2))  # groups of 4: group 1 of 2, member 1
(1, 2, 1)
>>> plan_level_slices({"data": (3, 4, 10)}, read_group_size=(2, 2), member=1, axis=(1, -1))
({'data': (1, 0, 2)}, {'data': (2, 5, 10)})
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from shardload.errors import PlanError

__all__ = [
    "LevelAxis",
    "ReadGroupAxis",
    "ReadGroupSize",
    "RowSlice",
    "check_read_group_size",
    "member_slice",
    "plan_level_slices",
    "plan_row_slices",
    "read_group_levels",
    "split_rank",
]

#: The axis one level of read groups splits: an axis of a row (``row_shape``; negative counts
#: from the end) for every selected array, or per array name (``None``: that array is read whole
#: by every rank of a group).
LevelAxis = int | Mapping[str, int | None]
#: ``read_group_axis``: one level's axis, or a tuple of them, one per level of the size.
ReadGroupAxis = LevelAxis | tuple[LevelAxis, ...]
#: ``read_group_size``: ranks a group (one level), or a tuple of levels, outermost first.
ReadGroupSize = int | tuple[int, ...]

#: One array's slice: ``(axis of the row, start, stop)``, the axis made non-negative.
RowSlice = tuple[int, int, int]


def read_group_levels(read_group_size: object) -> tuple[int, ...]:
    """The levels of ``read_group_size`` (an int: one level; a tuple or list of positive ints,
    outermost first), or a :class:`PlanError` naming the option."""
    levels = read_group_size if isinstance(read_group_size, (tuple, list)) else (read_group_size,)
    if not levels:
        raise PlanError("read_group_size=() has no level: give an int, or (E, G)")
    for g in levels:
        if isinstance(g, bool) or not isinstance(g, int):
            raise PlanError(f"read_group_size={read_group_size!r} must be a positive integer")
        if g < 1:
            raise PlanError(f"read_group_size={read_group_size} must be at least 1")
    return tuple(levels)


def check_read_group_size(read_group_size: object) -> int:
    """The ranks of a group ``read_group_size`` makes (the product of its levels), or a
    :class:`PlanError` naming the option."""
    return math.prod(read_group_levels(read_group_size))


def split_rank(rank: int, world_size: int, read_group_size: ReadGroupSize) -> tuple[int, int, int]:
    """``(group, groups, member)`` of ``rank``: its data-parallel rank and world in the epoch
    plan, and its place in its group (consecutive ranks share a group; with several levels,
    ``member`` counts over all of them)."""
    g = check_read_group_size(read_group_size)
    if world_size % g:
        said = f"{g}" if isinstance(read_group_size, int) else f"{read_group_size!r} ({g} ranks)"
        raise PlanError(
            f"read_group_size={said} does not divide world_size={world_size}: the ranks are cut "
            f"into groups of {g} consecutive ranks, so the world must be a multiple of it"
        )
    if not 0 <= rank < world_size:
        raise PlanError(f"rank={rank} is not within 0..{world_size - 1}")
    return rank // g, world_size // g, rank % g


def member_slice(length: int, parts: int, member: int) -> tuple[int, int]:
    """``[start, stop)`` of part ``member`` of ``parts`` of an axis of ``length``, as
    ``np.array_split`` cuts it (the first ``length % parts`` parts one longer)."""
    q, r = divmod(length, parts)
    start = member * q + min(member, r)
    return start, start + q + (member < r)


def plan_row_slices(
    row_shapes: Mapping[str, tuple[int, ...]],
    *,
    read_group_size: int,
    member: int,
    axis: LevelAxis = -1,
) -> dict[str, RowSlice]:
    """The slice each array's rows are read with by ``member`` of a read group; arrays left
    whole (``axis`` maps them to None) are not listed. Checks every array (any member)."""
    g = check_read_group_size(read_group_size)
    if not 0 <= member < g:
        raise PlanError(f"read group member {member} is not within 0..{g - 1}")
    if isinstance(axis, Mapping):
        unknown = sorted(set(axis) - set(row_shapes))
        if unknown:
            raise PlanError(
                f"read_group_axis names arrays {unknown} that are not selected; selected: "
                f"{sorted(row_shapes)}"
            )
        wanted = {n: axis.get(n) for n in row_shapes}
    else:
        wanted = {n: axis for n in row_shapes}
    out: dict[str, RowSlice] = {}
    for name, ax in wanted.items():
        if ax is None:
            continue
        shape = tuple(row_shapes[name])
        if isinstance(ax, bool) or not isinstance(ax, int) or not -len(shape) <= ax < len(shape):
            raise PlanError(
                f"read_group_axis={ax!r} is not an axis of a row of array {name!r} (row shape "
                f"{shape}: axes 0..{len(shape) - 1}, or -1 for the last)"
            )
        a = ax % len(shape)
        if shape[a] < g:
            raise PlanError(
                f"read_group_size={g} is larger than axis {a} of array {name!r} (row shape "
                f"{shape}): each rank of a read group needs at least one element of it"
            )
        out[name] = (a, *member_slice(shape[a], g, member))
    return out


def plan_level_slices(
    row_shapes: Mapping[str, tuple[int, ...]],
    *,
    read_group_size: ReadGroupSize,
    member: int,
    axis: ReadGroupAxis = -1,
) -> tuple[dict[str, RowSlice], ...]:
    """The slices ``member`` of a read group reads, one dict per level of ``read_group_size``
    (:func:`plan_row_slices` of each level; the ``k``-th level's member is the ``k``-th digit
    of ``member`` in the levels' mixed radix). Every level on its own axis of an array (one
    axis cut twice is refused, naming it); checks every array (any member)."""
    levels = read_group_levels(read_group_size)
    total = math.prod(levels)
    if not 0 <= member < total:
        raise PlanError(f"read group member {member} is not within 0..{total - 1}")
    axes = _level_axes(axis, levels)
    digits = []
    for g in reversed(levels):
        member, digit = divmod(member, g)
        digits.append(digit)
    out = tuple(
        plan_row_slices(row_shapes, read_group_size=g, member=d, axis=ax)
        for g, d, ax in zip(levels, reversed(digits), axes, strict=True)
    )
    for name in row_shapes:
        cut = [sl[name][0] for sl in out if name in sl]
        if len(cut) != len(set(cut)):
            raise PlanError(
                f"read_group_axis={axis!r} cuts axis {cut[0]} of array {name!r} at two levels "
                f"of read_group_size={read_group_size!r}: give each level its own axis"
            )
    return out


def _level_axes(axis: ReadGroupAxis, levels: tuple[int, ...]) -> tuple[LevelAxis, ...]:
    """One axis per level: ``axis`` as given for one level, a tuple of as many for several."""
    if isinstance(axis, (tuple, list)):
        if len(axis) != len(levels):
            raise PlanError(
                f"read_group_axis={axis!r} gives {len(axis)} axes for the {len(levels)} "
                f"level(s) of read_group_size={levels if len(levels) > 1 else levels[0]!r}: "
                "give one axis per level"
            )
        return tuple(axis)
    if len(levels) > 1:
        raise PlanError(
            f"read_group_size={levels!r} has {len(levels)} levels: read_group_axis must give one "
            f"axis per level, e.g. (1, -1) (members along axis 1 of a row, then the cells along "
            f"the last), not {axis!r}"
        )
    return (axis,)
