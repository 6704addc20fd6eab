"""Raw rows read through a reader thread's small buffer (the compiled ``read_rows``,
``load/runs.py``): each page-cache read call lands in a buffer the CPU's cache holds and its
rows are streamed to their batch places; the batches are, byte for byte, those of io_uring's
reads straight into the batch rows, for Zarr shards of raw inner chunks and npy stacks alike."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.load import runs, uring

pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(runs._kernel() is None, reason="the compiled extension is not built"),
]

N, FEATURES = 2048, 40  # rows of 160 bytes
KW: dict[str, Any] = {"batch_size": 64, "seed": 3, "split": None, "threads": 2}


@pytest.fixture(scope="module")
def values() -> np.ndarray:
    return np.random.default_rng(1).normal(size=(N, FEATURES)).astype("f4")


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, values: np.ndarray) -> dict[str, Path]:
    """The same values as Zarr shards of raw 8-row inner chunks and as an npy stack."""
    root = tmp_path_factory.mktemp("staged")
    xr.Dataset({"a": (("time", "f"), values)}).to_netcdf(root / "src.nc")
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    layouts = {
        "shards": {"chunk_rows": 8, "shard_chunks": 32, "compression": "none"},
        "npy": {"format": "npy", "chunk_rows": 256},
    }
    for name, layout in layouts.items():
        prepare(
            {
                "source": {"paths": [str(root / "src.nc")]},
                "sample_dims": ["time"],
                "arrays": {"x": ["a"]},
                **layout,
                "out": str(root / name),
            }
        )
    return {n: root / n for n in layouts}


def _epochs(store: Path, **kw: Any) -> list[list[dict[str, np.ndarray]]]:
    return [
        [
            {k: np.array(v) for k, v in b.items()}
            for b in shardload.iter_batches(store, epoch=e, **{**KW, **kw})
        ]
        for e in (0, 1)
    ]


def _counted(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Count the calls of the compiled ``read_rows`` and of io_uring's ``readv``."""
    calls = {"read_rows": 0, "readv": 0}
    kernel, readv = runs._kernel(), uring.Ring.readv

    def read_rows(*a: Any) -> Any:
        calls["read_rows"] += 1
        return kernel(*a)

    def ring_readv(self: Any, *a: Any, **k: Any) -> Any:
        calls["readv"] += 1
        return readv(self, *a, **k)

    monkeypatch.setattr(runs, "READ_ROWS", read_rows)
    monkeypatch.setattr(uring.Ring, "readv", ring_readv)
    return calls


@pytest.mark.parametrize("layout", ["shards", "npy"])
def test_raw_rows_go_through_the_small_buffer_with_the_same_batches(
    stores: dict[str, Path], values: np.ndarray, layout: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every read task of a shuffled epoch goes through ``read_rows`` (none through io_uring),
    and its batches are the values at their indices and io_uring's batches, byte for byte."""
    calls = _counted(monkeypatch)
    staged = _epochs(stores[layout])
    assert calls["read_rows"] > 0 and calls["readv"] == 0, calls
    for epoch in staged:
        assert sum(len(b["index"]) for b in epoch) == N
        for b in epoch:
            np.testing.assert_array_equal(b["x"], values[b["index"]])
    monkeypatch.setattr(runs, "READ_ROWS", None)  # as without the extension: io_uring
    direct = _epochs(stores[layout])
    if uring.thread_ring() is not None:
        assert calls["readv"] > 0
    for a, b in zip(staged, direct, strict=True):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            for k in x:
                assert np.array_equal(x[k], y[k]) and x[k].dtype == y[k].dtype, k


def test_calls_longer_than_the_buffer_are_read_into_their_places(
    stores: dict[str, Path], values: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call of more bytes than the buffer holds (whole npy chunks read in order, a buffer of
    two rows) is one ``preadv`` into its places: the same values."""
    calls = _counted(monkeypatch)
    monkeypatch.setattr(runs, "STAGE_BYTES", 2 * FEATURES * 4)
    for epoch in _epochs(stores["npy"], shuffle=False) + _epochs(stores["shards"]):
        for b in epoch:
            np.testing.assert_array_equal(b["x"], values[b["index"]])
    assert calls["read_rows"] > 0 and calls["readv"] == 0, calls


def _drop_cached(root: Path) -> None:
    """Evict the store's data files from the page cache (clean pages: ``POSIX_FADV_DONTNEED``)."""
    for p in root.rglob("*"):
        if p.is_file():
            fd = os.open(p, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="no posix_fadvise")
def test_calls_the_page_cache_does_not_hold_go_to_io_uring(
    stores: dict[str, Path], values: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose bytes are not in the page cache is not waited for in the small buffer's
    loop (one read at a time): it goes to io_uring (many in flight); the same values."""
    if uring.thread_ring() is None:
        pytest.skip("io_uring cannot be used here")
    calls = _counted(monkeypatch)
    store = shardload.open_store(stores["shards"], verify="never")  # nothing reads a shard whole
    for epoch in (0, 1):
        _drop_cached(stores["shards"])
        for b in shardload.iter_batches(store, epoch=epoch, **KW):
            np.testing.assert_array_equal(b["x"], values[b["index"]])
    assert calls["read_rows"] > 0 and calls["readv"] > 0, calls


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm")
def test_a_store_in_tmpfs_is_read_through_io_uring(
    stores: dict[str, Path], values: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tmpfs`` does not take ``RWF_NOWAIT`` (a node cache in ``/dev/shm``): the staged calls
    come back unserved and io_uring reads them; the same values."""
    import shutil
    import tempfile

    if uring.thread_ring() is None:
        pytest.skip("io_uring cannot be used here")
    calls = _counted(monkeypatch)
    with tempfile.TemporaryDirectory(dir="/dev/shm") as shm:
        root = Path(shutil.copytree(stores["shards"], Path(shm) / "s"))
        for b in shardload.iter_batches(root, epoch=0, **KW):
            np.testing.assert_array_equal(b["x"], values[b["index"]])
    assert calls["read_rows"] > 0 and calls["readv"] > 0, calls


@pytest.mark.parametrize("row_bytes", [1, 12, 63, 64, 65, 160, 6200])
def test_rows_of_any_size_at_any_alignment_land_whole(tmp_path: Path, row_bytes: int) -> None:
    """The compiled ``read_rows`` alone: rows of odd sizes to destinations at every alignment
    (the streamed middle of a row and its plain-stored ends), a call's rows in reverse order,
    and nothing written around them."""
    data = np.random.default_rng(row_bytes).integers(0, 256, 64 * row_bytes, np.uint8)
    path = tmp_path / "rows"
    path.write_bytes(data.tobytes())
    out = np.zeros(64 * (row_bytes + 80) + 64, np.uint8)
    base = out.__array_interface__["data"][0]
    at = [7 + i * (row_bytes + 80) + i % 64 for i in range(64)]  # every alignment
    fd = os.open(path, os.O_RDONLY)
    try:
        os.pread(fd, 1, 0)  # the page cache holds the file (written just now)
        iov = np.array([[base + a, row_bytes] for a in at], np.uint64)
        # 8 calls of 8 rows each; call c reads file rows 8c..8c+7 into slots 8c+7..8c
        iov = iov.reshape(8, 8, 2)[:, ::-1].reshape(-1, 2).copy()
        fds = np.full(8, fd, np.int64)
        offs = np.arange(8, dtype=np.int64) * 8 * row_bytes
        wants = np.full(8, 8 * row_bytes, np.int64)
        got = runs._staged_reads(fds, offs, wants, np.arange(8) * 8, np.full(8, 8), iov)
    finally:
        os.close(fd)
    assert got.tolist() == wants.tolist()
    want = np.zeros_like(out)
    for c in range(8):
        for j in range(8):
            slot = 8 * c + 7 - j
            want[at[slot] : at[slot] + row_bytes] = data[
                (8 * c + j) * row_bytes : (8 * c + j + 1) * row_bytes
            ]
    assert np.array_equal(out, want)


def test_an_older_build_is_not_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """A build of the extension with other arguments (another ``ABI``) is never called: reads
    go through io_uring or ``preadv``."""

    class Old:
        ABI = runs.KERNEL_ABI - 1

        def read_rows(self, *a: Any) -> None:
            raise AssertionError("called")

    monkeypatch.setattr(runs.extension, "compiled", lambda: Old())
    assert runs._kernel() is None
