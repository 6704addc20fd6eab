"""By URL, the first batch comes once the first shuffle group is read (issue 25): a store by
URL has ``URL_IN_FLIGHT`` (32) read threads for its round trips, and the gather reader held
back as many finished batches as it had gather threads, one per read thread: a group of up to
32 batches yielded its first only once the next group was read (the default store by URL: the
first batch at the end of its first epoch). The gathers now run in at most the process's CPUs
(``load/options.py::gather_threads``), and so many batches are held back."""

from __future__ import annotations

import numpy as np
import pytest

import shardload
import shardload.load.options as options
from _stores import make_store
from shardload.load.decoded import DecodeReader
from shardload.load.gather import GatherReader
from test_url_shard_fetch import KW, served_url

pytestmark = pytest.mark.timeout(120)


def test_the_first_batch_by_url_waits_for_the_first_group_only(tmp_path, monkeypatch) -> None:
    """8 groups of 4 batches, a process of 2 CPUs: batch 0 is yielded after the loop waited
    for group 0 alone (before: for every group, 33 batches held back); the batches are the
    folder's."""
    monkeypatch.setattr(options, "_cores", lambda: 2)
    store = make_store(
        tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32
    )
    local = [b["index"] for b in shardload.iter_batches(store, **KW)]
    waited: list[int] = []
    # the gather reader, or the decode reader where the compiled kernel is built (by URL too)
    for cls in (GatherReader, DecodeReader):

        def wait(self, flight, real=cls.wait):  # type: ignore[no-untyped-def]
            waited.append(flight.at)
            return real(self, flight)

        monkeypatch.setattr(cls, "wait", wait)
    with served_url(tmp_path) as (url, _seen):
        batches = iter(shardload.iter_batches(url, **KW))
        got = [next(batches)]
        before_first = list(waited)
        got += list(batches)
    assert before_first == [0], before_first
    assert len(waited) == len(local) // 4  # (every group waited for, in the end)
    assert len(got) == len(local)
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))
