"""Opening a store costs the same Python work whatever its chunk count: ``iter_batches(path)``
opens it every epoch, before any read starts, and the default layout has thousands of small
inner chunks (8,192 in the 406 MB store of benchmarks/bench_default_layout.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import shardload
from _stores import make_store

pytest.importorskip("zarr")


def _python_events(fn) -> int:  # type: ignore[no-untyped-def]
    """Python calls (function calls, generator steps and the C functions called from Python)
    made while ``fn`` runs, in any code."""
    seen = [0]

    def prof(frame, event, arg):  # type: ignore[no-untyped-def]
        if event in ("call", "c_call"):
            seen[0] += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return seen[0]


def _open_cost(root: Path) -> int:
    def open_and_plan() -> None:
        store = shardload.open_store(root)
        store.reader.layout("x")  # type: ignore[attr-defined]  # the chunk layout, checked
        store.close()

    open_and_plan()  # imports and caches of a first open
    return _python_events(open_and_plan)


def test_opening_a_store_costs_the_same_for_many_chunks(tmp_path):
    """A manifest's chunk bounds and splits are read and checked in numpy (or ``map``): the
    calls of an open do not grow with the chunks (per chunk before: a generator step of
    ``from_dict``, a ``min`` of the layout's check, a comparison of the consistency check)."""
    kw = {
        "fmt": "zarr",
        "compression": "lz4",
        "chunk_rows": 2,
        "splits": {"train": 0.8, "val": 0.2},
    }
    few = make_store(tmp_path, n=40, name="few", **kw)  # 20 chunks
    many = make_store(tmp_path, n=2000, name="many", **kw)  # 1,000 chunks
    assert many.manifest.num_chunks >= 50 * few.manifest.num_chunks
    cost_few, cost_many = _open_cost(Path(few.url)), _open_cost(Path(many.url))
    assert cost_many <= cost_few + 50, (cost_few, cost_many)
