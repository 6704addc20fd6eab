"""``shardload bench formats``: the command's outputs on a tiny dataset, and its checks.

Rates are never asserted (the benchmark measures, the docs report); what is asserted is that
every format and setting is run, the outputs carry the promised columns, and a reader that
returns a wrong sample makes the benchmark fail.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("pyarrow")
pytest.importorskip("webdataset")

from shardload.bench import format_epoch as fe
from shardload.bench import format_io as fio
from shardload.bench.format_cases import select_cases
from shardload.bench.format_data import make_data, plan_lengths
from shardload.bench.format_run import run_formats

REPO = Path(__file__).resolve().parents[1]
REQUIRED = {
    "format",
    "variant",
    "mmap",
    "fixed_length",
    "shuffle",
    "workers",
    "samples_per_s",
    "MB_per_s",
    "ratio_to_read_limit",
    "read_limit_MB_per_s",
    "peak_rss_MB",
    "files",
    "bytes_on_disk",
    "write_s",
    "complete_epoch",
}
MAP_FORMATS = {"npy-dir", "npy-stack", "zarr", "hdf5", "arrow", "parquet", "webdataset"}
MMAP_FORMATS = {"npy-dir", "npy-stack", "hdf5", "arrow", "parquet"}


def _squashfs_expected() -> bool:
    from shardload.bench.format_squashfs import squashfs_unavailable

    return squashfs_unavailable() is None


def test_cli_writes_results_report_and_plots_for_every_format(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    cmd = [
        sys.executable,
        "-m",
        "shardload",
        "bench",
        "formats",
        "--samples",
        "12",
        "--sample-bytes",
        "256",
        "--workers",
        "0",
        "--out",
        str(out),
    ]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((out / "results.json").read_text())
    assert isinstance(rows, list) and rows
    for row in rows:
        assert set(row) >= REQUIRED, REQUIRED - set(row)
        assert row["complete_epoch"] is True
        assert row["samples_read"] == 12
        assert row["samples_per_s"] > 0 and row["ratio_to_read_limit"] > 0
    expected = MAP_FORMATS | ({"squashfs"} if _squashfs_expected() else set())
    assert {r["format"] for r in rows} == expected
    zarr_variants = {r["variant"] for r in rows if r["format"] == "zarr"}
    assert zarr_variants == {"unsharded-none", "unsharded-zstd", "sharded-none", "sharded-zstd"}
    settings = {
        (r["format"], r["variant"], r["mmap"], r["fixed_length"], r["shuffle"]) for r in rows
    }
    for fmt in expected:
        mmaps = {r["mmap"] for r in rows if r["format"] == fmt}
        assert mmaps == ({False, True} if fmt in MMAP_FORMATS | {"squashfs"} else {"n/a"}), fmt
    # every (format, mmap) ran fixed and variable, sequential and shuffled
    assert len(settings) == len({s[:3] for s in settings}) * 4
    report = (out / "report.md").read_text()
    assert "| format |" in report and "What this run teaches" in report
    for png in ("formats_fixed.png", "formats_variable.png", "formats_storage.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "data").exists()  # the written formats are removed unless --keep-data


def test_workers_read_map_style_and_webdataset_formats(tmp_path: Path) -> None:
    rows = run_formats(
        tmp_path,
        num_samples=20,
        sample_bytes=128,
        workers=[1],
        batch_size=4,
        cases=select_cases(["npy-stack", "webdataset"]),
        progress=False,
    )
    assert {r["workers"] for r in rows} == {1}
    assert {r["format"] for r in rows} == {"npy-stack", "webdataset"}
    assert all(r["complete_epoch"] and r["samples_read"] == 20 for r in rows)


@pytest.mark.parametrize("fixed", [True, False])
def test_a_corrupt_sample_fails_the_epoch(tmp_path: Path, fixed: bool) -> None:
    data = make_data(10, 64, fixed_length=fixed, seed=3)
    folder = tmp_path / "npy-dir"
    fio.write_npy_dir(data, folder, group_rows=4)
    victim = fio.sample_file(folder, 7)
    arr = np.load(victim)
    arr[len(arr) // 2] += 1.0  # one value of one sample changed on disk
    np.save(victim, arr)
    reader = fio.NpyDirReader(folder, mmap=True)

    def make():
        return fe.map_loader(reader, num_samples=10, shuffle=True, seed=0, batch_size=3, workers=0)

    with pytest.raises(fe.FormatCheckError, match="sample 7 differs"):
        fe.time_epoch(make, data.hashes, what="npy-dir", max_epoch_s=60)


def test_a_reader_that_repeats_or_skips_samples_fails() -> None:
    data = make_data(6, 32, fixed_length=True, seed=0)

    class Repeat:
        def read(self, i: int) -> np.ndarray:
            return data.sample(0)

    def make():
        return fe.map_loader(
            Repeat(), num_samples=6, shuffle=False, seed=0, batch_size=2, workers=0
        )

    with pytest.raises(fe.FormatCheckError, match="sample 1 differs"):
        fe.time_epoch(make, data.hashes, what="repeat", max_epoch_s=60)

    checker = fe.EpochChecker(data.hashes, what="short")
    checker.check(np.array([0]), data.sample(0), np.array([len(data.sample(0))]))
    with pytest.raises(fe.FormatCheckError, match="read twice"):
        checker.check(np.array([0]), data.sample(0), np.array([len(data.sample(0))]))
    with pytest.raises(fe.FormatCheckError, match="missed 5 of 6"):
        checker.finish()


def test_variable_lengths_are_seeded_and_ragged() -> None:
    a = plan_lengths(500, 400, fixed_length=False, seed=1)
    assert np.array_equal(a, plan_lengths(500, 400, fixed_length=False, seed=1))
    assert not np.array_equal(a, plan_lengths(500, 400, fixed_length=False, seed=2))
    assert a.min() >= 25 and a.max() <= 175 and len(set(a.tolist())) > 50
    assert abs(a.mean() - 100) < 10
    data = make_data(5, 400, fixed_length=False, seed=1)
    assert [len(data.sample(i)) for i in range(5)] == plan_lengths(
        5, 400, fixed_length=False, seed=1
    ).tolist()


def test_squashfs_skips_with_a_reason_without_the_tools(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardload.bench import formats

    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert "mksquashfs" in (formats.squashfs_unavailable() or "")


def test_a_skipped_format_is_named_with_its_reason_in_the_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardload.bench import format_squashfs

    monkeypatch.setattr(format_squashfs.shutil, "which", lambda name: None)
    rows = run_formats(
        tmp_path,
        num_samples=4,
        sample_bytes=64,
        workers=[0],
        cases=select_cases(["npy-stack", "squashfs"]),
        progress=False,
    )
    assert {r["format"] for r in rows} == {"npy-stack"}
    report = (tmp_path / "report.md").read_text()
    assert "Skipped squashfs-npy-stack-zstd: mksquashfs, squashfuse, fusermount not found" in report
    meta = json.loads((tmp_path / "meta.json").read_text())
    assert "mksquashfs" in meta["skipped"]["squashfs-npy-stack-zstd"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--samples", "0"], "--samples must be >= 1"),
        (["--sample-bytes", "2"], "--sample-bytes must be >= 4"),
        (["--workers", "0,x"], "--workers: expected comma-separated integers"),
        (["--formats", "npy,zarr"], "--formats: unknown ['npy']"),
    ],
)
def test_bad_options_are_refused_by_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    from shardload.cli.app import main

    assert main(["bench", "formats", "--out", str(tmp_path), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "results.json").exists()


def test_findings_lead_with_in_process_figures_and_give_the_workers_beside() -> None:
    from shardload.bench.format_report import findings

    def row(fmt: str, workers: int, rate: float) -> dict:
        return {
            "format": fmt,
            "variant": "",
            "mmap": "n/a",
            "fixed_length": True,
            "shuffle": False,
            "workers": workers,
            "samples_per_s": rate,
            "ratio_to_read_limit": rate / 100_000,
            "capped": False,
        }

    # at small sizes worker start-up makes 2 workers ~10x slower than in-process
    rows = [
        row("npy", 0, 80_000),
        row("npy", 2, 8_000),
        row("hdf5", 0, 40_000),
        row("hdf5", 2, 9_000),
    ]
    lead = findings(rows)[0]
    assert lead == (
        "- Fixed length, sequential, in-process (0 workers): fastest npy at 0.80 of the read "
        "limit (80,000 samples/s; 2 workers: 8,000 samples/s, 0.08 of the limit), slowest hdf5 "
        "at 0.40 (40,000 samples/s; 2 workers: 9,000 samples/s, 0.09 of the limit)."
    )
