"""The scatter reader's plan of a group's reads: sorted by segment, not by row
(load/scatter.py ``plan_span_reads``), the same runs as sorting every row."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import shardload
from _stores import check_values, make_store
from shardload.load import scatter
from shardload.load.scatter import plan_group_reads, plan_span_reads
from shardload.plan.spans import Spans, spans_chunks, spans_rows


def _random_spans(rng: np.random.Generator) -> tuple[Spans, np.ndarray]:
    """Non-overlapping range segments of a few chunks, in a random order; chunk bounds."""
    sizes = rng.integers(1, 40, rng.integers(1, 6))
    bounds = np.concatenate(([0], np.cumsum(sizes)))
    chunk, base, lo, hi = [], [], [], []
    for c, size in enumerate(sizes.tolist()):
        cuts = np.unique(np.concatenate(([0, size], rng.integers(0, size, rng.integers(0, 6)))))
        for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
            if rng.random() < 0.8:  # some pieces belong to other groups
                piece = int(rng.integers(a, b + 1))  # base: a piece start, lo: inside it
                chunk.append(c), base.append(bounds[c] + piece), lo.append(a - piece)
                hi.append(b - piece)
    if not chunk:
        chunk, base, lo, hi = [0], [0], [0], [1]
    perm = rng.permutation(len(chunk))
    cols = [np.asarray(v, np.int64)[perm] for v in (chunk, base, lo, hi)]
    return Spans(*cols, np.full(len(chunk), -1, np.int64)), bounds


@pytest.mark.parametrize("seed", range(200))
def test_segment_sort_plans_the_same_runs_as_the_row_sort(seed):
    rng = np.random.default_rng(seed)
    spans, bounds = _random_spans(rng)
    n = spans.num_rows
    order = rng.permutation(n)
    want = order[int(rng.integers(0, n // 2 + 1)) :] if seed % 3 == 0 else order
    want = want[: int(rng.integers(1, len(want) + 1))] if seed % 2 else want
    rows, chunks = spans_rows(spans)[want], spans_chunks(spans)[want]
    o1, s1, c1 = plan_group_reads(chunks, rows - bounds[chunks])
    o2, s2, c2, r2 = plan_span_reads(spans, want, bounds)
    assert o2.tolist() == o1.tolist() and s2.tolist() == s1.tolist()
    assert c2.tolist() == c1.tolist()
    assert r2.tolist() == (rows - bounds[chunks])[o1].tolist()


class _Sorts:
    """numpy, but for ``argsort`` / ``lexsort``, which record how many keys they sort."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def __getattr__(self, name: str):
        return getattr(np, name)

    def argsort(self, a, *args, **kw):
        self.sizes.append(len(a))
        return np.argsort(a, *args, **kw)

    def lexsort(self, keys, *args, **kw):
        self.sizes.append(len(keys[0]))
        return np.lexsort(keys, *args, **kw)


def test_the_scatter_planner_sorts_segments_not_rows(tmp_path, monkeypatch):
    """A default group of a raw store holds 256 small pieces and thousands of rows: planning
    its reads sorts the pieces (it sorted every row: one ``argsort`` of the group's rows)."""
    store = make_store(tmp_path, n=3000, chunk_rows=500)
    sorts = _Sorts()
    monkeypatch.setattr(scatter, "np", sorts)
    batches = list(shardload.iter_batches(store, batch_size=64, epoch=1))
    for b in batches:
        check_values(store, b)
    assert sorted(np.concatenate([b["index"] for b in batches]).tolist()) == list(range(3000))
    assert sorts.sizes and max(sorts.sizes) <= 512, sorts.sizes  # pieces, not 3,000 rows


def test_a_read_task_through_the_page_cache_costs_few_python_calls(tmp_path, monkeypatch):
    """A default epoch of the raw store is 38 read tasks of ~120 io_uring entries each: a task
    whose runs each fit one call takes each run's bytes from its own iovecs (no sum over the
    whole group's, no per-call tables), and reads the iovecs' address without ``.ctypes``:
    at most 90 Python and C calls a task that opens no chunk file (116 before, counted by
    ``sys.setprofile``)."""
    import sys
    import threading

    from shardload.load import files, uring

    if uring.thread_ring() is None:
        pytest.skip("io_uring is not usable here: each run is one preadv, a call each")
    store = make_store(tmp_path, n=3000, chunk_rows=500)
    counts: list[int] = []
    real, real_open = scatter.read_runs, files._open_sized
    opened = threading.local()

    def counted_open(*args):
        opened.any = True
        return real_open(*args)

    def counted(*args):
        n = [0]

        def prof(frame, event, arg):
            if event in ("call", "c_call"):
                n[0] += 1

        opened.any = False
        sys.setprofile(prof)
        try:
            return real(*args)
        finally:
            sys.setprofile(None)
            if not opened.any:  # a chunk's first use this epoch opens and checks its file
                counts.append(n[0])

    monkeypatch.setattr(scatter, "read_runs", counted)
    monkeypatch.setattr(files, "_open_sized", counted_open)
    # no collection inside a counted task: one runs other objects' finalizers in that thread
    # (a long-lived xdist worker once counted [98, 72, 72, 72])
    gc.disable()
    try:
        batches = list(shardload.iter_batches(store, batch_size=64, epoch=1, threads=2))
    finally:
        gc.enable()
    for b in batches:
        check_values(store, b)
    assert sorted(np.concatenate([b["index"] for b in batches]).tolist()) == list(range(3000))
    # the typical task (the median) within 90; one task that meets a contended lock counts the
    # waiting's calls too (a loaded fresh-clone CI worker once counted [77, 77, 103, 77]), so
    # a single task may take more, never the 116+ a task took before
    assert counts and sorted(counts)[len(counts) // 2] <= 90 and max(counts) <= 150, counts
