"""``shardload bench formats``: which on-disk format, mmap or not, fixed or variable length,
shuffled or not, how many workers — measured on this machine.

One seeded dataset (fixed length, then variable length) is written in every format of
``CASES``; each format is then read for one epoch per setting, every sample checked against
the one written (``format_epoch``). The read limit is measured in the same run: a large
sequential read of the npy stack's data file from the page cache. Results go to
``OUT/results.json`` (one row per epoch), ``OUT/report.md`` and PNG plots (``format_report``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from shardload.bench import format_columnar as col
from shardload.bench import format_io as fio
from shardload.bench import format_squashfs as sqfs
from shardload.bench.format_data import BenchData, make_data
from shardload.bench.format_squashfs import squashfs_unavailable
from shardload.errors import ConfigError

GROUP_BYTES = 4 << 20  # rows per Arrow batch / Parquet row group / Zarr shard / tar shard
READ_LIMIT_BLOCK = 16 << 20
SHUFFLE_BUFFER = 1000  # WebDataset's default sample buffer


@dataclass(frozen=True)
class FormatCase:
    """One format (and variant) of the benchmark: how to write it and how to read it.

    ``mmap_modes``: the settings timed (``(None,)`` when the format has no mmap mode).
    ``reader(path, mmap, group_rows)`` gives a per-sample reader (map-style); ``None`` means the
    format is read with its own iterator (WebDataset). ``prepare_read(path)`` runs in the main
    process before reading (e.g. mounts an image) and returns the path the reader opens;
    ``release(path)`` undoes it. ``unavailable()`` says why the format cannot run here.
    """

    format: str
    variant: str
    suffix: str
    mmap_modes: tuple[bool | None, ...]
    write: Callable[..., None]
    reader: Callable[..., Any] | None
    prepare_read: Callable[[Path], Path] | None = None
    release: Callable[[Path], None] | None = None
    unavailable: Callable[[], str | None] | None = None

    @property
    def name(self) -> str:
        return f"{self.format}-{self.variant}" if self.variant else self.format


def _group_reader(cls: type) -> Callable[..., Any]:
    return lambda path, mmap, group_rows: cls(path, mmap=mmap, group_rows=group_rows)


def _plain_reader(cls: type) -> Callable[..., Any]:
    return lambda path, mmap, group_rows: cls(path, mmap=mmap)


ON_OFF = (False, True)
CASES: tuple[FormatCase, ...] = (
    FormatCase("npy-dir", "", "", ON_OFF, fio.write_npy_dir, _plain_reader(fio.NpyDirReader)),
    FormatCase("npy-stack", "", "", ON_OFF, fio.write_npy_stack, _plain_reader(fio.NpyStackReader)),
    *(
        FormatCase(
            "zarr",
            f"{'sharded' if sharded else 'unsharded'}-{'zstd' if zstd else 'none'}",
            ".zarr",
            (None,),
            fio.zarr_writer(sharded=sharded, zstd=zstd),
            _plain_reader(fio.ZarrReader),
        )
        for sharded in (False, True)
        for zstd in (False, True)
    ),
    FormatCase("hdf5", "contiguous", ".h5", ON_OFF, fio.write_hdf5, _plain_reader(fio.Hdf5Reader)),
    FormatCase(
        "arrow", "ipc-file", ".arrow", ON_OFF, col.write_arrow, _group_reader(col.ArrowReader)
    ),
    FormatCase(
        "parquet", "snappy", ".parquet", ON_OFF, col.write_parquet, _group_reader(col.ParquetReader)
    ),
    FormatCase("webdataset", "tar", "", (None,), col.write_webdataset, None),
    FormatCase(
        "squashfs",
        f"npy-stack-{sqfs.COMPRESSION}",
        ".sqfs",
        ON_OFF,
        sqfs.write_squashfs,
        _plain_reader(fio.NpyStackReader),
        prepare_read=sqfs.mount_image,
        release=sqfs.unmount_image,
        unavailable=squashfs_unavailable,
    ),
)
FORMAT_NAMES: tuple[str, ...] = tuple(dict.fromkeys(c.format for c in CASES))


def plan_group_rows(num_samples: int, sample_bytes: int, *, min_groups: int = 4) -> int:
    """Samples per batch / row group / shard: about ``GROUP_BYTES``, at least ``min_groups``
    groups (so every DataLoader worker gets shards).

    >>> plan_group_rows(1024, 65536)
    64
    >>> plan_group_rows(10, 65536)
    3
    """
    rows = max(1, GROUP_BYTES // max(1, sample_bytes))
    return max(1, min(rows, -(-num_samples // min_groups)))


def disk_usage(path: Path) -> tuple[int, int, int]:
    """``(files, apparent bytes, allocated bytes)`` of a file or a folder tree."""
    paths = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    stats = [p.stat() for p in paths]
    return len(stats), sum(s.st_size for s in stats), sum(s.st_blocks * 512 for s in stats)


def measure_read_limit(path: Path, *, repeats: int = 3) -> float:
    """Bytes/s of a sequential read of ``path`` in 16 MiB ``readinto`` calls, one thread, from
    the page cache (the file was just written): best of ``repeats``."""
    size = path.stat().st_size
    buf = bytearray(min(READ_LIMIT_BLOCK, max(size, 1)))
    view = memoryview(buf)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        with open(path, "rb", buffering=0) as f:
            while f.readinto(view):
                pass
        best = min(best, time.perf_counter() - t)
    return size / best


def measure_check_rate(data: BenchData) -> float:
    """Bytes/s of the per-sample check alone (XXH3-64 of every sample, one thread)."""
    from shardload.bench.format_data import sample_digest

    t = time.perf_counter()
    for i in range(data.num_samples):
        sample_digest(data.sample(i))
    return data.nbytes / (time.perf_counter() - t)


def parse_workers(text: str) -> list[int]:
    try:
        workers = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        raise ConfigError(f"--workers: expected comma-separated integers, got {text!r}") from None
    if not workers or min(workers) < 0:
        raise ConfigError(f"--workers: expected integers >= 0, got {text!r}")
    return sorted(set(workers))


def select_cases(names: Sequence[str] | None) -> list[FormatCase]:
    if not names:
        return list(CASES)
    unknown = sorted(set(names) - set(FORMAT_NAMES))
    if unknown:
        raise ConfigError(f"--formats: unknown {unknown}; choose from {list(FORMAT_NAMES)}")
    return [c for c in CASES if c.format in names]


def _case_path(root: Path, case: FormatCase) -> Path:
    return root / f"{case.name}{case.suffix}"


def _make_loader(
    case: FormatCase,
    path: Path,
    *,
    mmap: bool | None,
    shuffle: bool,
    workers: int,
    num_samples: int,
    group_rows: int,
    batch_size: int,
    seed: int,
) -> tuple[Callable[[], Any], Callable[[], None], str]:
    """``(make_loader, close, shuffle_kind)`` of one epoch of ``case``."""
    from shardload.bench import format_epoch as fe

    if case.reader is None:
        ds = col.open_webdataset(
            path,
            shuffle=shuffle,
            seed=seed,
            batch_size=batch_size,
            shuffle_buffer=SHUFFLE_BUFFER,
            collate=fe.collate,
        )
        kind = f"shards + buffer of {SHUFFLE_BUFFER}" if shuffle else "none"
        return (lambda: fe.iterable_loader(ds, workers=workers)), (lambda: None), kind
    reader = case.reader(path, mmap, group_rows)
    make = lambda: fe.map_loader(  # noqa: E731
        reader,
        num_samples=num_samples,
        shuffle=shuffle,
        seed=seed,
        batch_size=batch_size,
        workers=workers,
    )
    return make, reader.close, "permutation" if shuffle else "none"


def run_formats(
    out: Path,
    *,
    num_samples: int,
    sample_bytes: int,
    workers: Sequence[int],
    batch_size: int = 32,
    seed: int = 0,
    max_epoch_s: float = 10.0,
    cases: Sequence[FormatCase] | None = None,
    keep_data: bool = False,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Write the dataset in every format, time the epochs, write results.json, report, plots."""
    from tqdm.auto import tqdm

    from shardload.bench.format_report import write_report

    cases = list(CASES if cases is None else cases)
    skipped = {c.name: why for c in cases if c.unavailable and (why := c.unavailable())}
    cases = [c for c in cases if c.name not in skipped]
    out.mkdir(parents=True, exist_ok=True)
    data_root = out / "data"
    if data_root.exists():
        shutil.rmtree(data_root)
    group_rows = plan_group_rows(num_samples, sample_bytes)
    settings = [(m, s, w) for m in (None, False, True) for s in (False, True) for w in workers]
    epochs = sum(1 for c in cases for m, _, _ in settings if m in c.mmap_modes)
    total = 2 * (len(cases) + epochs)  # writes and epochs, fixed and variable length
    meta: dict[str, Any] = {
        "command": " ".join(["shardload", *sys.argv[1:]]) if sys.argv else "",
        "machine": _machine(),
        "load_avg_start": list(os.getloadavg()),
        "num_samples": num_samples,
        "sample_bytes": sample_bytes,
        "batch_size": batch_size,
        "group_rows": group_rows,
        "seed": seed,
        "max_epoch_s": max_epoch_s,
        "limits": {},
        "skipped": skipped,
    }
    rows: list[dict[str, Any]] = []
    bar = tqdm(total=total, desc="bench formats", unit="run", disable=not progress)
    try:
        for fixed in (True, False):
            label = "fixed" if fixed else "variable"
            root = data_root / label
            root.mkdir(parents=True)
            data = make_data(num_samples, sample_bytes, fixed_length=fixed, seed=seed)
            hashes, data_bytes = data.hashes, data.nbytes
            written: dict[str, dict[str, Any]] = {}
            for case in cases:
                bar.set_postfix_str(f"write {label} {case.name}")
                path = _case_path(root, case)
                t = time.perf_counter()
                case.write(data, path, group_rows=group_rows)
                write_s = time.perf_counter() - t
                files, apparent, allocated = disk_usage(path)
                written[case.name] = {
                    "write_s": write_s,
                    "files": files,
                    "bytes": apparent,
                    "bytes_on_disk": allocated,
                }
                bar.update()
            limit_file = root / "read-limit.npy"
            np.save(limit_file, data.values)
            # the machine's load moves: measure before and after the epochs, divide by the best
            limit_before = measure_read_limit(limit_file)
            check_Bps = measure_check_rate(data)
            del data
            for case in cases:
                path = _case_path(root, case)
                read_path = case.prepare_read(path) if case.prepare_read else path
                try:
                    rows += _time_case(
                        case,
                        path,
                        read_path,
                        settings,
                        hashes,
                        bar=bar,
                        fixed=fixed,
                        num_samples=num_samples,
                        group_rows=group_rows,
                        batch_size=batch_size,
                        seed=seed,
                        max_epoch_s=max_epoch_s,
                        written=written[case.name],
                        data_bytes=data_bytes,
                    )
                finally:
                    if case.release:
                        case.release(path)
            limit_after = measure_read_limit(limit_file)
            meta["limits"][label] = {
                "read_limit_MB_per_s": max(limit_before, limit_after) / 1e6,
                "read_limit_before_after_MB_per_s": [limit_before / 1e6, limit_after / 1e6],
                "read_limit": "sequential read of the dataset's bytes (one .npy file) from "
                "the page cache, 16 MiB readinto calls, one thread, best of 3, measured "
                "before and after the epochs (the better of the two)",
                "check_MB_per_s": check_Bps / 1e6,
                "data_bytes": data_bytes,
            }
            for row in rows:
                if row["fixed_length"] == fixed:
                    row["read_limit_MB_per_s"] = max(limit_before, limit_after) / 1e6
                    row["ratio_to_read_limit"] = row["MB_per_s"] / row["read_limit_MB_per_s"]
    finally:
        bar.close()
        if not keep_data:
            shutil.rmtree(data_root, ignore_errors=True)
    meta["load_avg_end"] = list(os.getloadavg())
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    write_report(rows, meta, out)
    return rows


def _time_case(
    case: FormatCase,
    path: Path,
    read_path: Path,
    settings: list,
    hashes: np.ndarray,
    *,
    bar: Any,
    fixed: bool,
    num_samples: int,
    group_rows: int,
    batch_size: int,
    seed: int,
    max_epoch_s: float,
    written: dict[str, Any],
    data_bytes: int,
) -> list[dict[str, Any]]:
    """One checked epoch of ``case`` per setting ``(mmap, shuffle, workers)`` it has."""
    from shardload.bench import format_epoch as fe

    label = "fixed" if fixed else "variable"
    rows = []
    for mmap, shuffle, w in settings:
        if mmap not in case.mmap_modes:
            continue
        bar.set_postfix_str(f"{label} {case.name} mmap={_mmap_label(mmap)} shuffle={shuffle} w={w}")
        make, close, kind = _make_loader(
            case,
            read_path,
            mmap=mmap,
            shuffle=shuffle,
            workers=w,
            num_samples=num_samples,
            group_rows=group_rows,
            batch_size=batch_size,
            seed=seed,
        )
        what = (
            f"{case.name} ({label} length, mmap={_mmap_label(mmap)}, "
            f"shuffle={shuffle}, workers={w}) at {path}"
        )
        try:
            timing = fe.time_epoch(make, hashes, what=what, max_epoch_s=max_epoch_s)
        finally:
            close()
        rows.append(
            {
                "format": case.format,
                "variant": case.variant,
                "mmap": "n/a" if mmap is None else mmap,
                "fixed_length": fixed,
                "shuffle": shuffle,
                "shuffle_kind": kind,
                "workers": w,
                **timing,
                "ratio_to_read_limit": None,  # set once the read limit is measured after the epochs
                "read_limit_MB_per_s": None,
                **written,
                "data_bytes": data_bytes,
                "load_avg_1m": os.getloadavg()[0],
            }
        )
        bar.update()
    return rows


def _mmap_label(mmap: bool | None) -> str:
    return "n/a" if mmap is None else ("on" if mmap else "off")


def _machine() -> dict[str, Any]:
    import psutil

    return {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "memory_GB": psutil.virtual_memory().total / 1e9,
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for pkg in ("numpy", "zarr", "h5py", "pyarrow", "webdataset", "torch"):
        try:
            found[pkg] = version(pkg)
        except PackageNotFoundError:
            found[pkg] = "not installed"
    return found


def _run(args: argparse.Namespace) -> int:
    workers = parse_workers(args.workers)
    for option, value, low in (
        ("--samples", args.samples, 1),
        ("--sample-bytes", args.sample_bytes, 4),
        ("--batch-size", args.batch_size, 1),
        ("--max-epoch-seconds", args.max_epoch_seconds, 1e-9),
    ):
        if value < low:
            raise ConfigError(f"{option} must be >= {low:g}, got {value}")
    cases = select_cases(args.formats.split(",") if args.formats else None)
    rows = run_formats(
        Path(args.out),
        num_samples=args.samples,
        sample_bytes=args.sample_bytes,
        workers=workers,
        batch_size=args.batch_size,
        seed=args.seed,
        max_epoch_s=args.max_epoch_seconds,
        cases=cases,
        keep_data=args.keep_data,
        progress=not args.no_progress,
    )
    print(f"{len(rows)} epochs measured: {Path(args.out) / 'report.md'}")
    return 0


def register(kinds: argparse._SubParsersAction) -> None:
    """Add ``shardload bench formats`` to the ``bench`` subcommands."""
    p = kinds.add_parser(
        "formats",
        help="storage formats x mmap x fixed/variable length x shuffle x workers",
        description="Write one generated dataset as a directory of .npy files, an npy stack, "
        "Zarr v3 (unsharded/sharded, none/zstd), HDF5, Arrow IPC, Parquet, WebDataset tar "
        "shards and a SquashFS image of the npy stack, then time one checked epoch per setting "
        "(mmap on/off, fixed/variable length, shuffle on/off, DataLoader workers). Writes "
        "OUT/results.json, OUT/report.md and PNG plots.",
    )
    p.add_argument("--samples", type=int, default=1024, help="samples per dataset (default 1024)")
    p.add_argument(
        "--sample-bytes",
        type=int,
        default=65536,
        help="bytes per sample (the mean for variable length; default 65536)",
    )
    p.add_argument("--workers", default="0,2", help="DataLoader worker counts (default 0,2)")
    p.add_argument("--out", default="bench-formats", help="output folder (default bench-formats)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch (default 32)")
    p.add_argument("--seed", type=int, default=0, help="seed of lengths, values and shuffles")
    p.add_argument(
        "--formats",
        default=None,
        help=f"comma-separated subset of {','.join(FORMAT_NAMES)} (default: all)",
    )
    p.add_argument(
        "--max-epoch-seconds",
        type=float,
        default=10.0,
        help="stop an epoch after this long and report its rate as capped (default 10)",
    )
    p.add_argument("--keep-data", action="store_true", help="keep OUT/data (the written formats)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_run)
