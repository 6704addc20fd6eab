"""Bad ``allocate`` arrays and bad group indices raise before any write (issue 12, item 7).

Before: the scatter reader took the pointers of whatever ``allocate`` returned and wrote rows
through them (``free(): invalid size``, the process aborted, or a transposed array got garbage),
and the gather path cast to the wrong dtype or clipped an out-of-range index to an edge row.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

import shardload
from _stores import check_values, make_store
from shardload.errors import PlanError
from shardload.load import gather as gather_mod
from shardload.load import kinds as kinds_mod
from shardload.load import scatter as scatter_mod


@pytest.fixture(scope="module")
def npy(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("checks"), n=120, chunk_rows=10)


def _bad(kind: str, n: int) -> dict[str, np.ndarray]:
    out = {
        "x": np.empty((n, 4), np.float32),
        "y": np.empty((n, 1), np.int64),
        "index": np.empty(n, np.int64),
    }
    if kind == "dtype":
        out["x"] = np.empty((n, 4), np.float16)
    elif kind == "shape":
        out["x"] = np.empty((max(1, n // 2), 4), np.float32)
    elif kind == "rowshape":
        out["x"] = np.empty((n, 5), np.float32)
    elif kind == "layout":
        out["x"] = np.empty((4, n), np.float32).T
    elif kind == "readonly":
        out["x"].flags.writeable = False
    elif kind == "missing":
        del out["x"]
    elif kind == "list":
        out["x"] = [[0.0] * 4] * n  # type: ignore[assignment]
    return out


@pytest.fixture(params=["scatter", "gather"])
def path(request, monkeypatch):
    if request.param == "gather":
        monkeypatch.setattr(kinds_mod, "raw_sources", lambda *a: None)
    return request.param


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("dtype", "dtype float16"),
        ("shape", r"shape \(16, 4\)"),
        ("rowshape", r"shape \(32, 5\)"),
        ("layout", "non-C-contiguous"),
        ("readonly", "read-only"),
        ("missing", "no array 'x'"),
        ("list", "is a list"),
    ],
)
def test_bad_allocate_arrays_raise_naming_the_array(npy, path, kind, said):
    with pytest.raises(PlanError, match=said) as err:
        for _ in shardload.iter_batches(npy, batch_size=32, allocate=lambda n: _bad(kind, n)):
            pass
    assert "allocate(32)" in str(err.value) and "'x'" in str(err.value)


def test_good_allocate_arrays_are_used(npy, path):
    given: list[int] = []

    def alloc(n: int) -> dict[str, np.ndarray]:
        out = _bad("none", n)
        given.append(out["x"].ctypes.data)
        return out

    for b in shardload.iter_batches(npy, batch_size=32, allocate=alloc):
        assert b["x"].ctypes.data in given
        check_values(npy, b)


@pytest.mark.parametrize("bad", [-1, "size"])
def test_a_group_index_out_of_range_raises(npy, path, monkeypatch, bad):
    """A planning bug that put an index outside its group is an error on both read paths (the
    gather clips and the scatter wraps negative indices: both served wrong rows silently)."""
    real_spans = scatter_mod.iter_worker_spans

    def broken_spans(*args) -> Iterator:  # both paths plan from spans
        for spans, order in real_spans(*args):
            order = order.copy()
            order[len(order) // 2] = -1 if bad == -1 else int(spans.cum[-1])
            yield spans, order

    monkeypatch.setattr(gather_mod, "iter_worker_spans", broken_spans)
    monkeypatch.setattr(scatter_mod, "iter_worker_spans", broken_spans)
    with pytest.raises(PlanError, match="group's order"):
        for _ in shardload.iter_batches(npy, batch_size=8):
            pass
