"""A first epoch by URL does less on the client (issues 25 and 28).

- Shards are fetched on ``http.client`` connections, each answer read from the socket straight
  into its buffer (``move/http_get.py``): no request for data goes through fsspec's event-loop
  thread (before: every one), with the same token, TLS, retries and version checks.
- A call that waits for a shard another call is checking gets its whole bytes; the checking
  call no longer copies that call's chunks into the kept store first (``formats/zarr/
  shard_fetch.py``, ``_take_and_keep``): only the chunks of later calls are copied.

Counted, never timed: calls of the aiohttp GET, connections, chunks copied."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import shardload
import shardload.move.pinned as pinned
from _stores import make_store
from shardload.errors import RemoteError
from shardload.formats.zarr.kept import KeptChunks, kept_for, plan_kept
from shardload.move.serve import serving
from test_remote import PAYLOAD, fast_fs, flaky_server
from test_serve_auth import TOKEN, bearer, make_cert
from test_url_requests import access_log
from test_url_shard_fetch import SHARDS, data_requests, epoch, served_url, sharded  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def reader_of(target, timeout_s):  # type: ignore[no-untyped-def]
    from shardload.move.http_get import reader_of

    return reader_of(target, timeout_s)


def test_shards_by_http_url_are_fetched_without_the_event_loop(sharded, monkeypatch) -> None:  # noqa: F811
    """A first epoch (every shard whole) and a later one (range requests): no data GET on
    aiohttp's session, the batches the folder's, the requests those of before."""
    calls: list[str] = []
    real = pinned._http_get

    async def counted(fs, path, *args, **kw):  # type: ignore[no-untyped-def]
        calls.append(path)
        return await real(fs, path, *args, **kw)

    monkeypatch.setattr(pinned, "_http_get", counted)
    root, local = sharded
    with served_url(root) as (url, seen):
        store = shardload.open_store(url)
        epoch(store, local)
        first = data_requests(seen)
        epoch(store, local)
    assert [p for p in calls if "/c/" in p] == []  # before: every request for data
    assert sorted(s for _, s in first) == [200] * (2 * SHARDS), first
    assert (
        reader_of(store.fs.target, 30) is not None
        and reader_of(store.fs.target, 30).requests >= 2 * SHARDS
    )


def test_shards_over_https_with_a_token_on_http_client(tmp_path) -> None:
    """TLS verified with the store's ``ca_file``, the token sent; without the token a 401
    (not retried, with the hint), without the certificate trusted a clear error (not
    retried: one connection)."""
    from shardload.move.http_get import HttpReader

    make_store(tmp_path, fmt="zarr", compression="lz4", n=512, chunk_rows=8, shard_chunks=16)
    local = shardload.open_store(tmp_path / "store")
    want = local.read("x", 0, len(local))
    cert, key = make_cert(tmp_path)
    with serving(tmp_path, tokens=[TOKEN], tls_cert=cert, tls_key=key) as base:
        so = {"headers": bearer(), "ca_file": str(cert)}
        store = shardload.open_store(base + "store", storage_options=so)
        rows = [b for b in shardload.iter_batches(store, batch_size=32, seed=1)]
        for b in rows:
            np.testing.assert_array_equal(b["x"], want[b["index"]])
        assert reader_of(store.fs.target, 30).requests >= 4  # every shard of x, index and y

        shard = f"{base}store/x/c/0/0"
        fs, path = fast_fs(shard, storage_options={"ca_file": str(cert)})
        with pytest.raises(RemoteError, match=r"401.*SHARDLOAD_TOKEN"):
            fs.cat_file(path, view=True)
        assert reader_of(fs.target, 5).requests == 1  # not retried

        fs, path = fast_fs(shard, storage_options={"headers": bearer()})
        made = []
        new = HttpReader._new
        reader_of(fs.target, 5)._new = lambda key: (
            made.append(key) or new(reader_of(fs.target, 5), key)
        )
        with pytest.raises(RemoteError, match=r"(?s)CERTIFICATE_VERIFY_FAILED.*SHARDLOAD_CA_FILE"):
            fs.cat_file(path, view=True)
        assert len(made) == 1  # a certificate does not become trusted: no retry


def test_http_client_retries_server_errors_and_reuses_its_connection() -> None:
    """503 twice then the payload: retried as aiohttp's errors were; the range answers on one
    kept-alive connection."""
    from shardload.move.http_get import HttpReader

    with flaky_server(["503", "503", "ok", "ok", "ok"]) as (url, seen):
        fs, path = fast_fs(url)
        reader = reader_of(fs.target, 5)
        made = []
        new = HttpReader._new
        reader._new = lambda key: made.append(key) or new(reader, key)
        assert bytes(fs.cat_file(path, view=True)) == PAYLOAD
        assert bytes(fs.cat_file(path, 10, 5000, view=True)) == PAYLOAD[10:5000]
        assert bytes(fs.cat_file(path, 7, 9, view=True)) == PAYLOAD[7:9]
    assert seen == ["503", "503", "ok", "ok", "ok"]
    assert reader.requests == 5 and len(made) <= 3  # the error answers' connections closed


def test_a_call_waiting_for_a_shard_in_check_is_handed_its_bytes_not_copies(
    tmp_path, monkeypatch
) -> None:
    """Call A checks shard 0 (fetched whole); call B, of the next group, waits for that check
    and decodes from the same bytes; call C comes later. Only C's chunk is copied into the
    kept store, by B, the last to leave (before: A copied B's chunk and C's, and B took its
    copy). One request, the folder's rows."""
    import shardload.formats.zarr.shard_fetch as shard_fetch

    make_store(tmp_path, fmt="zarr", compression="lz4", n=1024, chunk_rows=8, shard_chunks=32)
    copied: list[int] = []
    keep = KeptChunks.keep

    def counted(self, name, i, view):  # type: ignore[no-untyped-def]
        ok = keep(self, name, i, view)
        if ok:
            copied.append(i)
        return ok

    monkeypatch.setattr(KeptChunks, "keep", counted)
    real = shard_fetch._checked_bytes
    a_checks = threading.Event()

    with access_log() as seen, serving(tmp_path) as base:
        reader = shardload.open_store(f"{base}store").reader

        def waited(verifier, *args, **kw):  # type: ignore[no-untyped-def]
            a_checks.set()  # A holds the shard's lock: B comes to it and waits
            t = time.monotonic()
            while verifier._locks[("x", 0)].users < 2:
                assert time.monotonic() - t < 10, "B never came"
                time.sleep(0.005)
            return real(verifier, *args, **kw)

        monkeypatch.setattr(shard_fetch, "_checked_bytes", waited)
        spans = {"A": 0, "B": 64, "C": 128}  # inner chunks 0, 8 and 16 of shard 0
        first = np.array(list(spans.values()))
        plan_kept(kept_for(reader._indexes), {"x": reader.layout("x")}, first, first + 8)
        outs = {who: np.zeros((8, 4), "f4") for who in spans}

        def call(who: str) -> None:
            if who == "B":
                assert a_checks.wait(10)
            start = spans[who]
            reader.read_spans_into("x", [(start, start + 8)], [outs[who]])

        threads = [threading.Thread(target=call, args=(who,)) for who in ("A", "B")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        call("C")
    for who, start in spans.items():
        np.testing.assert_array_equal(outs[who][:, 0], np.arange(start, start + 8, dtype="f4"))
    assert copied == [16], copied  # C's chunk only (before: [8, 16])
    assert data_requests(seen) == {("x/c/0/0", 200): 1}


def _child_read(fs, path, q) -> None:  # type: ignore[no-untyped-def]
    data = bytes(fs.cat_file(path, 3, 900, view=True))
    q.put((data == PAYLOAD[3:900], reader_of(fs.target, 5).requests))


def test_a_forked_child_reads_on_connections_of_its_own() -> None:
    """A DataLoader worker forked from a process that read by URL: its GETs go on a reader of
    its own (never the parent's kept-alive sockets), and the parent's goes on."""
    import multiprocessing

    with flaky_server(["ok"]) as (url, seen):
        fs, path = fast_fs(url)
        assert bytes(fs.cat_file(path, view=True)) == PAYLOAD
        assert bytes(fs.cat_file(path, 0, 10, view=True)) == PAYLOAD[:10]
        parent = reader_of(fs.target, 5)
        assert parent.requests == 2
        ctx = multiprocessing.get_context("fork")
        q = ctx.Queue()
        child = ctx.Process(target=_child_read, args=(fs, path, q))
        child.start()
        same, requests = q.get(timeout=30)
        child.join(30)
        assert same and requests == 1  # a fresh reader (the parent's had made 2)
        assert bytes(fs.cat_file(path, 5, 50, view=True)) == PAYLOAD[5:50]
        assert reader_of(fs.target, 5) is parent and parent.requests == 3
    assert len(seen) == 4
