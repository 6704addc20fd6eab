"""The default store layout by URL (issue 25): one epoch of the default load from ``shardload
serve`` on loopback, against the fastest plain parallel GET of the same files.

The store is ``bench_default_layout``'s ``default`` (compressed Zarr v3 shards of small inner
chunks), built under ``--workdir`` unless an equal one is there. It is served with
``shardload.move.serve.serving`` on 127.0.0.1 (a thread of this process, as ``shardload serve``
runs it). Printed: the epoch's seconds with ``iter_batches(url, batch_size=B, shuffle=True)``
(best of ``--repeats``, each a fresh ``iter_batches``), the seconds to GET every shard file
whole with fsspec's HTTP filesystem (``fs.cat`` of all the files at once: fsspec's async
gather, and a pool of T threads each ``cat_file``-ing one file at a time, T in ``--threads``;
best of all, best of ``--repeats``), and the ratio plain GET / epoch (the goal: >= 0.7).

Usage::

    python benchmarks/bench_default_url.py --workdir /tmp/bdl
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))


def plain_get(url: str, store: Path, threads: list[int], repeats: int) -> dict[str, float]:
    """Seconds to GET every data file of ``store`` whole from ``url``, best of each way."""
    import fsspec
    from bench_default_layout import data_files

    fs = fsspec.filesystem("http")
    files = data_files(store)
    urls = [f"{url}/{p.relative_to(store).as_posix()}" for p in files]
    size = sum(p.stat().st_size for p in files)
    out: dict[str, float] = {}
    for _ in range(repeats):
        t = time.perf_counter()
        got = fs.cat(urls)
        s = time.perf_counter() - t
        assert sum(len(v) for v in got.values()) == size
        out["gather"] = min(out.get("gather", s), s)
        for n in threads:
            t = time.perf_counter()
            with ThreadPoolExecutor(n) as pool:
                got_n = sum(len(b) for b in pool.map(fs.cat_file, urls))
            s = time.perf_counter() - t
            assert got_n == size
            key = f"threads{n}"
            out[key] = min(out.get(key, s), s)
    return out


def epoch(url: str, batch_size: int, seed: int) -> tuple[float, int]:
    import shardload

    t = time.perf_counter()
    rows = 0
    for b in shardload.iter_batches(url, batch_size=batch_size, seed=seed, shuffle=True):
        rows += len(b["index"])
    return time.perf_counter() - t, rows


def main(argv: list[str] | None = None) -> None:
    from bench_default_layout import build, data_files, store_arguments

    ap = store_arguments(__doc__)
    ap.add_argument("--threads", default="4,8,16", help="thread counts of the plain GET")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)

    from shardload.move.serve import serving

    work = Path(a.workdir)
    work.mkdir(parents=True, exist_ok=True)
    store = build(work, "default", rows=a.rows, features=a.features)
    size = sum(p.stat().st_size for p in data_files(store))
    threads = [int(n) for n in a.threads.split(",")]
    with serving(store) as url:
        get = plain_get(url, store, threads, a.repeats)
        times = []
        for _ in range(a.repeats):
            s, rows = epoch(url, a.batch_size, a.seed)
            assert rows == a.rows, (rows, a.rows)
            times.append(s)
    best_get = min(get.values())
    best = min(times)
    print(f"store {store}: {len(data_files(store))} shard files, {size / 2**20:.1f} MiB")
    for k, v in get.items():
        print(f"plain GET ({k}): {v:.3f} s ({size / v / 2**20:.0f} MiB/s)")
    print(f"epoch by URL (iter_batches, default): {', '.join(f'{t:.2f}' for t in times)} s")
    print(f"ratio fastest plain GET / best epoch: {best_get / best:.3f} (goal >= 0.7)")


if __name__ == "__main__":
    main()
