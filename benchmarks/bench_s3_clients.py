"""s3fs (fsspec) against obstore, reading the same objects from an S3 server with N in flight.

Starts moto's S3 server on 127.0.0.1 (a subprocess, as tests/integration/test_s3.py does), puts
``--objects`` objects of ``--object-mib`` MiB, then reads all their bytes two ways, each with
N requests in flight (N in ``--inflight``), best of ``--repeats``:

- ``whole``: every object by one GET (a store of chunk files: npy, unsharded Zarr);
- ``ranges``: every object in ``--range-kib`` KiB range requests, in a shuffled order (inner
  chunks of Zarr shards, as the loader reads them by URL).

s3fs: ``fs.cat(paths, batch_size=N)`` / ``fs.cat_ranges(..., batch_size=N)`` (its async gather);
obstore: ``obstore.get_async`` / ``get_range_async`` under an ``asyncio.Semaphore(N)``. Prints
MiB/s per client, workload and N.

Usage::

    python benchmarks/bench_s3_clients.py --objects 128 --object-mib 1
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable

BUCKET = "bench"
KEY, SECRET = "bench-key", "bench-secret"


def start_moto() -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    for _ in range(300):
        try:
            urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
            return proc, endpoint
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"moto did not start on {endpoint}")


def s3fs_readers(
    endpoint: str,
) -> dict[str, Callable[[list[str], list[tuple[str, int, int]], int], int]]:
    import s3fs

    fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint, skip_instance_cache=True)

    def whole(paths: list[str], _: object, n: int) -> int:
        out = fs.cat([f"{BUCKET}/{p}" for p in paths], batch_size=n)
        return sum(len(v) for v in out.values())

    def ranges(_: object, rs: list[tuple[str, int, int]], n: int) -> int:
        out = fs.cat_ranges(
            [f"{BUCKET}/{p}" for p, _, _ in rs],
            [a for _, a, _ in rs],
            [b for _, _, b in rs],
            batch_size=n,
        )
        return sum(len(v) for v in out)

    return {"whole": whole, "ranges": ranges}


def obstore_readers(
    endpoint: str,
) -> dict[str, Callable[[list[str], list[tuple[str, int, int]], int], int]]:
    import obstore
    from obstore.store import S3Store

    store = S3Store(
        BUCKET,
        endpoint=endpoint,
        access_key_id=KEY,
        secret_access_key=SECRET,
        region="us-east-1",
        client_options={"allow_http": True},
    )

    async def _whole(paths: list[str], n: int) -> int:
        sem = asyncio.Semaphore(n)

        async def one(p: str) -> int:
            async with sem:
                r = await obstore.get_async(store, p)
                return len(await r.bytes_async())

        return sum(await asyncio.gather(*(one(p) for p in paths)))

    async def _ranges(rs: list[tuple[str, int, int]], n: int) -> int:
        sem = asyncio.Semaphore(n)

        async def one(p: str, a: int, b: int) -> int:
            async with sem:
                return len(await obstore.get_range_async(store, p, start=a, end=b))

        return sum(await asyncio.gather(*(one(*r) for r in rs)))

    return {
        "whole": lambda paths, _, n: asyncio.run(_whole(paths, n)),
        "ranges": lambda _, rs, n: asyncio.run(_ranges(rs, n)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--objects", type=int, default=128)
    ap.add_argument("--object-mib", type=float, default=1.0)
    ap.add_argument("--range-kib", type=int, default=128)
    ap.add_argument("--inflight", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    proc, endpoint = start_moto()
    try:
        import s3fs

        fs = s3fs.S3FileSystem(key=KEY, secret=SECRET, endpoint_url=endpoint)
        fs.mkdir(BUCKET)
        size = int(args.object_mib * 2**20)
        body = os.urandom(size)
        paths = [f"store/x/{i:06d}" for i in range(args.objects)]
        fs.pipe({f"{BUCKET}/{p}": body for p in paths})
        step = args.range_kib * 1024
        rs = [(p, a, min(a + step, size)) for p in paths for a in range(0, size, step)]
        random.Random(0).shuffle(rs)
        total = size * len(paths)
        print(
            f"{len(paths)} objects of {size / 2**20:.2f} MiB ({total / 2**20:.0f} MiB), "
            f"{len(rs)} ranges of {args.range_kib} KiB; moto at {endpoint}; "
            f"cpus {os.cpu_count()}, load {os.getloadavg()[0]:.1f}"
        )
        clients = {"s3fs": s3fs_readers(endpoint), "obstore": obstore_readers(endpoint)}
        for work in ("whole", "ranges"):
            for n in args.inflight:
                for name, readers in clients.items():
                    best = float("inf")
                    for _ in range(args.repeats):
                        t0 = time.perf_counter()
                        got = readers[work](paths, rs, n)
                        best = min(best, time.perf_counter() - t0)
                        assert got == total, (name, work, got, total)
                    print(
                        f"{work:6s} inflight {n:3d} {name:8s} {best:7.2f} s "
                        f"{total / 2**20 / best:8.1f} MiB/s",
                        flush=True,
                    )
    finally:
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
