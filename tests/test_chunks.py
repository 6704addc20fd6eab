import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardload.errors import ConfigError
from shardload.plan.chunks import (
    chunk_sizes,
    plan_blocks,
    plan_chunk_bounds,
    plan_chunk_rows,
    plan_splits,
)


@given(st.integers(0, 10_000), st.integers(1, 999))
def test_bounds_cover_length_with_short_last_chunk(length, rows):
    b = plan_chunk_bounds(length, rows)
    assert b[0] == 0 and b[-1] == length
    sizes = chunk_sizes(b)
    assert (sizes[:-1] == rows).all() and (len(sizes) == 0 or 0 < sizes[-1] <= rows)


@given(st.integers(1, 10_000), st.integers(1, 200), st.integers(1, 9))
def test_blocks_group_whole_chunks(length, rows, k):
    b = plan_chunk_bounds(length, rows)
    blocks = plan_blocks(b, k)
    assert set(blocks) <= set(b) and blocks[-1] == length
    assert all(b.index(blocks[i + 1]) - b.index(blocks[i]) <= k for i in range(len(blocks) - 1))


def test_chunk_rows_from_bytes():
    assert plan_chunk_rows(1000, length=10**6, target_bytes=16_000) == 16
    assert plan_chunk_rows(10**9, length=5) == 1
    with pytest.raises(ConfigError):
        plan_chunk_rows(0, length=5)


@given(st.integers(1, 300), st.integers(0, 2**31))
def test_splits_partition_chunks(n, seed):
    s = plan_splits(n, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=seed)
    ids = sorted(i for v in s.values() for i in v)
    assert ids == list(range(n))
    if n >= 3:
        assert all(len(v) >= 1 for v in s.values())
    assert s == plan_splits(n, {"train": 0.8, "val": 0.1, "test": 0.1}, seed=seed)


def test_splits_bad_fractions():
    with pytest.raises(ConfigError, match="sum"):
        plan_splits(10, {"train": 0.9, "val": 0.5})
    with pytest.raises(ConfigError):
        plan_splits(10, {"train": -1})


@pytest.mark.parametrize("length", [1, 7, 50, 333])
@pytest.mark.parametrize("group_rows", [1, 3])
@pytest.mark.parametrize("gap", [0, 2])
def test_row_splits_are_ordered_disjoint_and_follow_fractions(length, group_rows, gap):
    from shardload.errors import ConfigError
    from shardload.plan.chunks import plan_row_splits

    fr = {"train": 0.7, "val": 0.2, "test": 0.1}
    try:
        s = plan_row_splits(length, fr, group_rows=group_rows, gap_groups=gap)
    except ConfigError as exc:
        assert "would be empty" in str(exc)
        assert length // group_rows - 2 * gap < 3  # only when there is truly too little
        return
    ranges = list(s.values())
    for (a0, b0), (a1, b1) in itertools.pairwise(ranges):
        assert a0 < b0 <= a1 < b1 and a1 - b0 == gap * group_rows  # ordered, gap exactly
    for a, b in ranges:
        assert a % group_rows == 0 and b % group_rows == 0 and b <= length
    usable = length // group_rows - 2 * gap
    for n, (a, b) in s.items():
        assert abs((b - a) / group_rows - fr[n] * usable) < 1 + 1e-9 or b - a == group_rows
