"""Stores read through a live ``shardload serve`` subprocess equal the local read, batch by batch.

npy, zarr (sharded: range reads of shard indexes) and hdf5 stores are served from one folder;
every test compares against the same iteration over the local path.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import shardload
from _stores import make_store
from conftest import python_env
from shardload.errors import ShardloadError

from .live_server import LiveServer

torch = pytest.importorskip("torch")
from torch.utils.data import DataLoader  # noqa: E402

from shardload.torch import StreamingDataLoader, StreamingDataset  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

FORMATS = ("npy", "zarr", "zarr_sharded", "hdf5")  # store names; hdf5 reads by ranges
T = 10
FAST = dict(retries=2, backoff_s=0.05, timeout_s=3)  # errors surface in seconds, not minutes


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A folder with one store per format, a secret outside it, and a symlink pointing out."""
    base = tmp_path_factory.mktemp("live")
    build, root = base / "build", base / "served"
    root.mkdir()
    for fmt, comp in (("npy", "none"), ("zarr", "lz4"), ("hdf5", "lz4")):
        make_store(build, fmt=fmt, compression=comp, n=203, chunk_rows=7, name=fmt).close()
        os.rename(build / fmt, root / fmt)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(build / "zarr.nc")]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a", "b"], "y": ["c"]},
            "chunk_rows": 7,
            "format": "zarr",
            "compression": "zstd",
            "shard_chunks": 3,
            "out": str(root / "zarr_sharded"),
            "splits": {"train": 0.8, "val": 0.1, "test": 0.1},
        }
    )
    secret = base / "secret"
    secret.mkdir()
    (secret / "key.txt").write_text("root:top-secret")
    os.symlink(secret, root / "npy" / "escape")
    with LiveServer(root) as server:
        yield root, server


def url_of(server: LiveServer, fmt: str) -> str:
    return server.url + fmt


def as_numpy(batch) -> dict[str, np.ndarray]:
    return {k: (v.numpy() if hasattr(v, "numpy") else np.asarray(v)) for k, v in batch.items()}


def assert_same_batches(got, want) -> None:
    got, want = [as_numpy(b) for b in got], [as_numpy(b) for b in want]
    assert len(got) == len(want) > 0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sorted(g) == sorted(w), i
        assert "index" in g
        for k in w:
            assert g[k].dtype == w[k].dtype, (i, k)
            np.testing.assert_array_equal(g[k], w[k], err_msg=f"batch {i}, array {k!r}")


def tree_digest(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and not p.is_symlink() and "escape" not in p.parts
    }


def test_ready_line_and_index(served) -> None:
    root, server = served
    assert server.ready_line.startswith(f"serving {root.resolve()} at http://127.0.0.1:")
    index = requests.get(server.url, timeout=T).json()["stores"]
    assert [(s["name"], s["format"], s["length"]) for s in index] == [
        ("hdf5", "hdf5", 203),
        ("npy", "npy", 203),
        ("zarr", "zarr", 203),
        ("zarr_sharded", "zarr", 203),
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_open_store_costs_one_round_trip(served, fmt) -> None:
    """Opening fetches the manifest and the checksum file, together (one round trip:
    tests/test_url_open.py counts them behind the latency proxy), and nothing else."""
    _, server = served
    before = len(server.requests(f"/{fmt}/"))
    store = shardload.open_store(url_of(server, fmt))
    assert len(store) == 203
    logged = server.requests(f"/{fmt}/")[before:]
    assert sorted(logged) == [
        ("GET", f"/{fmt}/checksums.npz", 200),
        ("GET", f"/{fmt}/shardload.json", 200),
    ]


@pytest.mark.parametrize("fmt", FORMATS)
def test_iter_batches_by_url_equals_local(served, fmt) -> None:
    root, server = served
    # the default shuffle unit differs between raw local files and URLs: pin it to compare
    opts = dict(batch_size=16, seed=3, epoch=1, shuffle=True, piece_rows=0)
    want = list(shardload.iter_batches(str(root / fmt), **opts))
    got = list(shardload.iter_batches(url_of(server, fmt), **opts))
    assert_same_batches(got, want)
    rows = np.sort(np.concatenate([b["index"] for b in got]))
    assert len(np.unique(rows)) == len(rows) >= 203 - 16


@pytest.mark.parametrize("fmt", FORMATS)
def test_streaming_dataset_with_workers_by_url_equals_local(served, fmt) -> None:
    root, server = served

    def batches(store):
        ds = StreamingDataset(store, batch_size=16, seed=5, split="train", piece_rows=0)
        return list(DataLoader(ds, batch_size=None, num_workers=2))

    assert_same_batches(batches(url_of(server, fmt)), batches(str(root / fmt)))


@pytest.mark.parametrize("fmt", FORMATS)
def test_resume_by_url_equals_local(served, fmt) -> None:
    root, server = served

    def loader(store):
        ds = StreamingDataset(store, batch_size=8, seed=7, split="train", piece_rows=0)
        ds.set_epoch(2)
        return StreamingDataLoader(ds, num_workers=2)

    full = list(loader(str(root / fmt)))
    first = loader(url_of(server, fmt))
    it = iter(first)
    head = [next(it) for _ in range(5)]
    state = first.state_dict()
    del it
    second = loader(url_of(server, fmt))  # a fresh dataset
    second.load_state_dict(state)
    rest = list(second)
    assert_same_batches(head + rest, full)


@pytest.mark.parametrize("fmt", FORMATS)
def test_inspect_url_json(served, fmt) -> None:
    root, server = served
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "inspect", url_of(server, fmt), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=python_env(),
    )
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    local = json.loads((root / fmt / "shardload.json").read_text())
    assert d["length"] == local["length"] == 203 and d["complete"]
    assert d["format"] == local["format"] == fmt.split("_")[0]


@pytest.mark.parametrize("fmt", ["npy", "zarr", "zarr_sharded", "hdf5"])
def test_second_epoch_through_the_cache_makes_no_chunk_requests(served, fmt, tmp_path) -> None:
    root, server = served
    chunk_prefix = {"npy": "/npy/x/", "hdf5": "/hdf5/data.h5"}.get(fmt, f"/{fmt}/x/c")
    before = tree_digest(root / fmt)
    store = shardload.open_store(url_of(server, fmt), cache_dir=tmp_path / "cache")
    opts = dict(batch_size=16, seed=1, shuffle=True, piece_rows=0)
    n0 = len(server.requests(chunk_prefix))
    e0 = list(shardload.iter_batches(store, epoch=0, **opts))
    n1 = len(server.requests(chunk_prefix))
    assert n1 > n0  # epoch 0 downloaded the chunks
    e1 = list(shardload.iter_batches(store, epoch=1, **opts))
    # a fresh handle and DataLoader workers (other processes) share the cache folder
    again = shardload.open_store(url_of(server, fmt), cache_dir=tmp_path / "cache")
    e2 = list(DataLoader(StreamingDataset(again, batch_size=16), batch_size=None, num_workers=2))
    assert len(server.requests(chunk_prefix)) == n1, server.requests(chunk_prefix)[n1:]
    assert_same_batches(e1, list(shardload.iter_batches(str(root / fmt), epoch=1, **opts)))
    assert len(e0) == len(e1) and len(e2) > 0
    assert tree_digest(root / fmt) == before  # the source is untouched


@pytest.mark.parametrize("fmt", FORMATS)
def test_bounded_cache_stays_under_its_bound(served, fmt, tmp_path) -> None:
    root, server = served
    total = sum(p.stat().st_size for p in (root / fmt).rglob("*") if p.is_file())
    bound = total // 4
    cache = tmp_path / "cache"
    store = shardload.open_store(url_of(server, fmt), cache_dir=cache, cache_bytes=bound)
    got = list(shardload.iter_batches(store, batch_size=16, seed=2, piece_rows=0))
    want = list(shardload.iter_batches(str(root / fmt), batch_size=16, seed=2, piece_rows=0))
    assert_same_batches(got, want)
    store.close()  # the cache's read-ahead (of the next epoch's files) ends with the store
    cached = [p for p in cache.iterdir() if not p.name.endswith(".lock")]
    sizes = {p.name: p.stat().st_size for p in cached}
    alone = sorted(
        n for n in sizes if (n + ".sum" if not n.endswith(".sum") else n[:-4]) not in sizes
    )
    assert sum(sizes.values()) <= bound, (alone, sizes)


# -- the HTTP surface of the live server ------------------------------------------------------
def raw(server: LiveServer, target: str, method: str = "GET", headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=T)
    try:
        conn.putrequest(method, target, skip_accept_encoding=True)
        for k, v in (headers or {}).items():
            conn.putheader(k, v)
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.headers, resp.read()  # headers: case-insensitive
    finally:
        conn.close()


@pytest.mark.parametrize(
    "path",
    [
        "/npy/x/000003.npy",
        "/zarr/x/c/3/0",
        "/zarr_sharded/x/c/1/0",
        "/hdf5/data.h5",
        "/npy/shardload.json",
    ],
)
def test_range_requests(served, path) -> None:
    root, server = served
    data = (root / path.lstrip("/")).read_bytes()
    size = len(data)
    status, h, body = raw(server, path, headers={"Range": "bytes=10-73"})
    assert (status, body, h["Content-Length"]) == (206, data[10:74], "64")
    assert h["Content-Range"] == f"bytes 10-73/{size}"
    status, h, body = raw(server, path, headers={"Range": "bytes=-16"})
    assert (status, body) == (206, data[-16:])
    status, h, body = raw(server, path, headers={"Range": f"bytes={size - 5}-"})
    assert (status, body) == (206, data[-5:])
    status, h, _ = raw(server, path, headers={"Range": f"bytes={size + 10}-"})
    assert status == 416 and h["Content-Range"] == f"bytes */{size}"
    status, h, body = raw(server, path, method="HEAD")
    assert (status, body, int(h["Content-Length"])) == (200, b"", size)
    status, h2, body = raw(server, path)
    assert (status, body, int(h2["Content-Length"])) == (200, data, size)
    assert h2["ETag"] == h["ETag"] and h2["Last-Modified"]
    status, _, body = raw(server, path, headers={"If-None-Match": h2["ETag"]})
    assert (status, body) == (304, b"")


@pytest.mark.parametrize(
    "target",
    [
        "/npy/../../secret/key.txt",
        "/../secret/key.txt",
        "/npy/%2e%2e/%2e%2e/secret/key.txt",
        "/%2E%2E/secret/key.txt",
        "/npy/..%2f..%2fsecret%2fkey.txt",
        "/npy/%252e%252e/key.txt",
        "/npy/..%5c..%5csecret%5ckey.txt",
        "/npy/escape/key.txt",
        "/npy/escape/",
        "/npy/x/%00",
    ],
)
def test_traversal_is_refused(served, target) -> None:
    _, server = served
    status, _, body = raw(server, target)
    assert status in (403, 404), (target, status)
    assert b"top-secret" not in body
    listing = requests.get(server.url + "npy/?format=json", timeout=T).json()["entries"]
    assert "escape" not in {e["name"] for e in listing}
    assert any(p == target and s in (403, 404) for _, p, s in server.requests())  # logged


# -- the server dies mid-read -------------------------------------------------------------------
@pytest.fixture(scope="module")
def big_hdf5(served, tmp_path_factory):
    """An HDF5 store larger than a remote file's read-ahead block (5 MiB): reads continue after
    the first block."""
    root, _ = served
    base = tmp_path_factory.mktemp("big")
    make_store(base, fmt="hdf5", n=400_000, chunk_rows=20_000, name="hdf5_big").close()
    os.rename(base / "hdf5_big", root / "hdf5_big")
    assert (root / "hdf5_big" / "data.h5").stat().st_size > 6 * 2**20
    return "hdf5_big"


@pytest.fixture(scope="module")
def many_chunks(served, tmp_path_factory):
    """npy and Zarr stores of many chunk files: far more than a reader by URL keeps in flight
    (32 a process; with 2 workers, each reads half), so the server's death after the first batch
    meets reads still to come: 200 chunk files for npy and Zarr (1,000 took about 15 s each to
    write), 334 shard files of 3 chunks for sharded Zarr."""
    root, _ = served
    base = tmp_path_factory.mktemp("many")
    for name, fmt, n, config in (
        ("npy_many", "npy", 1400, {"compression": "none"}),
        ("zarr_many", "zarr", 1400, {"compression": "lz4"}),
        ("zarr_sharded_many", "zarr", 7000, {"compression": "zstd", "shard_chunks": 3}),
    ):
        make_store(base, fmt=fmt, n=n, chunk_rows=7, name=name, **config).close()
        os.rename(base / name, root / name)
    return root


CHUNK_NAMED = re.compile(r"chunk(\(s\))? \d+|/\d{6}\.npy|/c/\d+|data\.h5")


@pytest.mark.parametrize("fmt", ["npy_many", "zarr_many", "zarr_sharded_many", "hdf5_big"])
@pytest.mark.parametrize("workers", [0, 2])
def test_server_killed_mid_read_raises_a_clear_error(
    served, big_hdf5, many_chunks, fmt, workers
) -> None:
    root, _ = served
    with LiveServer(root) as server:
        url = url_of(server, fmt)
        store = shardload.open_store(url, **FAST)
        batch_size = 4000 if fmt == big_hdf5 else 4
        opts = dict(batch_size=batch_size, seed=0, shuffle_chunks=1, prefetch=1)
        if workers:
            ds = StreamingDataset(store, **opts)
            batches = iter(DataLoader(ds, batch_size=None, num_workers=workers, prefetch_factor=1))
        else:
            batches = shardload.iter_batches(store, **opts)
        next(batches)
        server.kill()
        t0 = time.monotonic()
        with pytest.raises(ShardloadError) as info:
            for _ in batches:
                pass
        elapsed = time.monotonic() - t0
    message = str(info.value)
    assert elapsed < 30, elapsed
    assert url in message, message  # the store's URL (or a file's URL inside it)
    assert CHUNK_NAMED.search(message), message  # which chunk (or chunk file)
    assert "after 3 attempts" in message or "could not be read" in message, message
