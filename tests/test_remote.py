"""Remote reads: fsspec over our server, retries against a failing server, cache and its bound."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from shardload.errors import RemoteError, RemoteNotFoundError
from shardload.move.remote import evict_lru, is_url, open_fs, read_bytes
from shardload.move.serve import serving

PAYLOAD = bytes(range(256)) * 64  # 16 KiB


@contextlib.contextmanager
def flaky_server(modes: list[str]) -> Iterator[tuple[str, list[str]]]:
    """An aiohttp server whose n-th GET behaves as ``modes[n]`` (the last mode repeats).

    Modes: ``ok``, ``500``, ``503``, ``403``, ``drop`` (close the connection before answering),
    ``half`` (send half of the body, then close), ``stall`` (answer nothing for a minute).
    Yields the file URL and the list of modes served so far.
    """
    seen: list[str] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        mode = modes[min(len(seen), len(modes) - 1)]
        seen.append(mode)
        if mode in ("500", "503", "403"):
            return web.Response(status=int(mode), text="no")
        if mode == "drop":
            request.transport.close()
            return web.Response(text="never sent")
        if mode == "stall":
            await asyncio.sleep(60)
        rng = request.http_range
        body = PAYLOAD[rng.start or 0 : rng.stop]
        resp = web.StreamResponse(status=206 if rng.start is not None else 200)
        resp.content_length = len(body)
        await resp.prepare(request)
        if mode == "half":
            await resp.write(body[: len(body) // 2])
            request.transport.close()
            return resp
        await resp.write(body)
        return resp

    with serving_handler(handle, shutdown_timeout=0.5) as url:
        yield url, seen


@contextlib.contextmanager
def serving_handler(handle: Callable[..., Any], *, shutdown_timeout: float) -> Iterator[str]:
    """An aiohttp server on 127.0.0.1 in a thread, answering GETs of ``/data.bin`` with
    ``handle``; yields that URL, stops when the block ends."""
    ready = threading.Event()
    state: dict = {}

    async def main() -> None:
        app = web.Application()
        app.router.add_get("/data.bin", handle)
        runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = runner.addresses[0][1]
        state["loop"], state["stop"] = asyncio.get_running_loop(), asyncio.Event()
        ready.set()
        await state["stop"].wait()
        await runner.cleanup()

    thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{state['port']}/data.bin"
    finally:
        state["loop"].call_soon_threadsafe(state["stop"].set)
        thread.join(10)


def fast_fs(url: str, **kw):
    kw.setdefault("retries", 3)
    kw.setdefault("timeout_s", 5)
    fs, root = open_fs(url.rsplit("/", 1)[0], backoff_s=0.01, **kw)
    return fs, root + "/" + url.rsplit("/", 1)[1]


def test_is_url() -> None:
    assert is_url("http://h/x") and is_url("s3://bucket/x") and is_url("file:///tmp/x")
    assert not is_url("/tmp/x") and not is_url("relative/x") and not is_url(Path("/tmp"))
    assert not is_url("C:\\data")


def test_open_fs_and_read_from_our_server(stores: Path) -> None:
    chunk = (stores / "alpha" / "x" / "000001.npy").read_bytes()
    with serving(stores) as url:
        fs, root = open_fs(url + "alpha/")
        assert root == url + "alpha"
        assert fs.find(root)[-1] == root + "/x/000002.npy"
        assert read_bytes(fs, root + "/x/000001.npy") == chunk
        assert read_bytes(fs, root + "/x/000001.npy", 100, 164) == chunk[100:164]
        assert read_bytes(fs, root + "/x/000001.npy", 4000) == chunk[4000:]
        t0 = time.monotonic()
        with pytest.raises(RemoteNotFoundError, match=r"nope\.npy"):
            read_bytes(fs, root + "/x/nope.npy", what="chunk 9 of array 'x'")
        assert time.monotonic() - t0 < 2  # not retried


def test_local_paths_work_too(stores: Path) -> None:
    fs, root = open_fs(str(stores / "alpha"))
    assert read_bytes(fs, root + "/shardload.json").startswith(b"{")


@pytest.mark.parametrize("failure", ["500", "503", "drop", "half"])
def test_transient_failures_are_retried(failure: str) -> None:
    with flaky_server([failure, failure, "ok"]) as (url, seen):
        fs, path = fast_fs(url)
        assert read_bytes(fs, path) == PAYLOAD
        assert read_bytes(fs, path, 10, 20) == PAYLOAD[10:20]
    assert seen == [failure, failure, "ok", "ok"]


def test_error_after_the_last_retry_names_url_and_what() -> None:
    with flaky_server(["503"]) as (url, seen):
        fs, path = fast_fs(url, retries=2)
        with pytest.raises(RemoteError, match=r"chunk 12 of array 'x' \(http://.*data.bin\)"):
            read_bytes(fs, path, what="chunk 12 of array 'x'")
    assert len(seen) == 3


def test_client_errors_are_not_retried() -> None:
    with flaky_server(["403"]) as (url, seen):
        fs, path = fast_fs(url)
        with pytest.raises(RemoteError, match="403"):
            read_bytes(fs, path)
    assert seen == ["403"]


def test_a_silent_server_times_out() -> None:
    with flaky_server(["stall"]) as (url, _):
        fs, path = fast_fs(url, retries=1, timeout_s=0.5)
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="after 2 attempts"):
            read_bytes(fs, path)
        assert time.monotonic() - t0 < 5


TRICKLE = textwrap.dedent(
    """
    import asyncio, sys
    from aiohttp import web
    async def handle(request):
        resp = web.StreamResponse()
        resp.content_length = 10_000_000
        await resp.prepare(request)
        while True:
            await resp.write(b"x" * 1024)
            await asyncio.sleep(0.05)
    app = web.Application()
    app.router.add_get("/big.bin", handle)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=lambda *a: print("up", flush=True))
    """
)


def test_server_killed_mid_read_gives_remote_error_quickly(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-c", TRICKLE, str(port)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout.readline().strip() == "up"
        fs, path = fast_fs(f"http://127.0.0.1:{port}/big.bin", retries=2)
        killer = threading.Timer(0.5, proc.kill)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match=r"big\.bin"):
            read_bytes(fs, path)
        assert time.monotonic() - t0 < 10
        killer.join()
    finally:
        proc.kill()
        proc.wait(10)


def test_cache_serves_repeat_reads_without_the_server(stores: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    chunk = (stores / "alpha" / "x" / "000000.npy").read_bytes()
    with serving(stores) as url:
        fs, root = open_fs(url + "alpha", cache_dir=cache, retries=0)
        assert read_bytes(fs, root + "/x/000000.npy", 5, 50) == chunk[5:50]
    # the server is gone: the cached copy answers
    assert read_bytes(fs, root + "/x/000000.npy") == chunk


def test_failed_download_leaves_nothing_the_cache_trusts(tmp_path: Path) -> None:
    with flaky_server(["half", "ok"]) as (url, seen):
        fs, path = fast_fs(url, cache_dir=tmp_path / "cache")
        assert read_bytes(fs, path) == PAYLOAD
        assert read_bytes(fs, path) == PAYLOAD
    assert seen == ["half", "ok"]


def test_cache_is_bounded_lru_and_never_touches_the_source(stores: Path, tmp_path) -> None:
    cache = tmp_path / "cache"
    sources = {i: (stores / "alpha" / "x" / f"{i:06d}.npy").read_bytes() for i in range(3)}
    with serving(stores) as url:
        # room for two of the three files and their records (.sum, about 200 bytes each)
        bound = 2 * 4097 + 10 + 600
        fs, root = open_fs(url + "alpha", cache_dir=cache, cache_bytes=bound)
        for i in (0, 1, 0, 2):  # 1 is now the least recently used
            assert read_bytes(fs, root + f"/x/{i:06d}.npy") == sources[i]
    kept = [p for p in cache.iterdir() if p.name != "cache" and p.suffix != ".lock"]
    assert sum(p.stat().st_size for p in kept) <= bound
    assert sorted(p.stat().st_size for p in kept if p.suffix != ".sum") == [4096, 4098]
    for i in range(3):
        assert (stores / "alpha" / "x" / f"{i:06d}.npy").read_bytes() == sources[i]


def test_evict_lru_unit(tmp_path: Path) -> None:
    for i, name in enumerate(["a", "b", "c"]):
        (tmp_path / name).write_bytes(b"x" * 100)
        os.utime(tmp_path / name, (1000 + i, 1000 + i))
    (tmp_path / "a.lock").write_bytes(b"")  # locks are never evicted
    (tmp_path / "d.tmp-123").write_bytes(b"t" * 50)  # a dead download's leftover: removed
    os.utime(tmp_path / "d.tmp-123", (1000, 1000))
    (tmp_path / "e.tmp-456").write_bytes(b"t" * 50)  # a download in progress: kept
    os.symlink(tmp_path / "c", tmp_path / "link")  # never followed nor removed
    assert evict_lru(tmp_path, 150) == 250
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.lock", "c", "e.tmp-456", "link"]


def test_filesystem_pickles_and_reads_after_fork(stores: Path, tmp_path: Path) -> None:
    import multiprocessing
    import pickle

    chunk = (stores / "alpha" / "x" / "000002.npy").read_bytes()
    with serving(stores) as url:
        fs, root = open_fs(url + "alpha", retries=1)
        assert read_bytes(fs, root + "/x/000002.npy") == chunk  # the parent's session is live
        clone = pickle.loads(pickle.dumps(fs))
        assert clone.spec == fs.spec and read_bytes(clone, root + "/x/000002.npy") == chunk
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(1) as pool:  # fsspec's async filesystems are not fork-safe; ours reopens
            got = pool.apply(read_bytes, (fs, root + "/x/000002.npy", 10, 20))
    assert got == chunk[10:20]


@pytest.mark.parametrize("cached", [False, True])
def test_suffix_and_open_ended_ranges(stores: Path, tmp_path: Path, cached: bool) -> None:
    chunk = (stores / "alpha" / "x" / "000001.npy").read_bytes()
    with serving(stores) as url:
        fs, root = open_fs(url + "alpha", cache_dir=tmp_path / "c" if cached else None)
        path = root + "/x/000001.npy"
        assert read_bytes(fs, path, -16) == chunk[-16:]  # how zarr reads a shard index
        assert read_bytes(fs, path, 4000) == chunk[4000:]
        assert read_bytes(fs, path, 5, 5) == b""
        with fs.open(path, "rb", block_size=0) as f:  # npy headers, HDF5
            f.seek(100)
            assert f.read(50) == chunk[100:150]


def test_read_options_from_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("SHARDLOAD_RETRIES", "1")
    monkeypatch.setenv("SHARDLOAD_RETRY_BACKOFF_S", "0.01")
    monkeypatch.setenv("SHARDLOAD_TIMEOUT_S", "3")
    assert open_fs("http://127.0.0.1:9/store", retries=4)[0].spec.retries == 4  # explicit wins
    fs, root = open_fs("http://127.0.0.1:9/store")  # nothing listens on port 9
    assert (fs.spec.retries, fs.spec.backoff_s, fs.spec.timeout_s) == (1, 0.01, 3.0)
    t0 = time.monotonic()
    with pytest.raises(
        RemoteError, match=r"file x \(http://127.0.0.1:9/store/x\) after 2 attempts"
    ):
        read_bytes(fs, root + "/x")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("zarr_format", [2, 3])
def test_plain_zarr_groups_by_url(tmp_path: Path, zarr_format: int) -> None:
    import numpy as np
    import zarr

    import shardload

    g = zarr.open_group(tmp_path / "plain", mode="w", zarr_format=zarr_format)
    g.create_array("t", shape=(50, 3), chunks=(10, 3), dtype="f4")[:] = np.arange(150).reshape(
        50, 3
    )
    with serving(tmp_path) as url:
        store = shardload.open_store(url + "plain", cache_dir=tmp_path / "cache")
        assert len(store) == 50 and store.num_chunks == 5
        np.testing.assert_array_equal(store.read("t", 5, 27), np.arange(15, 81).reshape(22, 3))


@pytest.mark.parametrize("cached", [False, True])
def test_fsspec_api_through_the_view_and_no_cycle(stores: Path, tmp_path: Path, cached) -> None:
    """What fsspec has and the filesystem has not (``glob``, a buffered file without a cache)
    is its ``fsspec_view``'s, reading through it; the view is not kept, so the filesystem is
    freed when dropped, with no garbage collection (its connections with it)."""
    import gc
    import weakref

    chunk = (stores / "alpha" / "x" / "000001.npy").read_bytes()
    with serving(stores) as url:
        fs, root = open_fs(url + "alpha", retries=1, cache_dir=tmp_path / "c" if cached else None)
        assert f"{root}/x/000001.npy" in fs.glob(f"{root}/x/*.npy")
        with fs.open(f"{root}/x/000001.npy", "rb") as f:
            assert f.read() == chunk
        was = gc.isenabled()
        gc.disable()
        try:
            gone = weakref.ref(fs)
            fs.release()
            del fs, f
            assert gone() is None
        finally:
            if was:
                gc.enable()
