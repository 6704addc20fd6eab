"""A first epoch by URL asks for the first shards it checks as soon as it is planned
(``formats/zarr/ahead.py``; issues 25 and 28): before, each shard's whole GET waited for the
call reading the first group's chunks of it, built after the group's buffer and spans.

Counted at ``shardload serve``'s access log (tests/test_url_shard_fetch.py's store and proxy):
the first group's read is held until the server has answered the GETs started ahead, so their
bytes arrive before any call takes them; each shard is still fetched once, checked before any
row of it is used, and the batches are those read from the folder."""

from __future__ import annotations

import time

import pytest

import shardload
from shardload.errors import ChunkReadError
from shardload.formats.zarr import shard_fetch
from shardload.formats.zarr.ahead import AHEAD_SHARDS
from test_url_shard_fetch import KW, SHARDS, data_requests, epoch, served_url, sharded

__all__ = ["sharded"]  # the fixture, used by name

pytestmark = pytest.mark.timeout(120)


def hold_first_read(monkeypatch, seen, wait_s: float) -> list[int]:
    """Hold each group's first read until the server answered ``AHEAD_SHARDS`` whole shard
    GETs (at most ``wait_s``); the number answered by then, per read."""
    answered: list[int] = []
    read = shard_fetch.read_url_shards

    def held(*args, **kw):
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if sum(data_requests(seen).values()) >= AHEAD_SHARDS:
                break
            time.sleep(0.01)
        answered.append(sum(data_requests(seen).values()))
        return read(*args, **kw)

    monkeypatch.setattr(shard_fetch, "read_url_shards", held)
    return answered


def test_first_shards_are_asked_for_before_the_first_group_is_read(sharded, monkeypatch) -> None:
    """The first ``AHEAD_SHARDS`` shards come without any group's read asking (before: none
    until a read did, so the first read waited in vain); taken later, they are not fetched
    again: each shard once, whole, and the same batches."""
    root, local = sharded
    with served_url(root) as (url, seen):
        answered = hold_first_read(monkeypatch, seen, wait_s=5.0)
        epoch(url, local)
    assert answered and answered[0] == AHEAD_SHARDS, answered
    count = data_requests(seen)
    assert sorted(s for _, s in count) == [200] * (2 * SHARDS), count
    assert set(count.values()) == {1}, count


def test_a_corrupt_shard_fetched_ahead_is_named_before_any_batch(sharded, monkeypatch) -> None:
    """Every shard of ``x`` damaged: the first shards, fetched ahead and arrived before any
    read asked, are compared with their checksums before use; no batch is served."""
    root, _ = sharded
    for path in (root / "store" / "x" / "c").rglob("*"):
        if path.is_file():
            data = bytearray(path.read_bytes())
            data[100] ^= 0xFF
            path.write_bytes(bytes(data))
    corrupt = pytest.raises(ChunkReadError, match=r"shard \d of array 'x' is corrupt")
    with served_url(root) as (url, seen):
        hold_first_read(monkeypatch, seen, wait_s=5.0)
        batches = shardload.iter_batches(url, **KW)
        with corrupt:
            next(iter(batches))
