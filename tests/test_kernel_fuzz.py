"""Shards damaged after their checksum was checked (or never checked), read by the compiled
kernel (formats/zarr/shard_rows.py) and by the gather reader: both raise an error naming the
shard, or both serve the same batches; never a crash, and a damaged Blosc header never decodes
silently to other values (tests/_kernelfuzz.py does the damage and the comparison, in a
subprocess, so a crash fails the test with its seed)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ChunkReadError

pytestmark = pytest.mark.timeout(600)

HERE = Path(__file__).resolve().parent
SRC = str(Path(shardload.__file__).resolve().parents[1])  # the shardload under test
N, ROWS, PER_SHARD = 1021, 8, 16


def _kernel() -> Any:
    from shardload.formats.zarr import shard_rows

    if shard_rows.KERNEL is None:
        pytest.skip("shardload's compiled kernel is not built (setup.py build_ext)")
    return shard_rows


@pytest.fixture(scope="module", params=["default", "zstd"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store prepared with the defaults (x: Blosc-lz4, byte shuffle) or zstd, from values
    that compress."""
    root = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(N, 3, 12)) * 2).astype("f4")
    src = root / "src.nc"
    xr.Dataset({"a": (("time", "l", "f"), x)}).to_netcdf(src)
    config: dict[str, Any] = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["time"],
        "arrays": {"x": ["a"]},
        "chunk_rows": ROWS,
        "shard_chunks": PER_SHARD,
        "out": str(root / "store"),
    }
    if request.param != "default":
        config["compression"] = request.param
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(config)
    return root / "store"


def _campaign(store: Path, tmp_path: Path, first: int, count: int) -> None:
    """``count`` seeded cases from ``first`` in a subprocess: a crash fails with its seed."""
    _kernel()
    root = tmp_path / "s"
    shutil.copytree(store, root)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]),
        "SHARDLOAD_VERIFY_LEDGER": str(tmp_path / "ledger"),
    }
    cmd = [sys.executable, str(HERE / "_kernelfuzz.py"), str(root), str(first), str(count)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=550)
    seeds = [line for line in res.stdout.splitlines() if line.startswith("seed ")]
    bad = [line for line in res.stdout.splitlines() if line.startswith("MISMATCH")]
    assert res.returncode == 0, (
        f"exit {res.returncode} at {seeds[-1] if seeds else 'start'}: {bad} {res.stderr[-3000:]}"
    )
    assert f"done {count} cases, 0 mismatches" in res.stdout


def test_damaged_shards_read_alike_by_the_kernel_and_the_gather_reader(
    store: Path, tmp_path: Path
) -> None:
    """80 seeded damages (header bits, bytes and fields, block starts, compressed bytes,
    shorter chunks, index entries rewritten with their crc32c, files cut or extended), each
    read with ``verify="never"`` or in a second epoch after the first one checked the shard:
    the kernel and the gather reader agree (both an error naming the shard, or the same
    batches), a damaged header never decodes to other values, no crash."""
    _campaign(store, tmp_path, 200, 80)


@pytest.mark.slow
def test_a_longer_campaign_of_damaged_shards(store: Path, tmp_path: Path) -> None:
    """As above, 2,000 other seeds."""
    _campaign(store, tmp_path, 10_000, 2_000)


def _flip(shard: Path, chunk: int, at: int, value: int | None) -> None:
    """Byte ``at`` of inner chunk ``chunk``'s Blosc header set to ``value`` (None: its lowest
    bit cleared)."""
    data = bytearray(shard.read_bytes())
    index = np.frombuffer(bytes(data[-4 - 16 * PER_SHARD : -4]), "<u8").reshape(-1, 2)
    at += int(index[chunk, 0])
    data[at] = data[at] & ~1 if value is None else value
    shard.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "at, value, what",
    [(2, None, "shuffle flags 0x0"), (3, 1, "items of 1 bytes")],
    ids=["shuffle-bit", "typesize-1"],
)
def test_a_header_that_decodes_to_other_values_is_an_error_in_every_reader(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int, value: Any, what: str
) -> None:
    """A chunk's Blosc header with its byte-shuffle bit cleared, or its type size 1 for 4-byte
    floats, decodes without an error (to bytes never unshuffled): the kernel and the gather
    reader refuse it alike, naming the chunk, where both served the wrong values."""
    mod = _kernel()
    root = tmp_path / "s"
    shutil.copytree(store, root)
    shard = sorted((root / "x" / "c").glob("*/0"), key=lambda p: int(p.parent.name))[1]
    _flip(shard, 5, at, value)  # inner chunk 5 of shard 1: chunk 21
    errors = []
    for kernel in (mod.KERNEL, None):
        monkeypatch.setattr(mod, "KERNEL", kernel)
        with pytest.raises(ChunkReadError) as err:
            store_ = shardload.open_store(root, verify="never")
            list(shardload.iter_batches(store_, batch_size=40, seed=3, split=None))
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "chunk 21 (inner chunk 5 of shard 1)" in errors[0] and what in errors[0]


def test_a_kernel_built_from_other_sources_is_not_used() -> None:
    """An extension whose ``decode_rows`` takes other arguments (an old build beside newer
    sources) is not called: the loader gathers, as without one."""
    mod = _kernel()

    class Old:
        def decode_rows(self, *a: Any) -> int:  # pragma: no cover - never called
            raise AssertionError

    assert mod.usable(mod.KERNEL) is mod.KERNEL
    assert mod.usable(Old()) is None


def test_a_shard_replaced_between_epochs_is_read_with_its_own_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked in the first epoch (``verify="first-epoch"``), a shard file rewritten before
    the next with the same chunks in another order (each of the same size): the kernel and
    the gather reader read it with its new index, not the one kept from the first epoch (whose
    offsets now hold other chunks, which decode without an error)."""
    mod = _kernel()
    x = np.repeat(np.arange(N // ROWS + 1, dtype="f4"), ROWS)[:N, None] * np.ones(36, "f4")
    src = tmp_path / "src.nc"
    xr.Dataset({"a": (("time", "f"), x)}).to_netcdf(src)
    root = tmp_path / "store"
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "arrays": {"x": ["a"]},
            "chunk_rows": ROWS,
            "shard_chunks": PER_SHARD,
            "compression": "lz4",
            "out": str(root),
        }
    )
    shard = root / "x" / "c" / "1" / "0"
    data = shard.read_bytes()
    index = np.frombuffer(data[-4 - 16 * PER_SHARD : -4], "<u8").reshape(-1, 2).copy()
    assert len(set(index[:, 1].tolist())) == 1  # every chunk the same size
    chunks = [data[int(o) : int(o + n)] for o, n in index.tolist()]
    rev = b"".join(chunks[::-1])
    index[:, 0] = index[::-1, 0]
    raw = index.astype("<u8").tobytes()
    crc = int(__import__("google_crc32c").value(raw)).to_bytes(4, "little")
    kw: dict[str, Any] = {"batch_size": 40, "seed": 3, "split": None}
    for kernel in (mod.KERNEL, None):
        monkeypatch.setattr(mod, "KERNEL", kernel)
        shard.write_bytes(data)
        store = shardload.open_store(root, verify="first-epoch")
        list(shardload.iter_batches(store, epoch=0, **kw))
        shard.write_bytes(rev + raw + crc)
        for b in shardload.iter_batches(store, epoch=1, **kw):
            np.testing.assert_array_equal(np.asarray(b["x"]), x[np.asarray(b["index"])])
