"""Damaged shards read by the compiled kernel and by the gather reader (tests/test_kernel_fuzz.py,
benchmarks/fuzz_decode_rows.py): a shard of a prepared store damaged after its checksum was
checked (or with ``verify="never"``), both readers run over it, and their outcomes compared.

Run as a script, so that a crash is a failure naming its seed rather than a dead pytest::

    python tests/_kernelfuzz.py STORE FIRST_SEED COUNT

prints ``seed S`` (flushed) before each case and ``MISMATCH ...`` for each case whose readers
disagree; exit status 1 on a mismatch. Each case: a seeded damage of one shard of array ``x``
(:func:`damage`), read in one of the ``MODES``, by the kernel and by the gather reader; both
must raise a :class:`~shardload.errors.ShardloadError` naming the shard, or both yield the same
batches, and a damaged Blosc header (``HEADER`` kinds) yields the store's own values or an
error (Blosc has no checksum of its data: damaged compressed bytes, block starts or index
entries can decode to other values, which only ``verify`` catches). The shard is restored after
each case.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np

KINDS = (
    "header-bit",
    "header-byte",
    "header-field",
    "bstarts",
    "data",
    "shrink",
    "index",
    "truncate",
    "extend",
)
HEADER = ("header-bit", "header-byte", "header-field")
#: ``never``: a fresh store with ``verify="never"``; ``first-epoch``/``auto``: epoch 0 read
#: (checking every shard), then the damage (``auto``: in place, size/mtime kept), then epoch 1.
MODES = ("never", "first-epoch", "auto")
KW: dict[str, Any] = {"batch_size": 40, "seed": 3, "split": None, "arrays": ["x"]}
EDGES = (0, 1, 2, 3, 4, 7, 8, 15, 16, 17, 255, 256, 1 << 15, (1 << 31) - 1, 1 << 31, (1 << 32) - 1)


def shards(root: Path) -> list[Path]:
    """The shard files of array ``x``, by shard number."""
    return sorted((root / "x" / "c").glob("*/0"), key=lambda p: int(p.parent.name))


def _index(data: bytes | bytearray, per: int) -> np.ndarray:
    at = len(data) - 4 - 16 * per
    return np.frombuffer(bytes(data[at:-4]), "<u8").reshape(per, 2).astype(np.int64)


def _set_index(data: bytearray, per: int, index: np.ndarray) -> None:
    at = len(data) - 4 - 16 * per
    raw = np.asarray(index, "<u8").tobytes()
    data[at:-4] = raw
    data[-4:] = int(google_crc32c.value(raw)).to_bytes(4, "little")


def _u32(data: bytearray, at: int, v: int) -> None:
    data[at : at + 4] = (int(v) & 0xFFFFFFFF).to_bytes(4, "little")


def damage(data: bytes, per: int, rng: np.random.Generator, kind: str) -> bytes:
    """``data`` (a shard file of ``per`` inner chunks, index at the end with its crc32c)
    damaged as ``kind`` says, at places and values drawn from ``rng``."""
    out = bytearray(data)
    index = _index(data, per)
    j = int(rng.integers(per))
    off, size = (int(v) for v in index[j])
    nblocks = max(1, (size - 16) // 4) if size > 16 else 1
    if kind == "header-bit":  # one bit of the flags, type size or sizes
        out[off + int(rng.choice([2, 3, 4, 5, 8, 9, 12, 13]))] ^= 1 << int(rng.integers(8))
    elif kind == "header-byte":
        out[off + int(rng.integers(16))] ^= int(rng.integers(1, 256))
    elif kind == "header-field":
        field = int(rng.integers(5))
        if field == 0:  # flags
            out[off + 2] = int(rng.integers(256))
        elif field == 1:  # typesize
            out[off + 3] = int(rng.choice([0, 1, 2, 3, 4, 5, 8, 16, 255]))
        else:  # nbytes, blocksize, cbytes
            v = int(rng.choice(EDGES)) if rng.random() < 0.6 else int(rng.integers(1 << 32))
            _u32(out, off + 4 * field, v)
    elif kind == "bstarts":
        slot = off + 16 + 4 * int(rng.integers(min(nblocks, 8)))
        choices = (0, 15, 16, 17, size - 4, size - 1, size, size + 1, (1 << 31) - 1, 1 << 31)
        _u32(out, slot, int(rng.choice(choices)) if rng.random() < 0.7 else rng.integers(1 << 32))
    elif kind == "data":
        for _ in range(int(rng.integers(1, 9))):
            out[off + int(rng.integers(16, size))] ^= int(rng.integers(1, 256))
    elif kind == "shrink":  # header and index agree on a shorter chunk: its blocks run past it
        new = int(rng.integers(16, size))
        _u32(out, off + 12, new)
        index[j, 1] = new
        _set_index(out, per, index)
    elif kind == "index":
        hi = len(data) - 4 - 16 * per
        how = int(rng.integers(6))
        if how == 0:  # past the end of the data
            index[j] = (hi - int(rng.integers(0, size)), size)
        elif how == 1:  # overlapping another chunk (or a few bytes into one)
            o = int(rng.integers(per))
            index[j] = (index[o, 0] + int(rng.integers(0, 3)), index[o, 1])
        elif how == 2:  # 0-15 bytes
            index[j, 1] = int(rng.integers(16))
        elif how == 3:  # huge sizes or offsets
            v = int(rng.choice([1 << 31, 1 << 40, (1 << 62), (1 << 63) - 1, (1 << 63) + 5]))
            index[j, int(rng.integers(2))] = v if v < (1 << 63) else v - (1 << 64)
        elif how == 4:  # one entry "never written" (offset only)
            index[j, 0] = -1
        else:  # the whole shard's entries shuffled
            index = index[rng.permutation(per)]
        _set_index(out, per, index)
    elif kind == "truncate":
        return bytes(out[: int(rng.integers(0, len(out)))])
    elif kind == "extend":
        return bytes(out) + rng.integers(0, 256, int(rng.integers(1, 4096)), np.uint8).tobytes()
    else:  # pragma: no cover
        raise ValueError(kind)
    return bytes(out)


def _epoch(store: Any, epoch: int) -> list[dict[str, np.ndarray]]:
    import shardload

    it = shardload.iter_batches(store, epoch=epoch, **KW)
    return [{k: np.array(v) for k, v in b.items()} for b in it]


def _outcome(store: Any, epoch: int) -> tuple[str, Any]:
    from shardload.errors import ShardloadError

    try:
        return "ok", _epoch(store, epoch)
    except ShardloadError as exc:
        return "error", f"{type(exc).__name__}: {exc}"


def run_case(root: Path, seed: int, *, kernel: Any, truth: dict[int, Any]) -> str | None:
    """One seeded case; None when the two readers agree, else what differs (``truth``: the
    undamaged store's epochs 0 and 1)."""
    import shardload
    from shardload.formats.zarr import shard_rows

    rng = np.random.default_rng(seed)
    kind, mode = KINDS[int(rng.integers(len(KINDS)))], MODES[int(rng.integers(len(MODES)))]
    files = shards(root)
    k = int(rng.integers(len(files)))
    shard, per = files[k], _per(root)
    orig = shard.read_bytes()
    bad = damage(orig, per, rng, kind)
    got = []
    try:
        for use in (kernel, None):
            shard_rows.KERNEL = use
            shard.write_bytes(orig)
            if mode == "never":
                store = shardload.open_store(root, verify="never")
                shard.write_bytes(bad)
                got.append(_outcome(store, 0))
                continue
            store = shardload.open_store(root, verify=mode)
            _epoch(store, 0)  # every shard checked
            st = os.stat(shard)
            with open(shard, "r+b") as f:  # in place: same inode
                f.write(bad)
                f.truncate(len(bad))
            os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))
            got.append(_outcome(store, 1))
    finally:
        shard.write_bytes(orig)
        shard_rows.KERNEL = kernel
    what = f"seed {seed}: {kind} of shard {k}, {mode}"
    (a, va), (b, vb) = got
    if a != b:
        return f"{what}: kernel {a} ({_short(va)}), gather {b} ({_short(vb)})"
    if a == "error":
        for v in (va, vb):
            if f"shard {k}" not in v or str(shard) not in v:
                return f"{what}: an error not naming the shard and file: {v}"
        return None
    if len(va) != len(vb):
        return f"{what}: {len(va)} batches from the kernel, {len(vb)} from the gather reader"
    for i, (x, y) in enumerate(zip(va, vb, strict=True)):
        for key in x:
            if not np.array_equal(x[key], y[key], equal_nan=x[key].dtype.kind == "f"):
                return f"{what}: batch {i} {key!r} differs between the kernel and the gather"
    want = truth[0 if mode == "never" else 1]
    same = len(va) == len(want) and all(
        np.array_equal(x["x"], t["x"]) for x, t in zip(va, want, strict=True)
    )
    if kind in HEADER and not same:
        return f"{what}: the damaged header decoded to other values, served silently"
    return None


def truths(root: Path) -> dict[int, Any]:
    """The undamaged store's epochs 0 and 1 (gather reader)."""
    import shardload
    from shardload.formats.zarr import shard_rows

    kernel, shard_rows.KERNEL = shard_rows.KERNEL, None
    try:
        store = shardload.open_store(root, verify="never")
        return {e: _epoch(store, e) for e in (0, 1)}
    finally:
        shard_rows.KERNEL = kernel


def _short(v: Any) -> str:
    return v if isinstance(v, str) else f"{len(v)} batches"


def _per(root: Path) -> int:
    """Inner chunks per shard of array ``x``."""
    import json

    meta = json.loads((root / "x" / "zarr.json").read_text())
    inner = meta["codecs"][0]["configuration"]["chunk_shape"][0]
    return int(meta["chunk_grid"]["configuration"]["chunk_shape"][0] // inner)


def main(argv: list[str]) -> int:
    from shardload.formats.zarr import shard_rows

    root, first, count = Path(argv[0]), int(argv[1]), int(argv[2])
    kernel = shard_rows.KERNEL
    if kernel is None:
        print("no kernel built", flush=True)
        return 2
    bad, truth = 0, truths(root)
    for seed in range(first, first + count):
        print(f"seed {seed}", flush=True)
        msg = run_case(root, seed, kernel=kernel, truth=truth)
        if msg:
            bad += 1
            print(f"MISMATCH {msg}", flush=True)
    print(f"done {count} cases, {bad} mismatches", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
