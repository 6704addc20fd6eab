"""Running ``shardload bench formats``: write the dataset in every format, time one checked
epoch per setting, measure the machine's read limit before and after, write the results."""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from shardload.bench import format_columnar as col
from shardload.bench.format_cases import (
    CASES,
    SHUFFLE_BUFFER,
    FormatCase,
    case_path,
    plan_group_rows,
)
from shardload.bench.format_data import BenchData, make_data

READ_LIMIT_BLOCK = 16 << 20


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
            rows += _run_length(
                data_root,
                cases,
                settings,
                meta,
                bar=bar,
                fixed=fixed,
                num_samples=num_samples,
                sample_bytes=sample_bytes,
                group_rows=group_rows,
                batch_size=batch_size,
                seed=seed,
                max_epoch_s=max_epoch_s,
            )
    finally:
        bar.close()
        if not keep_data:
            shutil.rmtree(data_root, ignore_errors=True)
    meta["load_avg_end"] = list(os.getloadavg())
    (out / "results.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
    write_report(rows, meta, out)
    return rows


def _run_length(
    data_root: Path,
    cases: Sequence[FormatCase],
    settings: list[tuple[bool | None, bool, int]],
    meta: dict[str, Any],
    *,
    bar: Any,
    fixed: bool,
    num_samples: int,
    sample_bytes: int,
    group_rows: int,
    batch_size: int,
    seed: int,
    max_epoch_s: float,
) -> list[dict[str, Any]]:
    """The fixed- or variable-length half of the run: write every case, time its epochs, and
    measure the read limit before and after (into ``meta["limits"]`` and every row)."""
    rows: list[dict[str, Any]] = []
    label = "fixed" if fixed else "variable"
    root = data_root / label
    root.mkdir(parents=True)
    data = make_data(num_samples, sample_bytes, fixed_length=fixed, seed=seed)
    hashes, data_bytes = data.hashes, data.nbytes
    written = _write_cases(root, cases, data, bar=bar, label=label, group_rows=group_rows)
    limit_file = root / "read-limit.npy"
    np.save(limit_file, data.values)
    # the machine's load moves: measure before and after the epochs, divide by the best
    limit_before = measure_read_limit(limit_file)
    check_Bps = measure_check_rate(data)
    del data
    for case in cases:
        path = case_path(root, case)
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
    return rows


def _write_cases(
    root: Path,
    cases: Sequence[FormatCase],
    data: BenchData,
    *,
    bar: Any,
    label: str,
    group_rows: int,
) -> dict[str, dict[str, Any]]:
    """Write ``data`` in every case's format under ``root``: per case, its time and size."""
    written: dict[str, dict[str, Any]] = {}
    for case in cases:
        bar.set_postfix_str(f"write {label} {case.name}")
        path = case_path(root, case)
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
    return written


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
