"""Throughput at distance (issue 28): the loader's epoch by URL at several round-trip times,
against the fastest plain parallel GET of the same files at each.

The store is one of ``bench_default_layout``'s (``--store``: ``default``, Zarr v3 shards of
small inner chunks, stored raw where lz4 does not shrink the data, as this benchmark's noise;
``chunks16``, compressed Zarr chunks of 16 MiB; ``npy``),
``npy1m`` / ``zarr1m`` (npy or compressed Zarr chunks of about 1 MiB, the default) or ``raw``
(prepare's default Zarr layout with ``compression: none``: raw chunk files, no shards) or
``lz4`` (the default layout with ``compression: lz4``: what it writes for data that compresses),
built
under ``--workdir`` unless an equal one is there. It is served with
``shardload.move.serve.serving`` on 127.0.0.1 (a thread of this process) and reached through
``shardload.testing.latency.latency_proxy`` (another thread), which delays each direction by
RTT/2 and a new connection by one RTT. For each RTT in ``--rtt-ms``:

- the epoch: ``iter_batches(url, batch_size=B, shuffle=True)``, a fresh iterator each time
  (best of ``--repeats``), and the most requests the proxy saw in flight at once;
- the plain GET: every data file of array ``x`` fetched whole with fsspec's HTTP filesystem,
  ``fs.cat`` of all at once (async gather) and pools of T threads (``--threads``), best of all;
  and the stdlib GET: the same files, a thread and an ``http.client`` connection each, read
  into preallocated buffers (the loader's own way of fetching a shard since branch urlfast).

Printed: a line per RTT, then the ratios the issue asks about: the loader at each RTT against
the loader at 0 ms (goal at 20 ms: >= 0.8) and the loader at 0 ms against the plain GET at 0 ms
(goal >= 0.8).

``--server-process`` runs the server as ``shardload serve`` does, in a process of its own
(``python -m shardload serve``), so its CPU and its GIL are not this process's, and at 0 ms
reaches it directly, without the proxy (which then counts nothing: ``n/a``); at other RTTs the
proxy stays a thread of this process, unless ``--proxy-process`` runs it in a process of its
own too (its threads, which move the bytes by ``os.splice`` through pipes, then take neither
this process's GIL nor its CPU time; the requests it sees are not counted: ``n/a``). The plain GET
and the loader read the same server.

``--same-store`` times instead the epochs of ONE opened store (``open_store(url)`` once, then
``iter_batches(store, epoch=e)`` for e = 0 .. ``--repeats``): epoch 0 is the reader's first
(its shards fetched whole for their checksums), the others are later epochs. Each gets a line:
wall seconds, client page faults (``ru_minflt``), client CPU seconds (the process's CPU less that of the server's and the proxy's
threads), the requests the proxy saw and the bytes the client fetched
(``shardload.move.remote.RemoteFileSystem.cat_file``).

Usage::

    python benchmarks/bench_url_latency.py --workdir /tmp/bul --rows 16384
    python benchmarks/bench_url_latency.py --workdir /tmp/bul --rows 16384 --store default \
        --rtt-ms 0,20 --repeats 3 --same-store
    python benchmarks/bench_url_latency.py --workdir /tmp/bul --rows 16384 --store default \
        --rtt-ms 0 --repeats 3 --server-process
"""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import urlparse

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


#: stores of many chunks read whole by URL, one GET each (besides bench_default_layout's)
EXTRA_STORES = {
    "npy1m": {"format": "npy", "target_chunk_bytes": "1MiB"},
    "zarr1m": {"target_chunk_bytes": "1MiB"},
    "raw": {"compression": "none"},
    "lz4": {"compression": "lz4"},
}


class _NoProxy:
    """Stands for the proxy at 0 ms with ``--server-process``: direct, nothing counted."""

    requests = max_waiting = connections = 0

    def reset_counts(self) -> None:
        return None


@contextlib.contextmanager
def served(root: Path, *, own_process: bool) -> Iterator[str]:
    """The base URL of ``root`` served on 127.0.0.1: a thread of this process, or
    ``python -m shardload serve`` in a process of its own."""
    if not own_process:
        from shardload.move.serve import serving

        with serving(root, max_client_connections=512) as base:  # all from 127.0.0.1
            yield base
        return
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [sys.executable, "-m", "shardload", "-q", "serve", str(root), "--port", str(port)]
    proc = subprocess.Popen([*argv, "--max-client-connections", "512"])
    try:
        for _ in range(200):
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.1):
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/"
    finally:
        proc.terminate()
        proc.wait()


#: ``--proxy-process``: the latency proxy in a process of its own, its port on stdout
PROXY_PROCESS = """
import sys
from shardload.testing.latency import latency_proxy
with latency_proxy(sys.argv[1], int(sys.argv[2]), rtt_s=float(sys.argv[3])) as (_, port):
    print(port, flush=True)
    sys.stdin.read()
"""


@contextlib.contextmanager
def reached(
    base: str, rtt_ms: float, *, direct: bool, own_process: bool = False
) -> Iterator[tuple[object, str]]:
    """(proxy, base URL) to reach ``base`` at ``rtt_ms``: through the latency proxy (a thread
    of this process, or with ``own_process`` a process of its own, which counts nothing here),
    or at 0 ms with ``direct`` without it."""
    if direct and not rtt_ms:
        yield _NoProxy(), base.rstrip("/")
        return
    target = urlparse(base)
    if own_process:
        import subprocess

        argv = [sys.executable, "-c", PROXY_PROCESS, str(target.hostname), str(target.port)]
        proc = subprocess.Popen(
            [*argv, str(rtt_ms / 1000)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        try:
            assert proc.stdout is not None
            yield _NoProxy(), f"http://127.0.0.1:{int(proc.stdout.readline())}"
        finally:
            assert proc.stdin is not None
            proc.stdin.close()
            proc.wait(timeout=30)
        return
    from shardload.testing.latency import latency_proxy

    with latency_proxy(target.hostname, target.port, rtt_s=rtt_ms / 1000) as (proxy, port):
        yield proxy, f"http://127.0.0.1:{port}"


def plain_get(url: str, store: Path, threads: list[int], repeats: int) -> float:
    """Seconds to GET every data file of ``store`` whole from ``url``: the best way's best."""
    import fsspec
    from bench_default_layout import data_files

    files = data_files(store)
    urls = [f"{url}/{p.relative_to(store).as_posix()}" for p in files]
    size = sum(p.stat().st_size for p in files)
    best = float("inf")
    for _ in range(repeats):
        fs = fsspec.filesystem("http", skip_instance_cache=True)
        t = time.perf_counter()
        got = fs.cat(urls)
        best = min(best, time.perf_counter() - t)
        assert sum(len(v) for v in got.values()) == size
        for n in threads:
            t = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                got_n = sum(len(b) for b in pool.map(fs.cat_file, urls))
            best = min(best, time.perf_counter() - t)
            assert got_n == size
    return best


def plain_get_stdlib(url: str, store: Path, repeats: int) -> float:
    """Seconds to GET every data file of ``store`` whole from ``url`` with the standard
    library: a thread and an ``http.client`` connection per file, each body ``readinto`` one
    preallocated buffer (what the loader's own GETs do, ``shardload.move.http_get``); best of
    ``repeats``."""
    import http.client
    from urllib.parse import urlsplit

    import numpy as np
    from bench_default_layout import data_files

    files = data_files(store)
    size = sum(p.stat().st_size for p in files)
    at = urlsplit(url)
    paths = [f"{at.path}/{p.relative_to(store).as_posix()}" for p in files]

    def get(path: str) -> int:
        conn = http.client.HTTPConnection(at.hostname or "127.0.0.1", at.port, timeout=30)
        try:
            conn.request("GET", path)
            r = conn.getresponse()
            n = int(r.getheader("Content-Length") or 0)
            buf, got = np.empty(n, np.uint8).data, 0
            while got < n:
                k = r.readinto(buf[got : got + (1 << 20)])
                if not k:
                    raise EOFError(path)
                got += k
            return got
        finally:
            conn.close()

    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        with ThreadPoolExecutor(len(paths)) as pool:
            assert sum(pool.map(get, paths)) == size
        best = min(best, time.perf_counter() - t)
    return best


def _thread_cpu(names: tuple[str, ...]) -> float:
    """CPU seconds of this process's live threads named ``names`` (the server and proxy)."""
    import threading

    total = 0.0
    for t in threading.enumerate():
        if t.name in names and t.ident is not None:
            with contextlib.suppress(OSError, ProcessLookupError):
                total += time.clock_gettime(time.pthread_getcpuclockid(t.ident))
    return total


@contextlib.contextmanager
def bytes_fetched() -> Iterator[list[int]]:
    """Counts the bytes the client fetches (every read of a store by URL, as ``bytes`` or as a
    view, is a ``move.remote.RemoteFileSystem.cat_file``) into ``[n]`` while open; the caller
    may zero it between phases."""
    from shardload.move.remote import RemoteFileSystem

    fetched = [0]
    cat_file = RemoteFileSystem.cat_file

    def counted(fs: RemoteFileSystem, *args: object, **kw: object) -> object:
        data = cat_file(fs, *args, **kw)  # type: ignore[arg-type]
        if not (kw.get("view") and fs.spec.cache_dir is not None):  # (that one calls again)
            fetched[0] += len(data)
        return data

    RemoteFileSystem.cat_file = counted  # type: ignore[method-assign,assignment]
    try:
        yield fetched
    finally:
        RemoteFileSystem.cat_file = cat_file  # type: ignore[method-assign]


def same_store_epochs(url: str, proxy: object, epochs: int, batch_size: int, seed: int) -> None:
    """Epochs 0 .. ``epochs`` of one store opened once by ``url``, a line each."""
    import shardload

    servers = ("shardload-serve", "shardload-latency-proxy")
    with bytes_fetched() as fetched:
        store = shardload.open_store(url)
        for e in range(epochs + 1):
            proxy.reset_counts()  # type: ignore[attr-defined]
            fetched[0] = 0
            cpu0, srv0, t = time.process_time(), _thread_cpu(servers), time.perf_counter()
            faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            rows = 0
            for b in shardload.iter_batches(
                store, batch_size=batch_size, seed=seed, shuffle=True, epoch=e
            ):
                rows += len(b["index"])
            wall = time.perf_counter() - t
            cpu = time.process_time() - cpu0 - (_thread_cpu(servers) - srv0)
            print(
                f"  epoch {e} ({'first' if e == 0 else 'later'}): {wall:.2f} s wall, "
                f"client CPU {cpu:.2f} s, {proxy.requests} requests, "  # type: ignore[attr-defined]
                f"{fetched[0] / 2**20:.1f} MiB fetched, {rows} rows, "
                f"{resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults} page faults",
                flush=True,
            )


def main(argv: list[str] | None = None) -> None:
    from bench_default_layout import STORES, build, data_files, store_arguments
    from bench_default_url import epoch

    ap = store_arguments(__doc__)
    ap.add_argument("--store", default="npy1m", choices=sorted({*STORES, *EXTRA_STORES}))
    ap.add_argument("--rtt-ms", default="0,20,100", help="round-trip times to add (ms)")
    ap.add_argument("--threads", default="8,32", help="thread counts of the plain GET")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument(
        "--same-store",
        action="store_true",
        help="time epochs 0..repeats of one opened store (later epochs), no plain GET",
    )
    ap.add_argument(
        "--server-process",
        action="store_true",
        help="serve from a process of its own (python -m shardload serve), 0 ms without proxy",
    )
    ap.add_argument(
        "--proxy-process",
        action="store_true",
        help="the latency proxy in a process of its own (its CPU and GIL not the client's; "
        "requests not counted)",
    )
    a = ap.parse_args(argv)

    STORES.update(EXTRA_STORES)
    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = build(work, a.store, rows=a.rows, features=a.features)
    files = data_files(store)
    mib = sum(p.stat().st_size for p in files) / 2**20
    threads = [int(n) for n in a.threads.split(",")]
    print(f"store {store} ({a.store}): {len(files)} data files, {mib:.1f} MiB", flush=True)
    results: dict[float, tuple[float, float]] = {}
    own = a.server_process
    print(f"server: {'a process of its own' if own else 'a thread of this process'}", flush=True)
    with served(store.parent, own_process=own) as base:
        epoch(f"{base}{store.name}", a.batch_size, a.seed)  # warm: imports, page cache
        for rtt_ms in [float(x) for x in a.rtt_ms.split(",")]:
            with reached(base, rtt_ms, direct=own, own_process=a.proxy_process) as (proxy, at):
                url = f"{at}/{store.name}"
                if a.same_store:
                    print(f"RTT {rtt_ms:5.0f} ms, one opened store:", flush=True)
                    same_store_epochs(url, proxy, a.repeats, a.batch_size, a.seed)
                    continue
                get = plain_get(url, store, threads, a.repeats)
                get_std = plain_get_stdlib(url, store, a.repeats)
                times = []
                proxy.reset_counts()
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                cpu = time.process_time()  # the client's (the server's too unless --server-process)
                for _ in range(a.repeats):
                    s, rows = epoch(url, a.batch_size, a.seed)
                    assert rows == a.rows, (rows, a.rows)
                    times.append(s)
                faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
                cpu = time.process_time() - cpu
                best = min(times)
                results[rtt_ms] = (best, get)
                counts = (
                    "no proxy: requests n/a"
                    if isinstance(proxy, _NoProxy)
                    else f"{proxy.requests // a.repeats} requests, at most "  # type: ignore[attr-defined]
                    f"{proxy.max_waiting} in flight, "  # type: ignore[attr-defined]
                    f"{proxy.connections // a.repeats} connections"  # type: ignore[attr-defined]
                )
                print(
                    f"RTT {rtt_ms:5.0f} ms: epoch {', '.join(f'{t:.2f}' for t in times)} s "
                    f"({mib / best:.0f} MiB/s; {counts}), "
                    f"plain GET {get:.2f} s ({mib / get:.0f} MiB/s), loader / GET {get / best:.3f}; "
                    f"stdlib GET {get_std:.2f} s, loader / stdlib GET {get_std / best:.3f}; "
                    f"client page faults per epoch {faults // a.repeats}, "
                    f"process CPU per epoch {cpu / a.repeats:.2f} s",
                    flush=True,
                )
    if 0.0 in results:
        zero = results[0.0][0]
        for rtt_ms, (best, _) in results.items():
            if rtt_ms:
                print(
                    f"loader at {rtt_ms:.0f} ms / loader at 0 ms: {zero / best:.3f} (goal >= 0.8)"
                )
        print(f"loader at 0 ms / plain GET at 0 ms: {results[0.0][1] / zero:.3f} (goal >= 0.8)")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"client peak RSS {peak:.0f} MiB (ru_maxrss)", flush=True)


if __name__ == "__main__":
    main()
