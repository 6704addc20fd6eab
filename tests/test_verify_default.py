"""The default ``verify="auto"`` checks every chunk before its rows are served, raw rows and
URLs included, and the node's ledger (shardload/formats/ledger.py) makes that once per node
and chunk file version, not once per process or epoch."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import shardload
from _stores import make_store
from shardload.errors import ChunkReadError
from shardload.formats import ledger as ledger_mod
from shardload.formats.ledger import RECORD, Ledger, parse_records
from shardload.move.serve import serving

SRC = str(Path(__file__).resolve().parents[1] / "src")
N, CHUNK_ROWS, BAD = 203, 7, 3
NUM_CHUNKS = -(-N // CHUNK_ROWS)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("verify-default")
    out = {}
    for fmt, compression in [("npy", "none"), ("zarr", "none"), ("zarr", "zstd")]:
        name = f"{fmt}-{compression}"
        make_store(root, fmt=fmt, compression=compression, n=N, chunk_rows=CHUNK_ROWS, name=name)
        out[name] = root / name
    return out


def chunk_file(root: Path, kind: str, i: int = BAD) -> Path:
    return root / "x" / (f"{i:06d}.npy" if kind == "npy-none" else f"c/{i}/0")


def flip_byte(path: Path) -> None:
    """Flip one bit of the chunk file's last row (data, not an npy header)."""
    data = bytearray(path.read_bytes())
    data[len(data) - 3] ^= 0x10
    path.write_bytes(bytes(data))


def copy_store(pristine: dict[str, Path], kind: str, dest: Path) -> Path:
    import shutil

    shutil.copytree(pristine[kind], dest)
    return dest


@pytest.mark.parametrize("kind", ["npy-none", "zarr-none"])
@pytest.mark.parametrize("how", ["store_read", "iter_batches"])
def test_default_refuses_a_flipped_bit_in_raw_rows(pristine, tmp_path, kind, how):
    root = copy_store(pristine, kind, tmp_path / "store")
    bad = chunk_file(root, kind)
    flip_byte(bad)
    s = shardload.open_store(root)  # the default: verify="auto"
    with pytest.raises(ChunkReadError, match="corrupt") as err:
        if how == "store_read":
            s.read("x")
        else:
            for _ in shardload.iter_batches(s, batch_size=16, seed=0):
                pass
    assert str(bad) in str(err.value)


@pytest.mark.parametrize("kind", ["npy-none", "zarr-none", "zarr-zstd"])
def test_default_refuses_a_flipped_bit_read_by_url(pristine, tmp_path, kind):
    served = tmp_path / "served"
    root = copy_store(pristine, kind, served / "store")
    flip_byte(chunk_file(root, kind))
    with serving(served) as url:
        s = shardload.open_store(url + "store")
        with pytest.raises(ChunkReadError, match="corrupt") as err:
            s.read("x")
        assert f"x/{chunk_file(root, kind).relative_to(root / 'x')}" in str(err.value)
        s = shardload.open_store(url + "store")
        with pytest.raises(ChunkReadError, match="corrupt"):
            for _ in shardload.iter_batches(s, batch_size=16, seed=0, arrays=["x"]):
                pass


def test_npy_by_url_serves_the_rows_it_checked(pristine, tmp_path):
    """By URL, the bytes hashed are the bytes served (one transfer): reading every chunk
    checks and returns the same values as the local store."""
    served = tmp_path / "served"
    root = copy_store(pristine, "npy-none", served / "store")
    want = shardload.open_store(root, verify="never").read("x")
    with serving(served) as url:
        s = shardload.open_store(url + "store")
        np.testing.assert_array_equal(s.read("x", 5, 40), want[5:40])
        np.testing.assert_array_equal(s.read("x"), want)
        assert s.reader.verifier.hashed == NUM_CHUNKS  # type: ignore[attr-defined]


def _hashed_in_a_new_process(root: Path) -> int:
    code = (
        "import shardload, sys\n"
        f"s = shardload.open_store({str(root)!r})\n"
        "for _ in shardload.iter_batches(s, batch_size=16, seed=1, arrays=['x']): pass\n"
        "print(s.reader.verifier.hashed)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", ["npy-none", "zarr-none", "zarr-zstd"])
def test_a_chunk_is_hashed_once_per_node(pristine, tmp_path, kind):
    root = copy_store(pristine, kind, tmp_path / "store")
    want = shardload.open_store(root, verify="never").read("x")
    first = shardload.open_store(root)
    np.testing.assert_array_equal(first.read("x"), want)
    assert first.reader.verifier.hashed == NUM_CHUNKS  # type: ignore[attr-defined]
    np.testing.assert_array_equal(first.read("x"), want)  # this process: checked already
    again = shardload.open_store(root)  # another handle, as a new DataLoader worker has
    np.testing.assert_array_equal(again.read("x"), want)
    assert again.reader.verifier.hashed == 0  # type: ignore[attr-defined]
    assert _hashed_in_a_new_process(root) == 0  # another process of this node

    # a chunk rewritten (new inode, size, mtime) is hashed again, alone; a bad rewrite is caught
    bad = chunk_file(root, kind)
    data = bad.read_bytes()
    os.unlink(bad)
    bad.write_bytes(data)
    s = shardload.open_store(root)
    np.testing.assert_array_equal(s.read("x"), want)
    assert s.reader.verifier.hashed == 1  # type: ignore[attr-defined]
    flip_byte(bad)  # same inode and size, a new mtime
    with pytest.raises(ChunkReadError, match="corrupt"):
        shardload.open_store(root).read("x")


def test_a_touched_chunk_is_hashed_again(pristine, tmp_path):
    root = copy_store(pristine, "npy-none", tmp_path / "store")
    shardload.open_store(root).read("x")
    st = chunk_file(root, "npy-none").stat()
    os.utime(chunk_file(root, "npy-none"), ns=(st.st_atime_ns, st.st_mtime_ns + 1000))
    s = shardload.open_store(root)
    s.read("x")
    assert s.reader.verifier.hashed == 1  # type: ignore[attr-defined]


def test_a_store_prepared_again_in_place_is_hashed_again(pristine, tmp_path):
    """The ledger belongs to one version of the store's checksum file."""
    root = copy_store(pristine, "npy-none", tmp_path / "store")
    shardload.open_store(root).read("x")
    sums = root / "checksums.npz"
    data = sums.read_bytes()
    sums.unlink()
    sums.write_bytes(data)
    s = shardload.open_store(root)
    s.read("x")
    assert s.reader.verifier.hashed == NUM_CHUNKS  # type: ignore[attr-defined]


@pytest.mark.parametrize("where", ["off", "a file"])
def test_no_ledger_checks_once_per_process(pristine, tmp_path, monkeypatch, where):
    """Ledger off, or its folder impossible to create: every process checks every chunk."""
    if where == "a file":
        (tmp_path / "f").write_text("not a folder")
    monkeypatch.setenv(ledger_mod.LEDGER_ENV, "off" if where == "off" else str(tmp_path / "f"))
    root = copy_store(pristine, "npy-none", tmp_path / "store")
    for _ in range(2):
        s = shardload.open_store(root)
        s.read("x")
        s.read("x")
        assert s.reader.verifier.hashed == NUM_CHUNKS  # type: ignore[attr-defined]


def test_garbled_ledger_trusts_nothing(pristine, tmp_path, monkeypatch):
    monkeypatch.setenv(ledger_mod.LEDGER_ENV, str(tmp_path / "ledgers"))
    root = copy_store(pristine, "zarr-none", tmp_path / "store")
    shardload.open_store(root).read("x")
    (path,) = (tmp_path / "ledgers").glob("*.v1")
    data = bytearray(path.read_bytes())
    for a in range(0, len(data), RECORD.itemsize):
        data[a + 9] ^= 0xFF  # every record's size field
    path.write_bytes(bytes(data) + b"torn")
    s = shardload.open_store(root)
    s.read("x")
    assert s.reader.verifier.hashed == NUM_CHUNKS  # type: ignore[attr-defined]
    assert _hashed_in_a_new_process(root) == 0  # re-recorded, after the torn tail


def _fake_stat(i: int) -> SimpleNamespace:
    return SimpleNamespace(st_size=1000 + i, st_mtime_ns=10**18 + i, st_ino=i, st_dev=7)


_WRITER = """
import sys
from types import SimpleNamespace
from shardload.formats.ledger import Ledger
path, root, who, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
led = Ledger(__import__("pathlib").Path(path), root)
for i in range(n):
    k = who * n + i
    st = SimpleNamespace(st_size=1000 + k, st_mtime_ns=10**18 + k, st_ino=k, st_dev=7)
    led.record(f"{root}/x/{k}", st, k * 31)
    if i % 50 == 0:
        led.trusted(f"{root}/x/{k}", st)  # reads while others append
"""


def test_concurrent_ledger_writers_keep_every_record(tmp_path, monkeypatch):
    """Four processes append to one ledger at once (one also leaves a torn record first):
    every record of every writer reads back, nothing else does."""
    path = tmp_path / "ledger.v1"
    path.write_bytes(b"x" * 13)  # a torn record, as a killed writer leaves
    procs, n = 4, 400
    env = {**os.environ, "PYTHONPATH": SRC}
    running = [
        subprocess.Popen(
            [sys.executable, "-c", _WRITER, str(path), "/store", str(w), str(n)], env=env
        )
        for w in range(procs)
    ]
    assert all(p.wait(timeout=120) == 0 for p in running)
    assert path.stat().st_size == procs * n * RECORD.itemsize
    got = parse_records(path.read_bytes())
    assert len(got) == procs * n
    led = Ledger(path, "/store")
    for k in range(procs * n):
        assert got[led.key(f"/store/x/{k}")][4] == k * 31
        assert led.trusted(f"/store/x/{k}", _fake_stat(k))  # type: ignore[arg-type]
        assert not led.trusted(f"/store/x/{k}", _fake_stat(k + 1))  # type: ignore[arg-type]


def test_ledger_compacts_to_the_latest_record_of_each_file(tmp_path, monkeypatch):
    monkeypatch.setattr(ledger_mod, "COMPACT_MIN", 10)
    path = tmp_path / "ledger.v1"
    led = Ledger(path, "/store")
    for rep in range(10):
        for k in range(5):
            led.record(f"/store/x/{k}", _fake_stat(k + rep), k)  # type: ignore[arg-type]
    assert path.stat().st_size == 50 * RECORD.itemsize
    other = Ledger(path, "/store")  # a reader finds 50 records for 5 files: compacts
    assert other.trusted("/store/x/0", _fake_stat(9))  # type: ignore[arg-type]
    assert path.stat().st_size == 5 * RECORD.itemsize
    assert not other.trusted("/store/x/0", _fake_stat(0))  # type: ignore[arg-type]
    led.record("/store/x/9", _fake_stat(9), 9)  # type: ignore[arg-type]
    assert Ledger(path, "/store").trusted("/store/x/9", _fake_stat(9))  # type: ignore[arg-type]


def test_default_refuses_a_flipped_bit_in_an_npy_squashfs_image(pristine, tmp_path, monkeypatch):
    """A byte garbled inside a SquashFS image (uncompressed, so the filesystem cannot notice)
    is caught by the chunk's checksum when the image is read with the defaults."""
    from shardload.move import mount as squashfs
    from shardload.move.pack import pack
    from test_squashfs import _fuse_problem, wait_unmounted

    problem = _fuse_problem()
    if problem:
        pytest.skip(f"SquashFS tests need the real tools: {problem}")
    monkeypatch.setenv(squashfs.MOUNT_DIR_ENV, str(tmp_path / "mounts"))
    img = pack(pristine["npy-none"], tmp_path / "store.sqfs", compression="none")
    chunk = chunk_file(pristine["npy-none"], "npy-none").read_bytes()
    tail = chunk[-64:]  # the chunk's last row and a half: found once in the image
    data = bytearray(img.read_bytes())
    assert data.count(tail) == 1
    data[data.index(tail) + 61] ^= 0x10
    img.write_bytes(bytes(data))
    s = shardload.open_store(img)
    try:
        with pytest.raises(ChunkReadError, match="corrupt") as err:
            s.read("x")
        assert f"{BAD:06d}.npy" in str(err.value)
    finally:
        squashfs.unmount(img)
        wait_unmounted(s.root)
