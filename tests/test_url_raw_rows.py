"""By URL, shards of raw inner chunks (the default layout of values lz4 does not shrink) copied
straight into their batches from each shard's checked bytes (formats/zarr/url_rows.py, issues
25 and 28): no group buffer and no gather pass, as shards of Blosc inner chunks by URL
(tests/test_url_decode_rows.py); the batches byte for byte the local read's and the gather
reader's (what an install without the compiled kernel reads); a chunk of another size than its
rows' left to the URL path, which names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.formats.zarr import url_rows
from shardload.move.serve import serving
from test_decode_rows import _counting, _kernel
from test_url_raw_shards import raw_sharded  # noqa: F401 (the fixture)
from test_url_shard_fetch import KW

pytestmark = pytest.mark.timeout(120)


def _copies(mod: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Chunks the kernel's ``copy_rows_buf`` was asked for, and chunks whose rows were copied
    from a staging buffer instead (``RowSink.copy_rest``)."""
    seen = {"kernel": 0, "staged": 0}
    real, real_rest = mod.KERNEL, url_rows.RowSink.copy_rest

    class Counted:
        def __getattr__(self, name: str) -> Any:
            return getattr(real, name)

        def copy_rows_buf(self, *a: Any) -> int:
            seen["kernel"] += a[5] - a[4]
            return int(real.copy_rows_buf(*a))

    def rest(self: Any, staging: np.ndarray) -> None:
        seen["staged"] += int((~self.served).sum())
        real_rest(self, staging)

    monkeypatch.setattr(mod, "KERNEL", Counted())
    monkeypatch.setattr(url_rows.RowSink, "copy_rest", rest)
    return seen


def _epoch(store: Any, epoch: int = 0, **kw: Any) -> list[dict[str, np.ndarray]]:
    it = shardload.iter_batches(store, epoch=epoch, **{**KW, **kw})
    return [{k: np.array(v) for k, v in b.items()} for b in it]


def _same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k])


@pytest.mark.parametrize("options", [{}, {"shuffle_chunks": 128}], ids=["groups", "one-group"])
def test_raw_shards_by_url_are_copied_into_the_batches(
    raw_sharded: tuple[Path, Any],  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    options: dict,
) -> None:
    """A first and a later epoch of one opened store by URL: no group buffer taken and no
    gather run (before: both, every row copied into a group buffer and out of it again); in
    the first, each chunk of x and y copied by the kernel once, none through a staging
    buffer: from its shard's checked bytes, or (groups) from its bytes kept from an earlier
    group's request (before: copied into staging, then row by row into place); the batches
    those of the local read and of the gather reader."""
    mod = _kernel()
    root, _ = raw_sharded
    local = shardload.open_store(root / "store")
    want = [_epoch(local, e, **options) for e in (0, 1)]
    with serving(root) as base:
        seen = _counting(monkeypatch)
        copies = _copies(mod, monkeypatch)
        store = shardload.open_store(f"{base}store")
        layout = store.reader.layout("x")
        assert layout is not None and layout.shard is not None and not layout.blosc
        got = [_epoch(store, 0, **options)]
        n = sum(len(b["index"]) for b in want[0])
        chunks = 2 * -(-n // layout.chunk_rows)  # of x and y
        assert copies == {"kernel": chunks, "staged": 0}, copies
        got.append(_epoch(store, 1, **options))
        assert seen == {"buffers": 0, "gathers": 0}
        monkeypatch.setattr(mod, "KERNEL", None)
        gathered = shardload.open_store(f"{base}store")
        by_gather = [_epoch(gathered, e, **options) for e in (0, 1)]
    assert seen["buffers"] and seen["gathers"]
    for e in (0, 1):
        _same(got[e], want[e])
        _same(by_gather[e], want[e])


def test_a_raw_chunk_of_another_size_is_left_to_the_url_path(
    raw_sharded: tuple[Path, Any],  # noqa: F811
) -> None:
    """``RowSink.decode`` of a raw shard: a chunk whose index entry is not exactly its rows'
    bytes, or lies past the shard's bytes, is left (unwritten) to the URL path, which names it
    corrupt or truncated (tests/test_url_raw_shards.py); the others' rows copied in place."""
    _kernel()
    root, _ = raw_sharded
    layout = shardload.open_store(root / "store").reader.layout("x")
    assert layout is not None and layout.shard is not None and not layout.blosc
    rows, rb = layout.chunk_rows, layout.row_bytes
    full = rows * rb
    data = np.arange(4 * full, dtype=np.uint32).view(np.uint8)[: 4 * full].copy()
    index = np.array([[0, full], [full, full - 4], [2 * full, full], [4 * full - 8, full]])
    out = np.zeros((4, full), np.uint8)
    dst = (out.ctypes.data + np.arange(4)[:, None] * full + np.arange(rows) * rb).astype("u8")
    dst[2, 1] = 0  # a row nobody asked for
    sink = url_rows.RowSink(layout, np.arange(4), dst)
    pieces = [(j, 0, rows, memoryview(bytearray(full))) for j in range(4)]
    left = sink.decode(0, pieces, memoryview(data), index.astype(np.uint64))
    assert [p[0] for p in left] == [1, 3]
    assert sink.served.tolist() == [True, False, True, False]
    assert out[0].tolist() == data[:full].tolist()
    assert out[2, :rb].tolist() == data[2 * full : 2 * full + rb].tolist()
    assert not out[2, rb : 2 * rb].any()
    assert out[2, 2 * rb :].tolist() == data[2 * full + 2 * rb : 3 * full].tolist()
    assert not out[1].any() and not out[3].any()
