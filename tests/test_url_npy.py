"""An npy stack by URL (issue 28): a call's pieces in one range request per chunk file (near
pieces merged), each file fetched whole once for its checksum and kept for the later groups,
no size queries; and the checks of the local reader by URL too (a damaged, missing or
truncated file, or one whose header disagrees with the manifest, is an error naming it).
Before, each piece of a row span was its own request (about 2,000 an epoch of the store below,
64 per file), each file's header a size query and a read per thread, and a file whole again
per thread that checked it at the same time."""

from __future__ import annotations

import collections
from urllib.parse import urlparse

import numpy as np
import pytest
import xarray as xr

import shardload
from _stores import make_store
from shardload.errors import ShardloadError
from shardload.move.serve import serving
from shardload.testing.latency import latency_proxy
from test_corruption import BAD_CHUNK, _expected, _prepare, corrupt
from test_url_requests import access_log, assert_same_batches, spans_read_twice

pytestmark = pytest.mark.timeout(120)

KW = {"batch_size": 64, "seed": 5, "split": None}


@pytest.fixture(scope="module")
def npy_store(tmp_path_factory):
    """16 files of 64 rows per array (x: 16 bytes a row, y: 8)."""
    tmp = tmp_path_factory.mktemp("npy")
    make_store(tmp, fmt="npy", n=1024, chunk_rows=64)
    return tmp


def files_of(root) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.glob("[xy]/*.npy"))


def test_an_epoch_fetches_each_file_once(npy_store) -> None:
    """First epoch (every file checked): each file one request, whole; the open's header
    reads of each array's last file; nothing else, and a second epoch of the same store
    nothing at all (the checked files are kept: 48 KiB here)."""
    want = list(shardload.iter_batches(npy_store / "store", **KW))
    with access_log() as seen, serving(npy_store) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.01) as (_, port):
            store = shardload.open_store(f"http://127.0.0.1:{port}/store")
            got = list(shardload.iter_batches(store, **KW))
            first = len(seen)
            again = list(shardload.iter_batches(store, **KW))
    assert_same_batches(want, got, again)
    files = files_of(npy_store / "store")
    whole = collections.Counter(p.removeprefix("/store/") for m, p, s in seen if s == 200)
    ranged = [p.removeprefix("/store/") for m, p, s in seen if s == 206]
    assert [m for m, _, _ in seen if m != "GET"] == []  # no size queries
    assert {f: whole[f] for f in files} == {f: 1 for f in files}
    assert sorted(ranged) == ["x/000015.npy", "y/000015.npy"]  # the open's header checks
    assert len(seen) == first == len(files) + 2 + 2  # + shardload.json, checksums.npz


@pytest.mark.parametrize("verify", ["never", "auto"])
def test_a_call_reads_a_file_in_one_request(npy_store, verify, monkeypatch) -> None:
    """96 one-row spans over 3 files, twice (checked files not kept): a header read and one
    range request per file and call (its pieces lie within 1 MiB), or the file checked whole
    and then one range request."""
    monkeypatch.setenv("SHARDLOAD_URL_KEEP_BYTES", "0")
    seen = spans_read_twice(npy_store, verify=verify)
    files = ["/store/x/000000.npy", "/store/x/000001.npy", "/store/x/000002.npy"]
    got = collections.Counter((p, s) for m, p, s in seen if p in files)
    assert [m for m, _, _ in seen if m != "GET"] == []
    if verify == "never":  # a header each, then a range each call
        assert got == {(f, 206): 3 for f in files}, seen
    else:  # each checked whole (its header from those bytes), then a range
        assert got == {**{(f, 200): 1 for f in files}, **{(f, 206): 1 for f in files}}, seen


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """The npy store of test_corruption (1,000 rows, chunks of 50) intact and damaged four
    ways (chunk BAD_CHUNK of x), served."""
    root = tmp_path_factory.mktemp("damaged")
    src = root / "src.nc"
    rng = np.random.default_rng(0)
    n = 1000
    xr.Dataset(
        {
            "a": ("sample", np.arange(n, dtype="f4") + 1),
            "b": (("sample", "lev"), rng.standard_normal((n, 3)).astype("f4")),
            "c": ("sample", np.arange(n, dtype="i8") * 10),
        }
    ).to_netcdf(src)
    _prepare(root / "intact", src, {"format": "npy", "compression": "none"})
    expected = _expected(root / "intact")
    bad = {}
    for kind in ("deleted", "truncated", "bitflip", "dtype"):
        _prepare(root / kind, src, {"format": "npy", "compression": "none"})
        bad[kind] = corrupt("npy", kind, root / kind, expected["x"]).relative_to(root)
    with serving(root) as url:
        yield url, expected, bad


@pytest.mark.parametrize("verify", ["auto", "never"])
@pytest.mark.parametrize("kind", ["deleted", "truncated", "bitflip", "dtype"])
def test_a_damaged_file_by_url_is_an_error_naming_it(damaged, kind, verify) -> None:
    url, expected, bad = damaged
    if kind == "bitflip" and verify == "never":
        pytest.skip("no checksum is checked: a flipped bit in the rows is not detectable")
    served = 0
    with pytest.raises(ShardloadError) as err:
        store = shardload.open_store(url + kind, verify=verify)
        for batch in shardload.iter_batches(store, batch_size=64, seed=3):
            idx = np.asarray(batch["index"])
            for a, full in expected.items():
                np.testing.assert_array_equal(batch[a], full[idx])  # never wrong values
            served += 1
    assert url + bad[kind].as_posix() in str(err.value), str(err.value)
    assert f"chunk {BAD_CHUNK}" in str(err.value) or kind == "dtype", str(err.value)
    intact = shardload.open_store(url + "intact", verify=verify)
    for batch in shardload.iter_batches(intact, batch_size=64, seed=3):
        idx = np.asarray(batch["index"])
        np.testing.assert_array_equal(batch["x"], expected["x"][idx])


def test_the_next_group_is_in_flight_while_one_is_used(npy_store, monkeypatch) -> None:
    """By default a whole group ahead (``resolve_prefetch``): an epoch of 8 groups (checked
    files not kept, so each group makes requests) waits 4 round trips one after another, one
    per two groups; before (4 pieces of the next group ahead), 8: each group its own."""
    monkeypatch.setenv("SHARDLOAD_URL_KEEP_BYTES", "0")
    kw = {**KW, "shuffle_chunks": 8, "piece_rows": 16}  # 64 pieces of 16 rows: 8 groups
    want = list(shardload.iter_batches(npy_store / "store", **kw))
    with serving(npy_store) as base:
        target = urlparse(base)
        with latency_proxy(target.hostname, target.port, rtt_s=0.1) as (proxy, port):
            store = shardload.open_store(f"http://127.0.0.1:{port}/store")
            list(shardload.iter_batches(store, **kw))  # opening and checks: later epochs read
            proxy.reset_counts()
            got = list(shardload.iter_batches(store, **kw))
            trips = proxy.round_trips()
    for b, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(b["x"], w["x"])
    assert trips <= 5, (trips, proxy.turns)


def test_rows_into_a_strided_or_wider_buffer_are_the_local_values(npy_store) -> None:
    """Bytes are copied as stored: a buffer that is not C-contiguous, or of another dtype, is
    filled from one of the array's own, never with raw bytes reinterpreted."""
    want = shardload.open_store(npy_store / "store").read("x", 50, 150)
    with serving(npy_store) as base:
        reader = shardload.open_store(f"{base}store").reader
        strided = np.zeros((100, 8), "f4")[:, ::2]
        wider = np.zeros((100, 4), "f8")
        reader.read_spans_into("x", [(50, 150), (50, 150)], [strided, wider])
    np.testing.assert_array_equal(strided, want)
    np.testing.assert_array_equal(wider, want.astype("f8"))
