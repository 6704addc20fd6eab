"""A timeline of fresh first epochs by URL (issues 25 and 28): when each GET starts and ends,
when each shard is decoded as it arrives, checked, decoded from its checked bytes, when each
group is waited for and each batch yielded, and the CPU seconds of each kind of thread.

The store is served by ``python -m shardload serve`` in a process of its own on 127.0.0.1; this
process runs ``iter_batches(url, batch_size=256, shuffle=True)`` ``--epochs`` times (a fresh
reader each time: each a first epoch) with the reader's functions wrapped to record their
calls (``shardload.move.http_get.HttpReader.get``, ``formats.zarr.shard_fetch``'s steps,
``formats.zarr.ahead``, ``load.gather.GatherReader``). Each epoch gets a line: wall seconds,
the first batch, the last byte of any GET, the tail (wall after that byte), CPU seconds (the
main thread's and each thread kind's) and the GETs made; ``--show`` prints the last epoch's
events, one a line: start, end, (wall, thread CPU), thread, what, which.

Usage::

    python benchmarks/url_timeline.py ROOT STORE --epochs 4 --show

``ROOT`` is the folder served (e.g. ``bench_url_latency.py``'s ``--workdir``), ``STORE`` the
store's name in it (``lz4``, ``default``).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

EVENTS: list[tuple[float, float, str, str, str, float]] = []
T0 = [0.0]
CPU: dict[str, float] = collections.defaultdict(float)


def now() -> float:
    return time.perf_counter() - T0[0]


def wrap(owner: Any, attr: str, label: str, what: Callable[..., str]) -> None:
    """Record each call of ``owner.attr``: start, end, thread, ``label``, ``what(args)``,
    thread CPU."""
    f = getattr(owner, attr)

    @functools.wraps(f)
    def recorded(*a: Any, **k: Any) -> Any:
        t, c = now(), time.thread_time()
        try:
            return f(*a, **k)
        finally:
            name = threading.current_thread().name
            EVENTS.append((t, now(), name, label, what(*a), time.thread_time() - c))

    setattr(owner, attr, recorded)


def instrument() -> None:
    from shardload.formats import checksums
    from shardload.formats.zarr import ahead, shard_fetch
    from shardload.load import gather
    from shardload.move import http_get

    wrap(http_get.HttpReader, "get", "GET", lambda s, url, a, b, *_: f"{url[-12:]} {a}-{b}")
    wrap(shard_fetch, "decode_arriving", "decode_arriving", lambda *a: f"shard {a[2]}")
    wrap(shard_fetch, "_from_whole", "decode_checked", lambda *a: f"shard {a[2]}")
    wrap(shard_fetch, "_checked_whole", "checked_whole", lambda *a: f"shard {a[3]}")
    wrap(shard_fetch, "_fetch_run", "range_request", lambda *a: f"shard {a[2][0]}")
    wrap(shard_fetch, "read_url_shards", "group_call", lambda *a: f"shards {sorted(a[2])}")
    wrap(ahead, "digest", "xxh3_whole", lambda *a: f"{len(a[0]) >> 20} MiB")
    wrap(checksums.Verifier, "check", "check", lambda *a: f"shard {a[2]}")
    wrap(gather.GatherReader, "wait", "loop_waits", lambda s, fl: f"group at row {fl.at}")
    run = threading.Thread.run

    def counted(self: threading.Thread) -> None:
        c = time.thread_time()
        try:
            run(self)
        finally:
            CPU[self.name.split("_")[0].rstrip("-0123456789")] += time.thread_time() - c

    threading.Thread.run = counted  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--show", action="store_true")
    ap.add_argument("--rtt-ms", type=float, default=0.0, help="through the latency proxy")
    a = ap.parse_args(argv)
    instrument()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "shardload", "serve", a.root, "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        with contextlib.ExitStack() as stack:
            if a.rtt_ms:  # (a thread of this process, as in bench_url_latency.py)
                from shardload.testing.latency import latency_proxy

                proxied = latency_proxy("127.0.0.1", port, rtt_s=a.rtt_ms / 1000)
                port = stack.enter_context(proxied)[1]
            epochs(f"http://127.0.0.1:{port}/{a.store}", a.epochs, a.show)
    finally:
        server.terminate()
        server.wait()


def epochs(url: str, n: int, show: bool) -> None:
    """``n`` fresh first epochs of ``url``, a line each; the last one's events."""
    import shardload

    batches: list[float] = []
    for e in range(n):
        EVENTS.clear()
        CPU.clear()
        batches = []
        T0[0], c0, m0 = time.perf_counter(), time.process_time(), time.thread_time()
        for _ in shardload.iter_batches(url, batch_size=256, seed=0, shuffle=True):
            batches.append(now())
        wall, cpu, main_cpu = now(), time.process_time() - c0, time.thread_time() - m0
        gets = [x for x in EVENTS if x[3] == "GET"]
        last = max((x[1] for x in gets), default=0.0)
        kinds = ", ".join(f"{k} {v:.3f}" for k, v in sorted(CPU.items()))
        print(
            f"epoch {e}: wall {wall:.3f} s, first batch {batches[0]:.3f}, last byte "
            f"{last:.3f}, tail {wall - last:.3f}; CPU {cpu:.3f} s (main {main_cpu:.3f}; "
            f"{kinds}); {len(gets)} GETs",
            flush=True,
        )
    if show:
        for t0, t1, th, label, what, c in sorted(EVENTS):
            print(f"  {t0:7.3f} {t1:7.3f} ({t1 - t0:6.3f}, CPU {c:6.3f}) {th[:24]:24s} "
                  f"{label:16s} {what}")  # fmt: skip
        print(f"  batches yielded at {batches[0]:.3f} .. {batches[-1]:.3f}")


if __name__ == "__main__":
    main()
