"""A process that only loads by URL: fresh ``iter_batches(url)`` epochs of a store served by
``shardload serve`` in a process of its own (issues 25 and 28).

Prints each epoch's wall and CPU seconds and page faults (``ru_minflt``) of this process, the
medians of epochs 2.., and the process's peak RSS (``ru_maxrss``): what a reader's memory
costs when nothing else runs in the process (``bench_url_latency.py`` also runs plain GETs).

Usage::

    python benchmarks/bench_url_fresh_epochs.py ROOT STORE --epochs 5

``ROOT`` is the folder served (e.g. ``bench_url_latency.py``'s ``--workdir``), ``STORE`` the
store's name in it (``default``).
"""

from __future__ import annotations

import argparse
import resource
import socket
import statistics
import subprocess
import sys
import time


def main(argv: list[str] | None = None) -> None:
    import shardload

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root")
    ap.add_argument("store")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch-size", type=int, default=256)
    a = ap.parse_args(argv)
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    cmd = [sys.executable, "-m", "shardload", "serve", a.root, "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/{a.store}"
        seen = []
        for e in range(a.epochs):
            r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
            for _ in shardload.iter_batches(url, batch_size=a.batch_size, seed=0, shuffle=True):
                pass
            r1 = resource.getrusage(resource.RUSAGE_SELF)
            cpu = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
            seen.append((time.perf_counter() - t, cpu, r1.ru_minflt - r0.ru_minflt))
            print(f"epoch {e}: {seen[-1][0]:.2f} s, CPU {cpu:.2f} s, {seen[-1][2]} page faults")
        later = seen[1:] or seen
        wall, cpu, faults = (statistics.median(x[i] for x in later) for i in range(3))
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"epochs 2..: wall {wall:.2f} s, CPU {cpu:.2f} s, {faults:.0f} page faults "
            f"(medians); peak RSS {peak:.0f} MiB"
        )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
