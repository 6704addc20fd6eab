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
"""

from __future__ import annotations

from collections.abc import Mapping

from shardload.errors import PlanError

__all__ = [
    "ReadGroupAxis",
    "RowSlice",
    "check_read_group_size",
    "member_slice",
    "plan_row_slices",
    "split_rank",
]

#: The axis a read group splits: an axis of a row (``row_shape``; negative counts from the end)
#: for every selected array, or per array name (``None``: that array is read whole by every rank
#: of a group).
ReadGroupAxis = int | Mapping[str, int | None]

#: One array's slice: ``(axis of the row, start, stop)``, the axis made non-negative.
RowSlice = tuple[int, int, int]


def check_read_group_size(read_group_size: object) -> int:
    """``read_group_size`` as a positive int, or a :class:`PlanError` naming the option."""
    if isinstance(read_group_size, bool) or not isinstance(read_group_size, int):
        raise PlanError(f"read_group_size={read_group_size!r} must be a positive integer")
    if read_group_size < 1:
        raise PlanError(f"read_group_size={read_group_size} must be at least 1")
    return read_group_size


def split_rank(rank: int, world_size: int, read_group_size: int) -> tuple[int, int, int]:
    """``(group, groups, member)`` of ``rank``: its data-parallel rank and world in the epoch
    plan, and its place in its group (consecutive ranks share a group)."""
    g = check_read_group_size(read_group_size)
    if world_size % g:
        raise PlanError(
            f"read_group_size={g} does not divide world_size={world_size}: the ranks are cut "
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
    axis: ReadGroupAxis = -1,
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
