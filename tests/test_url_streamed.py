"""A shard fetched ahead for its check, decoded while its bytes arrive
(``formats/zarr/streamed.py``; issues 25 and 28): the call that checks it decodes its pieces
as the GET brings them, and what it decoded stands only once the whole shard's digest matched,
from that very buffer, by an index equal to the checked bytes' own; else every piece is decoded
again from the checked bytes, and a damaged shard is named, never served. The stores here are
small: the size from which shards are decoded as they arrive is lowered to 0, and the GET reads
its answer in pieces of 4 KiB."""

from __future__ import annotations

import numpy as np
import pytest

import shardload
import shardload.formats.zarr.shard_fetch as shard_fetch
import shardload.move.http_get as http_get
from _stores import make_store
from shardload.errors import ChunkReadError
from test_url_shard_fetch import KW, served_url

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def streamed(tmp_path, monkeypatch):
    """A sharded lz4 store, its epoch read from the folder, every shard decoded as it arrives;
    the shards whose decode as they arrived stood, and the shards decoded from checked bytes."""
    store = make_store(
        tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32
    )
    local = [b["index"] for b in shardload.iter_batches(store, **KW)]
    monkeypatch.setattr(http_get, "PIECE_BYTES", 4096)
    stood: list[tuple[str, int]] = []
    whole: list[tuple[str, int]] = []
    try:
        import shardload.formats.zarr.streamed as streamed_mod
    except ImportError:  # (the code before: no such module)
        streamed_mod = None
    if streamed_mod is not None:
        monkeypatch.setattr(streamed_mod, "STREAM_MIN_BYTES", 0)
        real_from = streamed_mod.decoded_from

        def counted(early, data, index):  # type: ignore[no-untyped-def]
            ok = real_from(early, data, index)
            if ok:
                stood.append((early is not None, len(index)))
            return ok

        monkeypatch.setattr(shard_fetch, "decoded_from", counted)
    real_whole = shard_fetch._from_whole

    def counted_whole(layout, name, k, *args):  # type: ignore[no-untyped-def]
        whole.append((name, k))
        return real_whole(layout, name, k, *args)

    monkeypatch.setattr(shard_fetch, "_from_whole", counted_whole)
    return tmp_path, local, stood, whole, streamed_mod


@pytest.fixture
def sized(monkeypatch) -> list[int]:
    """The shards whose GET ahead a checking call decoded from as it arrived (their sizes)."""
    from shardload.formats.zarr.ahead import Stream

    seen: list[int] = []
    real = Stream.size

    def size(self):  # type: ignore[no-untyped-def]
        got = real(self)
        seen.append(got)
        return got

    monkeypatch.setattr(Stream, "size", size)
    return seen


def epoch(url, local) -> None:
    got = list(shardload.iter_batches(url, **KW))
    assert len(got) == len(local)
    for b, want in zip(got, local, strict=True):
        np.testing.assert_array_equal(b["index"], want)
        np.testing.assert_array_equal(b["x"][:, 0], b["index"].astype("f4"))
        np.testing.assert_array_equal(b["y"][:, 0], b["index"] * 10)


def test_a_first_check_decodes_the_shard_fetched_ahead_as_it_arrives(streamed) -> None:
    """The shards fetched ahead (2 a worker and epoch) are decoded while they arrive, not
    again from the checked bytes; the batches are the folder's."""
    root, local, stood, whole, _ = streamed
    with served_url(root) as (url, _seen):
        epoch(url, local)
    assert len(stood) >= 2, (stood, whole)


def test_every_call_wanting_a_shard_fetched_ahead_decodes_it_as_it_arrives(
    streamed, monkeypatch
) -> None:
    """Two calls want a shard fetched ahead (the first group's and the group read ahead): each
    decodes its own pieces while the GET brings them and none decodes them again from the
    checked bytes after the check (before: the second waited for the first's check, holding
    the shard's lock, then decoded from the checked bytes, the epoch's tail). The GET ahead
    is held until two calls wait for its bytes (a few seconds at most: before, the second
    never came); one index request a shard, the batches the folder's."""
    import threading

    import shardload.formats.zarr.ahead as ahead_mod

    root, local, stood, whole, _ = streamed
    callers: dict[tuple[str, int], set[int]] = {}
    two: dict[tuple[str, int], threading.Event] = {}
    lock = threading.Lock()

    def event(name: str, k: int) -> threading.Event:
        with lock:
            return two.setdefault((name, k), threading.Event())

    real_decode = shard_fetch.decode_arriving

    def decode(layout, name, k, path, pieces, ahead, *rest):  # type: ignore[no-untyped-def]
        if ahead is not None and ahead.stream(name, k) is not None:
            with lock:
                callers.setdefault((name, k), set()).add(threading.get_ident())
                n = len(callers[(name, k)])
            if n >= 2:
                event(name, k).set()
        return real_decode(layout, name, k, path, pieces, ahead, *rest)

    real_fetch = ahead_mod._fetch

    def held(fut, fs, path, stop, stream):  # type: ignore[no-untyped-def]
        name, k = path.split("/store/")[1].split("/")[0], int(path.split("/c/")[1].split("/")[0])
        event(name, k).wait(5)
        return real_fetch(fut, fs, path, stop, stream)

    monkeypatch.setattr(shard_fetch, "decode_arriving", decode)
    monkeypatch.setattr(ahead_mod, "_fetch", held)
    with served_url(root) as (url, seen):
        epoch(url, local)
    ahead = set(callers)
    assert ahead and max(len(c) for c in callers.values()) >= 2, callers
    assert len(stood) == sum(len(c) for c in callers.values()), (stood, callers)
    assert not [w for w in whole if w in ahead], (whole, ahead)
    index_requests = [p for m, p, s in seen if m == "GET" and "/c/" in p and s == 206]
    assert len(index_requests) == len(ahead), index_requests


def test_an_early_index_unlike_the_checked_one_is_decoded_again(streamed, monkeypatch) -> None:
    """The index asked for apart placing two chunks the other way round (a shard rewritten
    between the two requests, or a damaged answer): what was decoded with it does not stand;
    every piece is decoded again from the checked bytes, the batches are the folder's."""
    root, local, stood, whole, mod = streamed
    real = mod._read_index

    def swapped(*args):  # type: ignore[no-untyped-def]
        index = real(*args).copy()
        index[[0, 1]] = index[[1, 0]]
        return index

    monkeypatch.setattr(mod, "_read_index", swapped)
    with served_url(root) as (url, _seen):
        epoch(url, local)
    assert stood == [] and len(whole) >= 2, (stood, whole)


@pytest.mark.parametrize("where", ["header", "data", "index"])
def test_a_damaged_shard_decoded_as_it_arrives_is_named(streamed, sized, where) -> None:
    """One byte flipped in every shard of ``x`` (a Blosc header, chunk data, the index): the
    first epoch by URL names a corrupt shard, never serves its rows."""
    root = streamed[0]
    for path in sorted((root / "store" / "x" / "c").glob("*/0")):
        data = bytearray(path.read_bytes())
        at = {"header": 5, "data": 100, "index": len(data) - 20}[where]
        data[at] ^= 0xFF
        path.write_bytes(bytes(data))
    corrupt = pytest.raises(ChunkReadError, match=r"shard \d+ of array 'x' is corrupt")
    with served_url(root) as (url, _seen), corrupt:
        list(shardload.iter_batches(url, **KW))
    assert sized and all(n > 0 for n in sized), sized  # it decoded as the bytes came


def test_decoded_from_only_that_buffer_and_that_index(streamed) -> None:
    mod = streamed[4]
    buf = np.arange(64, dtype=np.uint8)
    index = np.array([[0, 32], [32, 32]], np.uint64)
    view = buf.data.toreadonly()
    assert mod.decoded_from((index, buf.data), view, index.copy())
    assert not mod.decoded_from(None, view, index)
    assert not mod.decoded_from((index, buf.copy().data), view, index)  # another buffer
    assert not mod.decoded_from((index, buf[:32].data), view[:32].toreadonly()[:16], index)
    assert not mod.decoded_from((index[::-1].copy(), buf.data), view, index)


def test_a_stream_started_again_is_another_attempt() -> None:
    """A GET retried reads into a new buffer: waiters see another attempt (and the decode as
    it arrived does not stand); a GET over without the bytes gives nothing."""
    from shardload.formats.zarr.ahead import Stream

    s = Stream()
    first, second = bytearray(10), bytearray(10)
    s.update(first, 0, 10)
    s.update(first, 6, 10)
    assert s.size() == 10
    got = s.wait(5)
    assert got is not None and got[0] is first and got[1] == 1
    s.update(second, 8, 10)
    got = s.wait(5)
    assert got is not None and got[0] is second and got[1] == 2
    s.end()
    assert s.wait(9) is None
