"""``shuffle="uniform"`` on a store larger than memory (issue 14), emulated with a memory cgroup.

Builds (or reuses) the uncompressed Zarr store of ``bench_load.py`` (default 262,144 rows x 6.2 KB,
chunks of 4,096 rows, 1.6 GB), then runs everything below inside a cgroup v1 memory limit
(default 512 MiB, about a third of the store): the page cache the run fills is charged to the
cgroup, so the store cannot stay cached and every epoch reads from the disk. Before each
measurement the store's pages are dropped from the page cache (``posix_fadvise(DONTNEED)`` per
file: other sessions' caches stay) and the resident fraction is checked with ``fincore``.

In one run, under the limit:

- the read limits of that situation: a sequential read of every chunk file (1 thread, and
  ``os.cpu_count()`` threads); random single-row reads in the order of a uniform permutation
  (rows sorted by offset within each block, as the loader reads a group): one ``os.preadv``
  per row from ``--random-threads`` threads, and through the loader's own io_uring ring
  (``--ring-limits``): session 9's rounds of 256 that wait for their slowest read, continuous
  submission at depth 1,024 (1 thread) and 512 (2 threads), through the page cache and with
  ``O_DIRECT`` (aligned blocks into bounce slots, the row copied out); and, where ``fio`` is
  installed (else skipped, with a note), fio's ``randread`` over the store's files
  (``--fio``: io_uring and libaio, direct and buffered, 8 and 12 KiB blocks, queue depths 64
  to 1,024). The best random single-row rate of our own readers is *the random-row limit*;
- in-process ``shardload.iter_batches`` epochs (each in a fresh subprocess, which inherits the
  cgroup): the old default (``shuffle_chunks=4``), the new default, ``shuffle="uniform"``
  (io_uring; ``O_DIRECT`` since the store is larger than the cgroup's memory), the same with
  ``SHARDLOAD_O_DIRECT=0`` (through the page cache), and with one ``preadv`` per run
  (``SHARDLOAD_IO_URING=0``).

Reported per loader case: samples/s, the ratio to the sequential read limit and to the random-row
limit, peak RSS of the process (``VmHWM``), the cgroup's peak (page cache included), bytes
the process fetched from the storage layer (``/proc/self/io`` ``read_bytes``, readahead
included) and the device's sectors read (all processes) against the store's size, and whether
every row came exactly once. The machine's load average is printed before and after.

Needs root and the cgroup v1 memory controller (``/sys/fs/cgroup/memory``); the cgroup is removed
at the end. Usage::

    sudo python benchmarks/bench_uniform_bigger_than_ram.py --workdir /tmp/big --mem-limit 512M
    python benchmarks/bench_uniform_bigger_than_ram.py --workdir /tmp/small --rows 262144 \\
        --features 256 --chunk-rows 8192 --mem-limit 192M --fio-seconds 1   # a smoke run (~1 min)

(The whole run shares the cgroup: much under ~190 MiB, the parent and a loader subprocess do
not fit beside each other and the kernel's OOM killer ends the run.)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import loadbench_data as data  # noqa: E402

CGROUP_ROOT = Path("/sys/fs/cgroup/memory")
#: loader cases: name -> (iter_batches options, extra environment)
CASES: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "old default (shuffle_chunks=4)": ({"shuffle_chunks": 4}, {}),
    "new default": ({}, {}),
    "uniform (io_uring)": ({"shuffle": "uniform"}, {}),
    "uniform (io_uring via the page cache)": ({"shuffle": "uniform"}, {"SHARDLOAD_O_DIRECT": "0"}),
    "uniform (one preadv per run)": ({"shuffle": "uniform"}, {"SHARDLOAD_IO_URING": "0"}),
}
#: random-row limits through the loader's io_uring ring: name -> (threads, depth, block, direct);
#: block = rows per ``Ring`` call (sorted by offset), depth = reads in flight per thread
RING_LIMITS: dict[str, tuple[int, int, int, bool]] = {
    "io_uring rounds of 256 (session 9) x 1 thread": (1, 256, 256, False),
    "io_uring continuous depth 1024 x 1 thread": (1, 1024, 8192, False),
    "io_uring continuous depth 512 x 2 threads": (2, 512, 8192, False),
    "io_uring O_DIRECT continuous depth 256 x 1 thread": (1, 256, 8192, True),
    "io_uring O_DIRECT continuous depth 1024 x 1 thread": (1, 1024, 8192, True),
    "io_uring O_DIRECT continuous depth 512 x 2 threads": (2, 512, 8192, True),
}
#: fio random reads over the store's files: name -> (engine, direct, block size, depth, jobs)
FIO_LIMITS: dict[str, tuple[str, int, str, int, int]] = {
    "fio io_uring direct 8k qd 64": ("io_uring", 1, "8k", 64, 1),
    "fio io_uring direct 8k qd 256": ("io_uring", 1, "8k", 256, 1),
    "fio io_uring direct 8k qd 1024": ("io_uring", 1, "8k", 1024, 1),
    "fio io_uring direct 8k qd 512 x2 jobs": ("io_uring", 1, "8k", 512, 2),
    "fio io_uring direct 12k qd 1024": ("io_uring", 1, "12k", 1024, 1),
    "fio libaio direct 8k qd 1024": ("libaio", 1, "8k", 1024, 1),
    "fio io_uring buffered 8k qd 1024": ("io_uring", 0, "8k", 1024, 1),
}


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    if t and t[-1] in units:
        return int(float(t[:-1]) * units[t[-1]])
    return int(t)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--workdir",
        default=None,
        help="where the store lives (reused when the shape matches); default "
        "$TMPDIR/shardload-bench-uniform-big",
    )
    ap.add_argument("--rows", type=int, default=262144)
    ap.add_argument("--features", type=int, default=1550, help="float32 per row")
    ap.add_argument("--chunk-rows", type=int, default=4096)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument(
        "--mem-limit",
        default="512M",
        help="the cgroup's memory limit (page cache "
        "included), e.g. 512M; well under the store's size",
    )
    ap.add_argument(
        "--random-threads",
        default="1,16",
        help="thread counts of the random single-row preadv limit",
    )
    ap.add_argument(
        "--ring-limits",
        default=",".join(RING_LIMITS),
        help=f"subset of {list(RING_LIMITS)} (empty: none)",
    )
    ap.add_argument(
        "--fio",
        default=",".join(FIO_LIMITS),
        help=f"subset of {list(FIO_LIMITS)} (empty: none; skipped without fio)",
    )
    ap.add_argument("--fio-seconds", type=float, default=8.0, help="run time of each fio job")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=300.0,
        help="time limit per measurement (a cut epoch is extrapolated and its "
        "coverage not checked)",
    )
    ap.add_argument("--cases", default=",".join(CASES), help=f"subset of {list(CASES)}")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="bench-results/bench_uniform_bigger_than_ram.json")
    ap.add_argument("--run-case", default=None, help=argparse.SUPPRESS)  # internal: a subprocess
    return ap.parse_args(argv)


# -- page cache, cgroup, I/O counters ----------------------------------------------------------
def drop_cache(files: list[Path]) -> None:
    """Drop the files' clean pages from the page cache (this store's only)."""
    for p in files:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def resident_bytes(files: list[Path]) -> int | None:
    """Bytes of the files in the page cache (util-linux ``fincore``), None without it."""
    try:
        out = subprocess.run(
            ["fincore", "--bytes", "--noheadings", "--output", "RES", *map(str, files)],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return sum(int(x) for x in out.stdout.split())


class Cgroup:
    """A cgroup v1 memory cgroup holding this process (and the children it starts)."""

    def __init__(self, limit: int) -> None:
        if not (CGROUP_ROOT / "cgroup.procs").exists():
            raise SystemExit(f"no cgroup v1 memory controller at {CGROUP_ROOT}")
        self.path = CGROUP_ROOT / f"shardload-bench-{os.getpid()}"
        self.limit = limit

    def __enter__(self) -> Cgroup:
        try:
            self.path.mkdir()
            (self.path / "memory.limit_in_bytes").write_text(str(self.limit))
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except PermissionError as exc:
            raise SystemExit(
                f"cannot create the memory cgroup {self.path} (run as root): {exc}"
            ) from exc
        return self

    def __exit__(self, *exc: object) -> None:
        (CGROUP_ROOT / "cgroup.procs").write_text(str(os.getpid()))
        for _ in range(50):  # the cgroup empties once exited children are reaped
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)
        print(f"warning: could not remove {self.path}", file=sys.stderr)

    def get(self, name: str) -> int:
        return int((self.path / f"memory.{name}").read_text())

    def reset_peak(self) -> None:
        (self.path / "memory.max_usage_in_bytes").write_text("0")
        (self.path / "memory.failcnt").write_text("0")


def io_read_bytes() -> int:
    """Bytes this process (all its threads) caused to be fetched from the storage layer."""
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def device_sectors_read() -> int:
    """Sectors read from all block devices (the machine's, other sessions included)."""
    total = 0
    for dev in Path("/sys/block").iterdir():
        if dev.name.startswith(("loop", "ram")):
            continue
        with open(dev / "stat") as f:
            total += int(f.read().split()[2])
    return total


def load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# -- limits -------------------------------------------------------------------------------------
def sequential_read(files: list[Path], threads: int, buf_bytes: int) -> int:
    """Read every file whole, in order, with ``readinto`` a reused buffer per thread."""
    local = threading.local()

    def one(p: Path) -> int:
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(buf_bytes)
        n = 0
        with open(p, "rb", buffering=0) as f:
            while k := f.readinto(buf):
                n += k
        return n

    if threads == 1:
        return sum(one(p) for p in files)
    with ThreadPoolExecutor(threads) as pool:
        return sum(pool.map(one, files))


def random_rows(
    files: list[Path],
    *,
    chunk_rows: int,
    row_bytes: int,
    rows: int,
    batch: int,
    threads: int,
    seed: int,
    max_seconds: float,
) -> tuple[int, float]:
    """One ``os.preadv`` per row, rows in a uniform permutation cut into batches, each batch's
    rows sorted by (file, offset), batches spread over ``threads`` threads; (rows read, s)."""
    perm = np.random.default_rng(seed).permutation(rows)
    batches = [np.sort(perm[a : a + batch]) for a in range(0, rows, batch)]
    fds = [os.open(p, os.O_RDONLY) for p in files]
    t0 = time.perf_counter()
    stop = threading.Event()
    local = threading.local()

    def one(b: np.ndarray) -> int:
        if stop.is_set():
            return 0
        buf = getattr(local, "buf", None)
        if buf is None:
            buf = local.buf = bytearray(row_bytes)
        for r in b.tolist():
            c, i = divmod(r, chunk_rows)
            os.preadv(fds[c], [buf], i * row_bytes)
        if time.perf_counter() - t0 > max_seconds:
            stop.set()
        return len(b)

    try:
        with ThreadPoolExecutor(threads) as pool:
            done = sum(pool.map(one, batches))
    finally:
        for fd in fds:
            os.close(fd)
    return done, time.perf_counter() - t0


def random_rows_uring(
    files: list[Path],
    *,
    chunk_rows: int,
    row_bytes: int,
    rows: int,
    batch: int,
    threads: int,
    seed: int,
    max_seconds: float,
    depth: int | None = None,
    block: int | None = None,
    direct: bool = False,
) -> tuple[int, float]:
    """As :func:`random_rows`, through io_uring (``shardload.load.uring.Ring``, the loader's
    own ring; one per thread): the permutation is cut into blocks of ``block`` rows (default
    ``batch``), each block's rows sorted by offset and read by one ``Ring.readv`` with up to
    ``depth`` reads in flight, submitted continuously (default: as many as the ring holds); or,
    ``direct``, by ``Ring.read_direct`` from ``O_DIRECT`` descriptors (aligned spans into bounce
    slots, the row copied out)."""
    from shardload.load.uring import thread_ring

    block = block or batch
    perm = np.random.default_rng(seed).permutation(rows)
    blocks = [np.sort(perm[a : a + block]) for a in range(0, rows, block)]
    flags = os.O_RDONLY | (os.O_DIRECT if direct else 0)
    fds = np.array([os.open(p, flags) for p in files], dtype=np.int32)
    t0 = time.perf_counter()
    stop = threading.Event()
    local = threading.local()

    def one(b: np.ndarray) -> int:
        if stop.is_set():
            return 0
        st = getattr(local, "st", None)
        if st is None:
            buf = np.empty((block, row_bytes), np.uint8)
            iov = np.empty((block, 2), np.uint64)  # struct iovec {base, len} per row slot
            iov[:, 0] = buf.ctypes.data + row_bytes * np.arange(block, dtype=np.uint64)
            iov[:, 1] = row_bytes
            ring = thread_ring()
            if ring is None:
                raise OSError("io_uring is not usable here")
            st = local.st = (ring, buf, iov)
        ring, _buf, iov = st
        c, i = np.divmod(b, chunk_rows)
        addrs = iov.ctypes.data + 16 * np.arange(len(b), dtype=np.uint64)
        ones = np.ones(len(b), np.uint32)
        offs = (i * row_bytes).astype(np.uint64)
        if direct:
            got = ring.read_direct(
                fds[c],
                offs,
                np.full(len(b), row_bytes),
                addrs,
                ones,
                depth=depth,
                first=iov[: len(b), 0],
            )
        else:
            got = ring.readv(fds[c], addrs, ones, offs, depth=depth)
        if (got != row_bytes).any():
            raise OSError(f"short or failed row reads: {got[got != row_bytes][:4]}")
        if time.perf_counter() - t0 > max_seconds:
            stop.set()
        return len(b)

    try:
        with ThreadPoolExecutor(threads) as pool:
            done = sum(pool.map(one, blocks))
    finally:
        for fd in fds.tolist():
            os.close(fd)
    return done, time.perf_counter() - t0


def fio_randread(
    files: list[Path], *, engine: str, direct: int, bs: str, depth: int, jobs: int, seconds: float
) -> dict[str, float] | None:
    """``fio`` random reads (``randread``, a random file of the store per read) for
    ``seconds``; its IOPS and bytes/s, or None without fio."""
    exe = shutil.which("fio")
    if exe is None:
        return None
    cmd = [
        exe,
        "--name=r",
        "--filename=" + ":".join(str(p).replace(":", "\\:") for p in files),
        "--file_service_type=random",
        "--rw=randread",
        f"--ioengine={engine}",
        f"--direct={direct}",
        f"--bs={bs}",
        f"--iodepth={depth}",
        f"--numjobs={jobs}",
        "--group_reporting",
        "--time_based",
        f"--runtime={seconds}",
        "--readonly",
        "--invalidate=1",
        "--output-format=json",
    ]
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if p.returncode:
        return {"error": p.stderr[-500:]}  # type: ignore[dict-item]
    r = json.loads(p.stdout[p.stdout.index("{") :])["jobs"][0]["read"]
    return {"iops": r["iops"], "Bps": r["bw_bytes"], "lat_us": r["lat_ns"]["mean"] / 1e3}


# -- one loader case (a subprocess, in the cgroup) ------------------------------------------------
def run_case(
    name: str, store: Path, *, batch_size: int, seed: int, max_seconds: float
) -> dict[str, Any]:
    import shardload

    opts, _ = CASES[name]
    io0 = io_read_bytes()
    t0 = time.perf_counter()
    idx: list[np.ndarray] = []
    first = None
    truncated = False
    for b in shardload.iter_batches(store, batch_size=batch_size, seed=seed, **opts):
        idx.append(b["index"].copy())
        if first is None:
            first = time.perf_counter() - t0
        if time.perf_counter() - t0 > max_seconds:
            truncated = True
            break
    seconds = time.perf_counter() - t0
    seen = np.concatenate(idx)
    m = json.loads((store / "shardload.json").read_text())
    n = int(m["chunk_bounds"][-1])
    counts = np.bincount(seen, minlength=n)
    with open("/proc/self/status") as f:
        hwm = next(int(ln.split()[1]) * 1024 for ln in f if ln.startswith("VmHWM:"))
    return {
        "case": name,
        "samples": int(seen.size),
        "seconds": seconds,
        "first_batch_s": first,
        "samples_per_s": seen.size / seconds,
        "truncated": truncated,
        "exact_coverage": None if truncated else bool((counts == 1).all()),
        "duplicates": int((counts > 1).sum()),
        "missing": int((counts == 0).sum()) if not truncated else None,
        "peak_rss_MiB": hwm / 2**20,
        "read_bytes": io_read_bytes() - io0,
    }


def run_subprocess_case(name: str, args: argparse.Namespace, store: Path) -> dict[str, Any]:
    env = dict(os.environ, **CASES[name][1])
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--run-case",
        name,
        "--workdir",
        str(args.workdir),
        "--batch-size",
        str(args.batch_size),
        "--seed",
        str(args.seed),
        "--max-seconds",
        str(args.max_seconds),
    ]
    p = subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=args.max_seconds * 3 + 300,
    )
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode or not lines:
        return {"case": name, "error": f"exit {p.returncode}: {p.stderr[-2000:]}"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    args.workdir = Path(args.workdir or Path(tempfile.gettempdir()) / "shardload-bench-uniform-big")
    store = data.store_path(args.workdir, "zarr-none")
    if args.run_case:
        rec = run_case(
            args.run_case,
            store,
            batch_size=args.batch_size,
            seed=args.seed,
            max_seconds=args.max_seconds,
        )
        print(json.dumps(rec))
        return
    cases = [c for c in args.cases.split(",") if c]
    for c in cases:
        if c not in CASES:
            raise SystemExit(f"unknown case {c!r}: expected one of {list(CASES)}")
    limit = parse_size(args.mem_limit)
    log = lambda msg: print(msg, flush=True)  # noqa: E731
    log(f"load average before: {load()} ({os.cpu_count()} CPUs)")
    data.build_stores(
        args.workdir,
        rows=args.rows,
        features=args.features,
        chunk_rows=args.chunk_rows,
        kinds=["zarr-none"],
        seed=args.seed,
        log=log,
    )
    os.sync()
    files = data.zarr_chunk_files(store)
    size = sum(p.stat().st_size for p in files)
    row_bytes = args.features * 4
    dev = Path("/sys/block/vda/queue")
    ra = (dev / "read_ahead_kb").read_text().strip() if dev.exists() else "?"
    log(
        f"store {store}: {len(files)} chunk files, {size / 1e9:.2f} GB; cgroup memory limit "
        f"{limit / 2**20:.0f} MiB ({limit / size:.2f} of the store); readahead {ra} KiB"
    )
    res: dict[str, Any] = {
        "config": {
            **{k: str(v) for k, v in vars(args).items()},
            "store_bytes": size,
            "limit_bytes": limit,
            "read_ahead_kb": ra,
        },
        "limits": {},
        "fio": {},
        "cases": [],
    }

    with Cgroup(limit) as cg:

        def cold() -> dict[str, Any]:
            drop_cache(files)
            cg.reset_peak()
            return {
                "resident_before_bytes": resident_bytes(files),
                "sectors0": device_sectors_read(),
            }

        def after(c: dict[str, Any]) -> dict[str, Any]:
            sectors = device_sectors_read() - c.pop("sectors0")
            return {
                **c,
                "cgroup_peak_MiB": cg.get("max_usage_in_bytes") / 2**20,
                "cgroup_failcnt": cg.get("failcnt"),
                "device_read_bytes": sectors * 512,
            }

        for threads in sorted({1, os.cpu_count() or 1}):
            c = cold()
            t = time.perf_counter()
            n = sequential_read(files, threads, buf_bytes=1 << 20)
            dt = time.perf_counter() - t
            rec = {
                "what": f"sequential read, {threads} thread(s)",
                "bytes": n,
                "seconds": dt,
                "Bps": n / dt,
                "rows_per_s": n / dt / row_bytes,
                **after(c),
            }
            res["limits"][f"sequential_{threads}"] = rec
            log(
                f"  {rec['what']}: {rec['Bps'] / 1e9:.3f} GB/s = {rec['rows_per_s']:,.0f} rows/s "
                f"(resident before: {rec['resident_before_bytes']}, cgroup peak "
                f"{rec['cgroup_peak_MiB']:.0f} MiB)"
            )
        for threads in (int(t) for t in args.random_threads.split(",")):
            c = cold()
            done, dt = random_rows(
                files,
                chunk_rows=args.chunk_rows,
                row_bytes=row_bytes,
                rows=args.rows,
                batch=args.batch_size,
                threads=threads,
                seed=args.seed,
                max_seconds=min(60.0, args.max_seconds),
            )
            rec = {
                "what": f"random single-row preadv, {threads} threads",
                "rows": done,
                "seconds": dt,
                "rows_per_s": done / dt,
                "Bps": done * row_bytes / dt,
                "epoch_fraction": done / args.rows,
                **after(c),
            }
            res["limits"][f"random_{threads}"] = rec
            log(
                f"  {rec['what']}: {rec['rows_per_s']:,.0f} rows/s = {rec['Bps'] / 1e9:.3f} GB/s "
                f"({100 * rec['epoch_fraction']:.0f}% of the rows, device read "
                f"{rec['device_read_bytes'] / 1e9:.2f} GB)"
            )
        for key in (k for k in args.ring_limits.split(",") if k):
            threads, depth, block, direct = RING_LIMITS[key]
            c = cold()
            try:
                done, dt = random_rows_uring(
                    files,
                    chunk_rows=args.chunk_rows,
                    row_bytes=row_bytes,
                    rows=args.rows,
                    batch=args.batch_size,
                    threads=threads,
                    seed=args.seed,
                    max_seconds=min(60.0, args.max_seconds),
                    depth=depth,
                    block=block,
                    direct=direct,
                )
            except OSError as exc:  # no io_uring, or no O_DIRECT here
                log(f"  {key}: skipped ({exc})")
                after(c)
                continue
            rec = {
                "what": f"random single-row reads, {key}",
                "rows": done,
                "seconds": dt,
                "rows_per_s": done / dt,
                "Bps": done * row_bytes / dt,
                "epoch_fraction": done / args.rows,
                **after(c),
            }
            res["limits"][f"random_ring: {key}"] = rec
            log(
                f"  {rec['what']}: {rec['rows_per_s']:,.0f} rows/s = {rec['Bps'] / 1e9:.3f} GB/s "
                f"({100 * rec['epoch_fraction']:.0f}% of the rows, device read "
                f"{rec['device_read_bytes'] / 1e9:.2f} GB)"
            )
        fio_keys = [k for k in args.fio.split(",") if k]
        if fio_keys and shutil.which("fio") is None:
            log("  fio: not installed, its figures skipped (apt-get install fio)")
            fio_keys = []
        for key in fio_keys:
            engine, direct_io, bs, depth, jobs = FIO_LIMITS[key]
            c = cold()
            got = fio_randread(
                files,
                engine=engine,
                direct=direct_io,
                bs=bs,
                depth=depth,
                jobs=jobs,
                seconds=args.fio_seconds,
            )
            assert got is not None
            rec = {"what": key, **got, **after(c)}
            res["fio"][key] = rec
            if "error" in got:
                log(f"  {key}: ERROR {got['error']}")
                continue
            log(
                f"  {key}: {got['iops']:,.0f} reads/s = {got['Bps'] / 1e9:.3f} GB/s "
                f"(mean latency {got['lat_us']:,.0f} us)"
            )
        seq = max(v["Bps"] for k, v in res["limits"].items() if k.startswith("sequential"))
        rnd_key = max(
            (k for k in res["limits"] if k.startswith("random")),
            key=lambda k: res["limits"][k]["rows_per_s"],
        )
        rnd = res["limits"][rnd_key]["rows_per_s"]
        res["sequential_limit_Bps"], res["random_row_limit"] = seq, rnd_key
        log(
            f"  sequential read limit {seq / 1e9:.3f} GB/s = {seq / row_bytes:,.0f} rows/s; "
            f"random-row limit {rnd:,.0f} rows/s ({rnd_key}) = "
            f"{rnd * row_bytes / seq:.3f} of the sequential limit"
        )
        for name in cases:
            c = cold()
            rec = run_subprocess_case(name, args, store)
            rec.update(after(c))
            res["cases"].append(rec)
            if "error" in rec:
                log(f"  {name}: ERROR {rec['error']}")
                continue
            rec["ratio_to_sequential"] = rec["samples_per_s"] * row_bytes / seq
            rec["ratio_to_random_rows"] = rec["samples_per_s"] / rnd
            log(
                f"  {name}: {rec['samples_per_s']:,.0f} samples/s, "
                f"{rec['ratio_to_sequential']:.3f} of the sequential read limit, "
                f"{rec['ratio_to_random_rows']:.2f} of the random-row limit; peak RSS "
                f"{rec['peak_rss_MiB']:.0f} MiB, cgroup peak {rec['cgroup_peak_MiB']:.0f} MiB; "
                f"fetched {rec['read_bytes'] / size:.2f}x the store; exact coverage: "
                f"{rec['exact_coverage']}" + (" (time-limited)" if rec["truncated"] else "")
            )
    log(f"load average after: {load()}")
    log("")
    log("| read limit (store not cached) | rows/s | GB/s | ÷ sequential | device read ÷ bytes |")
    log("|---|---|---|---|---|")
    for v in res["limits"].values():
        rows_s = v["rows_per_s"]
        moved = v["device_read_bytes"] / max(1, v.get("rows", 0) * row_bytes or v["bytes"])
        log(
            f"| {v['what']} | {rows_s:,.0f} | {v['Bps'] / 1e9:.3f} | "
            f"{v['Bps'] / seq:.3f} | {moved:.2f} |"
        )
    for key, v in res["fio"].items():
        if "error" in v:
            continue
        log(
            f"| {key} (one read a row) | {v['iops']:,.0f} | {v['Bps'] / 1e9:.3f} | "
            f"{v['iops'] * row_bytes / seq:.3f} | - |"
        )
    log("")
    log(
        "| case | samples/s | ÷ sequential read limit | ÷ random-row limit | peak RSS MiB | "
        "cgroup peak MiB | fetched ÷ store | device read ÷ store | exact coverage |"
    )
    log("|---|---|---|---|---|---|---|---|---|")
    for r in res["cases"]:
        if "error" in r:
            continue
        log(
            f"| {r['case']} | {r['samples_per_s']:,.0f} | {r['ratio_to_sequential']:.3f} | "
            f"{r['ratio_to_random_rows']:.2f} | {r['peak_rss_MiB']:.0f} | "
            f"{r['cgroup_peak_MiB']:.0f} | {r['read_bytes'] / size:.2f} | "
            f"{r['device_read_bytes'] / size:.2f} | {r['exact_coverage']} |"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=1, default=str))
    log(f"wrote {out}")


if __name__ == "__main__":
    main()
