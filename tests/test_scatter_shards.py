"""Shards of raw inner chunks (the default layout of values lz4 cannot shrink, issue 25) read by
the scatter reader: rows go from the page cache straight into their batches, each shard file
opened once an epoch for all its inner chunks, their offsets taken from the shard's checked
index; the batches are the gather reader's and the lz4 store's, and a damaged shard is named
and never served."""

from __future__ import annotations

import builtins
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ChunkReadError
from shardload.load import files, gather, scatter
from shardload.load.kinds import read_kind

pytestmark = pytest.mark.timeout(300)

N, ROWS, PER_SHARD, FEATURES = 1024, 8, 16, 16  # 128 inner chunks in 8 shards
ZERO_CHUNKS = (25, 26)  # all fill value (0): zarr-python would write them nowhere
KW: dict[str, Any] = {"batch_size": 48, "seed": 5, "split": None, "threads": 1}


@pytest.fixture(scope="module")
def values() -> np.ndarray:
    x = np.random.default_rng(0).normal(size=(N, FEATURES)).astype("f4")
    for c in ZERO_CHUNKS:
        x[c * ROWS : (c + 1) * ROWS] = 0
    return x


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, values: np.ndarray) -> dict[str, Path]:
    """The same values as raw and as lz4 shards."""
    root = tmp_path_factory.mktemp("shards")
    src = root / "src.nc"
    xr.Dataset({"a": (("time", "f"), values)}).to_netcdf(src)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    for codec in ("none", "lz4"):
        prepare(
            {
                "source": {"paths": [str(src)]},
                "sample_dims": ["time"],
                "arrays": {"x": ["a"]},
                "chunk_rows": ROWS,
                "shard_chunks": PER_SHARD,
                "compression": codec,
                "out": str(root / codec),
            }
        )
    return {"raw": root / "none", "lz4": root / "lz4"}


def _epoch(store: Any, epoch: int = 0, **kw: Any) -> list[dict[str, np.ndarray]]:
    it = shardload.iter_batches(store, epoch=epoch, **{**KW, **kw})
    return [{k: np.array(v) for k, v in b.items()} for b in it]


def _same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _shards(root: Path) -> list[str]:
    """The shard files of ``x``, by shard number."""
    found = (root / "x" / "c").glob("*/0")
    return [str(p) for p in sorted(found, key=lambda p: int(p.parent.name))]


def test_raw_shards_are_scattered_with_the_batches_of_gathers_and_of_lz4(
    stores: dict[str, Path], values: np.ndarray, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two epochs: every batch is the gather reader's (today's) and the lz4 store's, with no
    gather."""
    raw = shardload.open_store(stores["raw"])
    assert read_kind(raw, ["x"]) == "scatter"
    gathers = []
    real = gather._gather
    monkeypatch.setattr(gather, "_gather", lambda *a: (gathers.append(1), real(*a))[1])
    got = [_epoch(raw, e) for e in (0, 1)]
    assert not gathers
    for e in (0, 1):
        for b in got[e]:
            np.testing.assert_array_equal(b["x"], values[b["index"]])
        _same(got[e], _epoch(shardload.open_store(stores["lz4"]), e))
    monkeypatch.setattr(scatter, "_preadv", lambda errno=False: None)  # as without preadv
    gathered = shardload.open_store(stores["raw"])
    assert read_kind(gathered, ["x"]) == "gather"
    for e in (0, 1):
        _same(got[e], _epoch(gathered, e))
    assert gathers


def test_a_shard_is_opened_and_indexed_once_an_epoch_for_all_its_inner_chunks(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Per epoch each shard file is opened once (one descriptor for its 16 inner chunks, not
    one per inner chunk nor per group) and its chunks' offsets come from one look-up of its
    index, and every descriptor is closed at the epoch's end."""
    store = shardload.open_store(stores["raw"], verify="never")
    shards = _shards(stores["raw"])
    opens: list[str] = []
    real_os_open, real_open = os.open, builtins.open

    def os_open(path: Any, *a: Any, **k: Any) -> int:
        opens.append(str(path))
        return real_os_open(path, *a, **k)

    def py_open(path: Any, *a: Any, **k: Any) -> Any:
        opens.append(str(path))
        return real_open(path, *a, **k)

    looked: list[int] = []
    reader = store.reader
    real_shard = getattr(reader, "raw_shard", None)
    count = lambda n, k: (looked.append(k), real_shard(n, k))[1]  # noqa: E731
    monkeypatch.setattr(reader, "raw_shard", count, raising=False)
    _epoch(store, shuffle_chunks=16)  # the shards' indexes read and kept by the reader
    fds = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "open", os_open)
    monkeypatch.setattr(builtins, "open", py_open)
    looked.clear()
    for e in (1, 2):
        _epoch(store, e, shuffle_chunks=16)  # 8 groups, each touching most shards
    monkeypatch.undo()
    assert sorted(p for p in opens if p in shards) == sorted(shards * 2)
    assert sorted(looked) == sorted(list(range(len(shards))) * 2)
    assert len(os.listdir("/proc/self/fd")) == fds


def test_past_the_descriptor_budget_each_read_task_opens_its_shards(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no descriptors to keep, a read task opens each shard it reads once and closes it:
    the same batches, no descriptor left open."""
    store = shardload.open_store(stores["raw"])
    want = _epoch(store)
    opened = []
    real = files.OpenChunks._open_file

    def counted(self: Any, *a: Any) -> Any:
        opened.append(a[2])
        return real(self, *a)

    monkeypatch.setattr(files, "_fd_budget", lambda: 0)
    monkeypatch.setattr(files.OpenChunks, "_open_file", counted)
    fds = len(os.listdir("/proc/self/fd"))
    _same(_epoch(store, threads=2), want)
    assert len(os.listdir("/proc/self/fd")) == fds
    assert opened and len(opened) < N // ROWS  # per task and shard, not per inner chunk


def test_a_shard_truncated_after_its_check_is_named_and_never_served(
    stores: dict[str, Path], values: np.ndarray, tmp_path: Path
) -> None:
    """Checked and indexed in the first epoch, a shard cut short before the next one: the next
    epoch stops at it, naming it, and no batch before that holds a wrong value."""
    import shutil

    root = tmp_path / "s"
    shutil.copytree(stores["raw"], root)
    store = shardload.open_store(root)  # verify "auto": each shard checked once
    _epoch(store)
    bad = Path(_shards(root)[3])
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    served = []
    with pytest.raises(ChunkReadError, match=r"shard 3 of array 'x' is (truncated|corrupt)") as err:
        for b in shardload.iter_batches(store, epoch=1, **KW):
            served.append(np.array(b["x"]))
            np.testing.assert_array_equal(served[-1], values[b["index"]])
    assert str(bad) in str(err.value)


def test_never_written_inner_chunks_read_as_the_fill_value(
    stores: dict[str, Path], values: np.ndarray, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inner chunks equal to the fill value that zarr-python left out of a shard ("empty" in
    its index, a valid crc32c): their rows are the fill value, as the gather reader's."""
    import shutil

    import google_crc32c

    root = tmp_path / "s"
    shutil.copytree(stores["raw"], root)
    shard = Path(_shards(root)[ZERO_CHUNKS[0] // PER_SHARD])
    data = bytearray(shard.read_bytes())
    at = len(data) - 4 - 16 * PER_SHARD
    index = np.frombuffer(bytes(data[at:-4]), "<u8").reshape(PER_SHARD, 2).copy()
    js = [c % PER_SHARD for c in ZERO_CHUNKS]
    for off, size in index[js].tolist():  # their old bytes, no longer theirs: never served
        data[off : off + size] = b"\xff" * size
    index[js] = 2**64 - 1
    data[at:-4] = index.tobytes()
    data[-4:] = int(google_crc32c.value(bytes(data[at:-4]))).to_bytes(4, "little")
    shard.write_bytes(bytes(data))
    store = shardload.open_store(root, verify="never")  # the shard's digest is the old one's
    assert read_kind(store, ["x"]) == "scatter"
    got = _epoch(store)
    for b in got:
        np.testing.assert_array_equal(b["x"], values[b["index"]])
    monkeypatch.setattr(scatter, "_preadv", lambda errno=False: None)  # as without preadv
    _same(got, _epoch(shardload.open_store(root, verify="never")))


def test_a_shard_rewritten_between_epochs_is_read_with_its_own_index(
    stores: dict[str, Path], values: np.ndarray, tmp_path: Path
) -> None:
    """Checked and indexed in the first epoch (``verify="first-epoch"``), a shard file written
    again before the next with the same inner chunks in reverse order (each the same size) and
    its index to match: the next epoch places rows by the new index, not by the one kept from
    the first epoch (whose offsets now hold other rows, served silently before)."""
    import shutil

    import google_crc32c

    root = tmp_path / "s"
    shutil.copytree(stores["raw"], root)
    shard = Path(_shards(root)[1])
    data = shard.read_bytes()
    at = len(data) - 4 - 16 * PER_SHARD
    index = np.frombuffer(data[at:-4], "<u8").reshape(PER_SHARD, 2).copy()
    assert len(set(index[:, 1].tolist())) == 1  # raw: every inner chunk the same size
    chunks = [data[int(o) : int(o + n)] for o, n in index.tolist()]
    index[:, 0] = index[::-1, 0]
    new_index = index.astype("<u8").tobytes()
    crc = int(google_crc32c.value(new_index)).to_bytes(4, "little")
    store = shardload.open_store(root, verify="first-epoch")
    assert read_kind(store, ["x"]) == "scatter"
    _epoch(store)
    shard.write_bytes(b"".join(chunks[::-1]) + new_index + crc)
    for b in _epoch(store, epoch=1):
        np.testing.assert_array_equal(b["x"], values[b["index"]])


def test_a_shard_replaced_between_its_index_and_its_open_is_named(
    stores: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file the scatter reader opens must be the one whose index placed the rows: another
    (replaced in between) is an error naming the shard, not rows read by a stale index."""
    import dataclasses

    from shardload.formats.zarr import read as zarr_read

    real = zarr_read.ZarrReader.raw_shard

    def elsewhere(self: Any, name: str, k: int) -> Any:
        return dataclasses.replace(real(self, name, k), version=(0, 0, 0, 0))

    monkeypatch.setattr(zarr_read.ZarrReader, "raw_shard", elsewhere)
    with pytest.raises(ChunkReadError, match=r"shard \d of array 'x' changed while it was being"):
        _epoch(shardload.open_store(stores["raw"]))
