"""The latency proxy's own throughput (issue 28): the stdlib plain GET of a store's data files
(a thread and an ``http.client`` connection per file, ``bench_url_latency.plain_get_stdlib``)
straight from the server, against the same GET through ``shardload.testing.latency`` at each
``--rtt-ms`` (the proxy in a process of its own, the server too: ``python -m shardload
serve``). At 0 ms the proxy only moves bytes: the GET through it against the GET direct is
what the proxy leaves of the link (goal >= 0.9), the bound of every ratio measured through it.

``--proxy-src DIR`` runs the proxy from another source tree (``PYTHONPATH=DIR``), e.g. a
``git archive`` of an earlier commit, alternating with this tree's, round by round.

Usage::

    python benchmarks/bench_latency_proxy.py --workdir /tmp/bul --rows 16384 --store default \
        --rtt-ms 0,20 --rounds 3
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


@contextlib.contextmanager
def proxied(base: str, rtt_ms: float, src: str | None) -> Iterator[tuple[str, int]]:
    """The URL of ``base`` through the latency proxy in a process of its own (run from
    ``src``, or this tree), and that process's id."""
    from urllib.parse import urlparse

    from bench_url_latency import PROXY_PROCESS

    target = urlparse(base)
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    argv = [sys.executable, "-c", PROXY_PROCESS, str(target.hostname), str(target.port)]
    proc = subprocess.Popen(
        [*argv, str(rtt_ms / 1000)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        yield f"http://127.0.0.1:{int(proc.stdout.readline())}", proc.pid
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=30)


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) of process ``pid`` so far (Linux ``/proc``; else nan)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> None:
    from bench_default_layout import STORES, build, data_files, store_arguments
    from bench_url_latency import EXTRA_STORES, plain_get_stdlib, served

    ap = store_arguments(__doc__)
    ap.add_argument("--store", default="default", choices=sorted({*STORES, *EXTRA_STORES}))
    ap.add_argument("--rtt-ms", default="0,20", help="round-trip times of the proxy (ms)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="GETs per measure (best of)")
    ap.add_argument("--proxy-src", default=None, help="another tree's src/ for the proxy")
    a = ap.parse_args(argv)

    STORES.update(EXTRA_STORES)
    store = build(Path(a.workdir), a.store, rows=a.rows, features=a.features)
    mib = sum(p.stat().st_size for p in data_files(store)) / 2**20
    print(f"store {store} ({a.store}): {mib:.1f} MiB", flush=True)
    proxies = {"this tree": None, **({a.proxy_src: a.proxy_src} if a.proxy_src else {})}
    with served(store.parent, own_process=True) as base:
        for r in range(a.rounds):
            direct = plain_get_stdlib(f"{base}{store.name}", store, a.repeats)
            print(f"round {r}: direct {direct:.3f} s ({mib / direct:.0f} MiB/s)", flush=True)
            for rtt_ms in [float(x) for x in a.rtt_ms.split(",")]:
                for name, src in proxies.items():
                    with proxied(base, rtt_ms, src) as (url, pid):
                        cpu = cpu_s(pid)
                        t = plain_get_stdlib(f"{url}/{store.name}", store, a.repeats)
                        cpu = (cpu_s(pid) - cpu) / a.repeats
                    print(
                        f"  proxy ({name}) at {rtt_ms:.0f} ms: {t:.3f} s ({mib / t:.0f} MiB/s), "
                        f"direct / proxied {direct / t:.3f}; proxy CPU per GET {cpu:.3f} s",
                        flush=True,
                    )
            time.sleep(0.2)


if __name__ == "__main__":
    main()
