"""The machine's limits for ``bench_load.py``: memcpy, page-cache read, zstd read + decode
(chunk files, or shard files of small chunks).

Each function returns a dict of rates in bytes/s of *decoded* (array) data and the variant that
won; the caller divides loader rates by the winner. Files must be in the page cache already.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np


def _best(fn: Callable[[], Any], repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def memcpy_rate(nbytes: int = 256 << 20, repeats: int = 5) -> dict[str, Any]:
    """One thread, ``np.copyto`` between two touched buffers of ``nbytes``: best of ``repeats``."""
    src = np.ones(nbytes, np.uint8)
    dst = np.zeros(nbytes, np.uint8)
    dt = _best(lambda: np.copyto(dst, src), repeats)
    return {"memcpy_Bps": nbytes / dt, "memcpy_bytes": nbytes}


def _fromfile(paths: Sequence[Path]) -> int:
    return sum(np.fromfile(p, dtype=np.uint8).nbytes for p in paths)


def _read(paths: Sequence[Path]) -> int:
    total = 0
    for p in paths:
        with open(p, "rb", buffering=0) as f:
            total += len(f.read())
    return total


def page_cache_read_rate(paths: Sequence[Path], *, repeats: int = 3) -> dict[str, Any]:
    """Read every file whole from the page cache with one plain call per file, one thread.

    Compares ``np.fromfile`` and ``f.read()`` (a fresh buffer per file: reusing one buffer
    with ``readinto`` measured slower on the reference machine) and keeps the best; also
    reports the same reads spread over ``os.cpu_count()`` threads, for information.
    """
    nbytes = sum(os.path.getsize(p) for p in paths)
    rates = {
        name: nbytes / _best(lambda f=f: f(paths), repeats)
        for name, f in (("np.fromfile", _fromfile), ("read()", _read))
    }
    best = max(rates, key=rates.__getitem__)
    threads = os.cpu_count() or 1
    with ThreadPoolExecutor(threads) as pool:
        dt = _best(lambda: sum(pool.map(lambda p: _read([p]), paths)), repeats)
    return {
        "read_Bps": rates[best],
        "read_call": best,
        "read_rates_Bps": rates,
        "read_bytes": nbytes,
        "read_all_cores_Bps": nbytes / dt,
        "read_threads": threads,
    }


def zstd_read_decode_rate(
    paths: Sequence[Path],
    *,
    chunk_bytes: Sequence[int],
    zarr_array: str | None = None,
    repeats: int = 3,
) -> dict[str, Any]:
    """Read + Blosc-zstd decode of the store's chunk files on all cores; the fastest variant.

    Variants: a pool of ``os.cpu_count()`` threads each reading and decoding whole chunks
    (numcodecs runs one Blosc thread per call outside the main thread); reading in the main
    thread with Blosc's own ``os.cpu_count()`` threads decoding; and, if ``zarr_array`` is
    given, zarr's own codec pipeline reading ``os.cpu_count()`` chunks per call. Rates are in
    decoded bytes per second.
    """
    import numcodecs.blosc as blosc

    threads = os.cpu_count() or 1
    decoded = int(sum(chunk_bytes))

    def one(p: Path) -> int:
        with open(p, "rb", buffering=0) as f:
            return len(blosc.decompress(f.read()))

    got = sum(one(p) for p in paths)
    if got != decoded:
        raise RuntimeError(f"decoded {got} bytes from {len(paths)} chunk files, expected {decoded}")
    rates: dict[str, float] = {}
    with ThreadPoolExecutor(threads) as pool:
        rates[f"read+decode, {threads} threads"] = decoded / _best(
            lambda: sum(pool.map(one, paths)), repeats
        )
    old = blosc.set_nthreads(threads)
    try:
        rates[f"read, blosc {threads} threads"] = decoded / _best(
            lambda: sum(one(p) for p in paths), repeats
        )
    finally:
        blosc.set_nthreads(old)
    if zarr_array is not None:
        import zarr

        z = zarr.open_array(zarr_array, mode="r")
        step = z.chunks[0] * threads

        def via_zarr() -> None:
            for a in range(0, z.shape[0], step):
                z[a : a + step]

        rates[f"zarr z[a:b], {threads} chunks per call"] = decoded / _best(via_zarr, repeats)
    with ThreadPoolExecutor(1) as pool:  # outside the main thread: one Blosc thread per call
        one_thread = decoded / _best(lambda: sum(pool.map(one, paths)), 1)
    best = max(rates, key=rates.__getitem__)
    return {
        "zstd_Bps": rates[best],
        "zstd_variant": best,
        "zstd_rates_Bps": rates,
        "zstd_one_thread_Bps": one_thread,
        "zstd_threads": threads,
    }


def _shard_chunks(blob: bytes, n: int) -> list[bytes]:
    """The encoded inner chunks of a Zarr v3 shard: index at the end, ``n`` (offset, nbytes)
    little-endian uint64 pairs followed by a crc32c (shardload's ``index_location="end"``)."""
    index = np.frombuffer(blob, dtype="<u8", count=2 * n, offset=len(blob) - 16 * n - 4)
    out = []
    for off, size in index.reshape(n, 2).tolist():
        if off == 2**64 - 1:
            raise RuntimeError("a shard with an empty inner chunk: not written by shardload")
        out.append(blob[off : off + size])
    return out


def shard_read_decode_rate(
    paths: Sequence[Path],
    *,
    chunks_per_shard: int,
    decoded_bytes: int,
    zarr_array: str | None = None,
    repeats: int = 3,
) -> dict[str, Any]:
    """Read + Blosc-zstd decode of sharded chunk files on all cores (decoded bytes/s), the
    fastest of: a pool of ``os.cpu_count()`` threads each reading one shard whole and decoding
    its inner chunks; one thread reading shards and the pool decoding inner chunks; zarr's own
    pipeline reading ``os.cpu_count()`` shards per call. Same keys as
    :func:`zstd_read_decode_rate`."""
    import numcodecs.blosc as blosc

    threads = os.cpu_count() or 1

    def read(p: Path) -> bytes:
        with open(p, "rb", buffering=0) as f:
            return f.read()

    def one_shard(p: Path) -> int:
        return sum(len(blosc.decompress(c)) for c in _shard_chunks(read(p), chunks_per_shard))

    got = sum(one_shard(p) for p in paths)
    if got != decoded_bytes:
        raise RuntimeError(
            f"decoded {got} bytes from {len(paths)} shards, expected {decoded_bytes}"
        )
    rates: dict[str, float] = {}
    with ThreadPoolExecutor(threads) as pool:
        rates[f"read shard + decode its chunks, {threads} threads"] = decoded_bytes / _best(
            lambda: sum(pool.map(one_shard, paths)), repeats
        )

        def split_decode() -> int:
            total = 0
            for p in paths:
                total += sum(
                    pool.map(
                        lambda c: len(blosc.decompress(c)), _shard_chunks(read(p), chunks_per_shard)
                    )
                )
            return total

        rates[f"read shards, decode chunks in {threads} threads"] = decoded_bytes / _best(
            split_decode, repeats
        )
    if zarr_array is not None:
        import zarr

        z = zarr.open_array(zarr_array, mode="r")
        step = z.shards[0] * threads

        def via_zarr() -> None:
            for a in range(0, z.shape[0], step):
                z[a : a + step]

        rates[f"zarr z[a:b], {threads} shards per call"] = decoded_bytes / _best(via_zarr, repeats)
    with ThreadPoolExecutor(1) as pool:
        one_thread = decoded_bytes / _best(lambda: sum(pool.map(one_shard, paths)), 1)
    best = max(rates, key=rates.__getitem__)
    return {
        "zstd_Bps": rates[best],
        "zstd_variant": best,
        "zstd_rates_Bps": rates,
        "zstd_one_thread_Bps": one_thread,
        "zstd_threads": threads,
    }
