"""Shards of compressed inner chunks (the default layout of values that compress, issue 25)
decoded straight into their batches (load/decoded.py, formats/zarr/shard_rows.py): no group
buffer and no gather pass, the batches byte for byte the gather reader's (what an install
without the compiled kernel reads), every shard checked before its rows are used, and a damaged
chunk named as the gather reader names it."""

from __future__ import annotations

import contextlib
import importlib
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ChunkReadError
from shardload.load import gather, reader

pytestmark = pytest.mark.timeout(300)

N, ROWS, PER_SHARD, FEATURES = 1021, 8, 16, 12  # 128 inner chunks (the last of 5 rows), 8 shards
KW: dict[str, Any] = {"batch_size": 40, "seed": 3, "split": None}


def _kernel() -> Any:
    """The module holding the compiled kernel, or a skip where it is not built."""
    mod = importlib.import_module("shardload.formats.zarr.shard_rows")
    if mod.KERNEL is None:
        pytest.skip("shardload's compiled kernel is not built (setup.py build_ext)")
    return mod


def _kernel_if_any() -> Any:
    """As :func:`_kernel`, but None for a shardload without it (it gathers)."""
    try:
        importlib.import_module("shardload.formats.zarr.shard_rows")
    except ModuleNotFoundError:
        return None
    return _kernel()


@pytest.fixture(scope="module")
def values() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    x = np.round(rng.normal(size=(N, 3, FEATURES)) * 2).astype("f4")  # lz4 shrinks it
    return {"x": x, "y": (np.arange(N, dtype="i8") * 7) % 13}  # x is stored as (N, 36)


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory, values: dict[str, np.ndarray]) -> Path:
    root = tmp_path_factory.mktemp("decode")
    src = root / "src.nc"
    xr.Dataset({"a": (("time", "l", "f"), values["x"]), "b": ("time", values["y"])}).to_netcdf(src)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    prepare(
        {
            "source": {"paths": [str(src)]},
            "sample_dims": ["time"],
            "arrays": {"x": ["a"], "y": ["b"]},
            "chunk_rows": ROWS,
            "shard_chunks": PER_SHARD,
            "compression": "lz4",
            "out": str(root / "lz4"),
        }
    )
    return root / "lz4"


def _epoch(store: Any, epoch: int = 0, **kw: Any) -> list[dict[str, np.ndarray]]:
    it = shardload.iter_batches(store, epoch=epoch, **{**KW, **kw})
    return [{k: np.array(v) for k, v in b.items()} for b in it]


def _same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k


def _shards(root: Path) -> list[Path]:
    """The shard files of ``x`` (stored as (N, 36)), by shard number."""
    return sorted((root / "x" / "c").glob("*/0"), key=lambda p: int(p.parent.name))


def _counting(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Counts of group buffers taken and gathers run."""
    seen = {"buffers": 0, "gathers": 0}
    take, gath = reader.BufferPool.take, gather._gather

    def counted_take(self: Any, *a: Any) -> Any:
        seen["buffers"] += 1
        return take(self, *a)

    def counted_gather(*a: Any) -> Any:
        seen["gathers"] += 1
        return gath(*a)

    monkeypatch.setattr(reader.BufferPool, "take", counted_take)
    monkeypatch.setattr(gather, "_gather", counted_gather)
    return seen


@pytest.mark.parametrize(
    "options",
    [{}, {"threads": 2, "shuffle_chunks": 5}, {"shuffle": False}, {"piece_rows": 3}],
    ids=["default", "threads", "in-order", "pieces"],
)
def test_compressed_shards_are_decoded_into_the_batches_the_gathers_yield(
    stores: Path, values: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch, options: dict
) -> None:
    """Two epochs of the default load (and of other groups: threads, small groups, no
    shuffle, pieces of chunks): no group buffer taken and no gather run, each batch's rows the
    store's, and the batches byte for byte those of the gather reader, which an install
    without the kernel uses (taking group buffers and gathering)."""
    mod = _kernel_if_any()
    seen = _counting(monkeypatch)
    got = [_epoch(stores, e, **options) for e in (0, 1)]
    assert seen == {"buffers": 0, "gathers": 0}
    for e in (0, 1):
        for b in got[e]:
            for k in ("x", "y"):
                np.testing.assert_array_equal(b[k], values[k][b["index"]].reshape(b[k].shape))
    monkeypatch.setattr(mod, "KERNEL", None)
    for e in (0, 1):
        _same(got[e], _epoch(stores, e, **options))
    assert seen["buffers"] and seen["gathers"]


def test_a_resumed_epoch_is_decoded_as_a_fresh_one(stores: Path) -> None:
    """Resumed mid-epoch (from a saved state: groups partly read, segments of explicit rows;
    and per worker with ``skip_batches``), 2 ranks of 2 workers: exactly the rest of the
    fresh epoch (tests/_resume.py)."""
    from _resume import assert_resumes_exactly

    _kernel()
    assert_resumes_exactly(stores, world=2, workers=2, consumed=(1, 3), batch_size=16, seed=3)


def test_a_kernel_call_serves_a_shard_of_a_read_task(
    stores: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The per-chunk work runs in C: one kernel call per shard a read task touches, not one
    per inner chunk."""
    mod = _kernel()
    calls: list[int] = []
    real = mod.KERNEL

    class Counted:
        def decode_rows(self, *a: Any) -> int:
            calls.append(a[5] - a[4])  # chunks asked for
            return int(real.decode_rows(*a))

    monkeypatch.setattr(mod, "KERNEL", Counted())
    _epoch(stores, shuffle_chunks=32, threads=2)  # 4 groups of chunks from most of 8 shards
    chunks = -(-N // ROWS)
    assert sum(calls) == 2 * chunks  # each chunk of x and of y decoded once
    # a group's rows, sorted, cut into 2 tasks: at most 8 shards + 1 calls per array and group
    assert len(calls) <= 2 * 4 * (8 + 1) < 2 * chunks


def _damage(root: Path, chunk: int, how: str) -> Path:
    """Inner chunk ``chunk`` of x's shard file damaged: its compressed bytes or header."""
    shard = _shards(root)[chunk // PER_SHARD]
    data = bytearray(shard.read_bytes())
    at = len(data) - 4 - 16 * PER_SHARD
    off, size = np.frombuffer(bytes(data[at:-4]), "<u8").reshape(PER_SHARD, 2)[chunk % PER_SHARD]
    if how == "header":
        data[off + 12 : off + 16] = int(size + 1).to_bytes(4, "little")  # compressed size
    elif how == "shuffle":  # the byte-shuffle flag cleared: decodes to bytes never unshuffled
        data[off + 2] ^= 0x01
    else:
        data[off + 16 : off + size] = b"\xff" * (int(size) - 16)  # no longer Blosc-lz4
    shard.write_bytes(bytes(data))
    return shard


@pytest.mark.parametrize("how", ["header", "shuffle", "body"])
def test_a_damaged_chunk_is_named_as_the_gather_reader_names_it(
    stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """Checksums not verified (``verify="never"``): a chunk whose header or compressed bytes
    are damaged stops the epoch with the gather reader's error, naming the chunk and file."""
    mod = _kernel()
    root = tmp_path / "s"
    shutil.copytree(stores, root)
    shard = _damage(root, 21, how)
    errors = []
    for kernel in (mod.KERNEL, None):
        monkeypatch.setattr(mod, "KERNEL", kernel)
        with pytest.raises(ChunkReadError) as err:
            _epoch(shardload.open_store(root, verify="never"))
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "chunk 21 (inner chunk 5 of shard 1)" in errors[0] and str(shard) in errors[0]


def test_a_shard_is_checked_before_its_rows_are_decoded(
    stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With checksums verified (the default), a damaged shard is refused by its checksum
    before any of its chunks is decoded: no kernel call reads it."""
    mod = _kernel()
    root = tmp_path / "s"
    shutil.copytree(stores, root)
    _damage(root, 21, "body")
    fds: list[int] = []
    real = mod.KERNEL

    class Counted:
        def decode_rows(self, *a: Any) -> int:
            fds.append(a[1])
            return int(real.decode_rows(*a))

    monkeypatch.setattr(mod, "KERNEL", Counted())
    opened: list[str] = []
    real_open = mod.ChunkLayout.open

    def spy(self: Any, path: str) -> Any:
        opened.append(path)
        return real_open(self, path)

    monkeypatch.setattr(mod.ChunkLayout, "open", spy)
    with pytest.raises(ChunkReadError, match=r"shard 1 of array 'x' is corrupt: .* checksum"):
        _epoch(shardload.open_store(root), threads=1)
    assert str(_shards(root)[1]) not in opened


def test_a_shard_truncated_after_its_check_is_named_as_the_gather_reader_names_it(
    stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Checked in the first epoch, a shard cut short before the next one: the same error as
    the gather reader's (its index read again, the file being another version), naming the
    shard and file."""
    mod = _kernel()
    root = tmp_path / "s"
    shutil.copytree(stores, root)
    store = shardload.open_store(root)
    _epoch(store)
    bad = _shards(root)[3]
    data = bad.read_bytes()
    bad.write_bytes(data[: len(data) // 2])
    errors = []
    for kernel in (mod.KERNEL, None):
        monkeypatch.setattr(mod, "KERNEL", kernel)
        with pytest.raises(ChunkReadError) as err:
            _epoch(store, 1)
        errors.append(str(err.value))
    assert errors[0] == errors[1]
    assert "shard 3 of array 'x' is corrupt" in errors[0] and str(bad) in errors[0]


def test_decoded_stores_keep_no_group_buffers_for_workers(
    stores: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No shared group-buffer arena is mapped for DataLoader workers that decode into their
    batches (load/arena.py); without the kernel, the gather reader's workers get one."""
    from shardload.load.arena import group_arena
    from shardload.load.spec import LoadSpec

    mod = _kernel()
    assert group_arena(LoadSpec.build(stores, batch_size=40), workers=2) is None
    monkeypatch.setattr(mod, "KERNEL", None)
    assert group_arena(LoadSpec.build(stores, batch_size=40), workers=2) is not None


def test_an_unexpected_error_in_a_decode_names_the_rows_and_array(
    stores: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardload.formats.zarr.read import ZarrReader

    _kernel()

    def boom(self: Any, name: str, rows: Any, to: Any) -> None:
        raise RuntimeError("boom")

    monkeypatch.setattr(ZarrReader, "decode_rows_into", boom)
    with pytest.raises(
        ChunkReadError, match=r"rows \d+\.\.\d+ of array '(x|y)' in .*: RuntimeError: boom"
    ):
        _epoch(stores)


@pytest.mark.parametrize(("world", "by_url"), [(3, False), (7, False), (3, True)])
def test_a_row_padded_into_its_own_group_is_decoded_at_both_places(
    stores: Path, values: dict[str, np.ndarray], world: int, by_url: bool
) -> None:
    """``mode="pad"`` repeats rows to give every rank equal batches. An epoch saved on
    ``world`` ranks (before any batch) and resumed on one rank keeps the repeats, so one
    group holds a row twice: both places get its values. The kernel took each row once,
    leaving the other batch row as recycled batch memory left it (found by
    tests/test_resume_property.py's sweep: row 145 served as row 91). Locally and by URL
    (each shard's bytes decoded by the kernel as they arrive)."""
    from _paths_run import served

    _kernel()
    with served(stores.parent) if by_url else contextlib.nullcontext() as base:
        _padded_resumed(f"{base}{stores.name}/" if by_url else str(stores), values, world)


def _padded_resumed(where: str, values: dict[str, np.ndarray], world: int) -> None:
    from shardload.load.select import store_fingerprint
    from shardload.load.spec import loader_selection, plan_for
    from shardload.plan.resume import plan_state

    store = shardload.open_store(where)
    for shuffle in (False, True):
        kw = {**KW, "batch_size": 7, "mode": "pad", "shuffle": shuffle, "epoch": 0}
        sel, _, group = loader_selection(store, split=None, shuffle=shuffle)
        opts = {k: kw[k] for k in ("batch_size", "seed", "mode", "shuffle", "epoch")}
        opts["drop_last"] = False
        plan = plan_for(store, sel, world_size=world, num_workers=0, shuffle_chunks=group, **opts)
        assert plan.num_padded > 0
        state = {**plan_state(plan, 0).to_dict(), "dataset": store_fingerprint(store, sel)}
        rows = []
        for b in shardload.iter_batches(store, state=state, **kw):  # batch memory recycled
            for k in ("x", "y"):
                np.testing.assert_array_equal(b[k], values[k][b["index"]].reshape(b[k].shape))
            rows.append(np.array(b["index"]))
        got = np.concatenate(rows)
        assert len(got) == N + plan.num_padded and len(np.unique(got)) == N


def test_every_caller_of_the_kernel_expects_the_built_abi() -> None:
    """The extension's callers (the decode and URL kernels in shard_rows.py, staged raw reads in
    load/runs.py) each check its ``ABI`` before calling it: the numbers must be one, or a
    caller silently falls back to its slower path (two branches each raised it to 4)."""
    from shardload.load import runs

    mod = _kernel()
    assert runs.KERNEL_ABI == mod.ABI == mod._compiled.ABI
    assert runs._kernel() is not None
