"""How a combined store (``shardload.join`` / ``concat`` / ``select``) reads: straight into the
loader's buffer through each store's reader (no temporary, no second copy), and several spans
of a store in one call of its reader where it takes several (a sharded Zarr store opens each
shard once a call). Before, every read allocated the rows and copied them twice, and a join
loaded windows at 0.65 of the single store's speed (benchmarks/bench_combined.py)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

import shardload
from dated_fixtures import START, dated_store, set_time_axis

H6 = np.timedelta64(6, "h")


@pytest.fixture(scope="module")
def st(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("combine-reads")
    big = {"grid": (32, 64), "splits": {"all": 1.0}}  # 16 KB a row of x
    a = dated_store(tmp, n=40, missing=(3,), name="a", **big)
    dated_store(tmp, n=12, name="b", chunk_rows=4, **big)
    b = set_time_axis(tmp / "b", start=START + 40 * H6, missing=())  # right after a
    z = {"fmt": "zarr", "compression": "zstd", "shard_chunks": 4, "chunk_rows": 1, **big}
    dated_store(tmp, n=20, name="s", **z)
    s = set_time_axis(tmp / "s", start=START, missing=())
    dated_store(tmp, n=20, name="t", **z)
    t = set_time_axis(tmp / "t", start=START + 20 * H6, missing=())
    dated_store(tmp, n=12, name="g", chunk_rows=4, **big)
    g = set_time_axis(tmp / "g", start=START + 43 * H6, missing=())  # 3 dates after a
    return {"a": a, "b": b, "s": s, "t": t, "g": g}


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[1] - before
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("how", ["join", "concat"])
def test_read_into_fills_the_callers_buffer_without_a_temporary(st, how):
    a, b = st["a"], st["b"]
    if how == "join":
        c = shardload.join(a, shardload.select(a, rename={"x": "x2", "y": "y2"}))
        name, lo, want = "x2", 5, a.read("x", 5, 37)
    else:
        c = shardload.concat(a, b)
        name, lo, want = "x", 20, np.concatenate([a.read("x", 20, 40), b.read("x", 0, 12)])
    out = np.empty_like(want)
    c.reader.read_into(name, lo, lo + len(want), out)  # warm: files opened, headers read
    out[...] = 0
    peak = _peak_bytes(lambda: c.reader.read_into(name, lo, lo + len(want), out))
    assert peak < want.nbytes // 8, (peak, want.nbytes)
    np.testing.assert_array_equal(out, want)


def test_spans_of_each_sharded_store_in_one_call(st, monkeypatch):
    s, t = st["s"], st["t"]
    c = shardload.concat(s, t)
    calls: list[tuple[str, int]] = []
    for part, label in ((s, "s"), (t, "t")):
        reader = part.reader
        base = reader.read_spans_into

        def counted(name, spans, outs, _base=base, _label=label):
            calls.append((_label, len(spans)))
            return _base(name, spans, outs)

        monkeypatch.setattr(reader, "read_spans_into", counted)
    spans = [(1, 3), (5, 6), (18, 22), (30, 33)]  # two in s, one across the seam, one in t
    outs = [np.empty((b - a, *c.manifest.arrays["x"].row_shape), np.float32) for a, b in spans]
    c.reader.read_spans_into("x", spans, outs)
    assert sorted(calls) == [("s", 3), ("t", 2)]  # each store's runs in one call
    full = np.concatenate([s.read("x", 0, 20), t.read("x", 0, 20)])
    for (a, b), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, full[a:b])


def test_gaps_and_strided_pieces_among_spans(st):
    """A concat with a gap of missing dates and a 12-hourly selection of it: NaN in the gap,
    every other row elsewhere, through the spans path as through plain reads."""
    a, late = st["a"], st["g"]
    c = shardload.concat(a, late)  # rows 40..42 a gap
    s = shardload.select(c, frequency="12h")
    full = np.concatenate([a.read("x", 0, 40), np.full((3, *a.read("x", 0, 1).shape[1:]), np.nan)])
    full = np.concatenate([full, late.read("x", 0, 12)]).astype(np.float32)
    spans = [(0, 4), (18, 23), (25, 27)]
    outs = [np.empty((q - p, *s.manifest.arrays["x"].row_shape), np.float32) for p, q in spans]
    s.reader.read_spans_into("x", spans, outs)
    for (p, q), out in zip(spans, outs, strict=True):
        np.testing.assert_array_equal(out, full[::2][p:q])
        np.testing.assert_array_equal(out, s.read("x", p, q))
