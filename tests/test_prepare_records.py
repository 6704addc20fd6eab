"""What a prepare run records as it goes (issue 13, items 9 and 10): progress records without
per-feature statistics, statistics that resume bit for bit, fsyncs deferred to the recorder."""

from __future__ import annotations

import errno
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import StoreError
from shardload.formats.npy import write as npy
from shardload.prep import commit as commit_mod
from shardload.prep import run as prep_run
from shardload.prep import tasks as pipeline
from shardload.prep.config import load_config
from shardload.prep.recorder import DurableRecorder


def conf(src: Path, out: Path, **kw) -> dict:
    return {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a", "b", "c"], "y": ["b"]},
        "chunk_rows": 7,
        "out": str(out),
        "format": "npy",
        "compression": "none",
        **kw,
    }


def test_progress_records_carry_no_per_feature_statistics(tmp_path, monkeypatch):
    """A wide array (one row per block): a record used to hold 6 float64 values per feature
    (48x the block's uint8 data); now it holds the checksums only."""
    nf = 20_000
    rng = np.random.default_rng(0)
    v = rng.integers(0, 255, (6, nf), dtype=np.uint8)
    xr.Dataset({"v": (("sample", "f"), v)}).to_netcdf(tmp_path / "w.nc")
    sizes = []
    real = commit_mod.BlockCommit.record

    def record(self, block, fields):
        real(self, block, fields)
        sizes.append(self.record_path(block).stat().st_size)

    monkeypatch.setattr(commit_mod.BlockCommit, "record", record)
    s = shardload.prepare(
        {
            "source": {"paths": [str(tmp_path / "w.nc")]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["v"]},
            "chunk_rows": 1,
            "out": str(tmp_path / "s"),
            "splits": {},
        }
    )
    assert len(sizes) == 6 and max(sizes) < nf  # less than one byte per feature
    x = v.astype(np.float64)
    st = s.manifest.stats["x"]
    np.testing.assert_allclose(st.mean, x.mean(0), rtol=1e-15)
    np.testing.assert_allclose(st.std, x.std(0), atol=1e-12)
    np.testing.assert_array_equal(st.min, x.min(0))
    np.testing.assert_array_equal(st.max, x.max(0))


def _fail_at(monkeypatch, chunk: int) -> None:
    real = npy.NpyWriter.write_block

    def flaky(self, root, name, chunk_index, start, data, *, bounds):
        if chunk_index == chunk:
            raise OSError(errno.EIO, "Input/output error")
        return real(self, root, name, chunk_index, start, data, bounds=bounds)

    monkeypatch.setattr(npy.NpyWriter, "write_block", flaky)


@pytest.mark.parametrize("saved", [True, False], ids=["saved-prefix", "nothing-saved"])
def test_resumed_statistics_equal_a_clean_run_bit_for_bit(tmp_path, monkeypatch, saved):
    """Interrupted after some blocks, then resumed: the statistics come from a saved prefix
    (or none) plus the recorded blocks read again from the source, merged in block order."""
    from conftest import make_dataset

    src = tmp_path / "src.nc"
    make_dataset(300, seed=3).to_netcdf(src)
    ref = shardload.prepare(conf(src, tmp_path / "ref"))
    if saved:  # save after every block
        monkeypatch.setattr(prep_run, "STATS_SAVE_BYTES", 0)
        monkeypatch.setattr(prep_run, "STATS_SAVE_FACTOR", 0)
    c = conf(src, tmp_path / "s", execution={"scheduler": "threads", "num_workers": 2})
    _fail_at(monkeypatch, 30)
    with pytest.raises(StoreError, match="chunk 30"):
        shardload.prepare(c)
    monkeypatch.undo()
    progress = tmp_path / "s.partial" / "_progress"
    recorded = {int(p.stem[6:]) for p in progress.glob("block-*.npz")}
    # blocks still in flight when block 30 failed (a window of 2 x 2 workers) may be missing
    assert len(recorded) >= 26 and 30 not in recorded
    assert (progress / "stats.npz").exists() == saved
    prefix = int(np.load(progress / "stats.npz")["blocks"]) if saved else 0
    # saved after every block: the prefix is every recorded block up to the first gap
    contiguous = min(set(range(31)) - recorded)
    assert prefix == (contiguous if saved else 0)
    again = []
    real_stats = pipeline.block_stats
    monkeypatch.setattr(pipeline, "block_stats", lambda j, b: again.append(b) or real_stats(j, b))
    s = shardload.prepare(c)
    assert sorted(again) == sorted(b for b in recorded if b >= prefix)
    for name in ("x", "y"):
        np.testing.assert_array_equal(s.read(name), ref.read(name))
        a, b = s.manifest.stats[name], ref.manifest.stats[name]
        for f in ("mean", "std", "min", "max", "nan_count"):
            assert np.array_equal(getattr(a, f), getattr(b, f)), (name, f)


def test_write_tasks_leave_their_fsyncs_to_the_recorder(tmp_path, small_nc, monkeypatch):
    """Threads: data files are fsynced by the recorder thread (before each block's record,
    tests/test_commit.py checks that), not by the write tasks, which go on meanwhile."""
    by_thread: dict[str, int] = {}
    real = os.fsync

    def spy(fd):
        name = threading.current_thread().name
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".npy"):
            by_thread[name.split("_")[0]] = by_thread.get(name.split("_")[0], 0) + 1
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    shardload.prepare(conf(small_nc, tmp_path / "s", execution={"scheduler": "threads"}))
    assert by_thread == {"shardload-fsync": 16}, by_thread  # 8 blocks x 2 arrays


def test_workers_elsewhere_fsync_their_own_files(tmp_path, small_nc):
    c = lambda ex: load_config(conf(small_nc, tmp_path / "s", execution=ex))  # noqa: E731
    assert prep_run.workers_share_disk_cache(c({"scheduler": "threads"}))
    assert prep_run.workers_share_disk_cache(c({"scheduler": "processes"}))
    assert not prep_run.workers_share_disk_cache(
        c({"scheduler": "distributed", "address": "tcp://127.0.0.1:1"})
    )


def test_recorder_raises_a_failed_fsync_and_records_nothing_after_it(tmp_path):
    done = []
    c = commit_mod.BlockCommit(tmp_path / "o", fingerprint="f", num_blocks=3)
    ok = tmp_path / "ok.bin"
    ok.write_bytes(b"x")
    rec = DurableRecorder(c, done.append)
    rec.put([str(ok)], 0)
    rec.put([str(tmp_path / "missing.bin")], 1)
    rec.put([str(ok)], 2)
    with pytest.raises(FileNotFoundError, match=r"missing\.bin"):
        rec.close()
    assert done == [0] and str(ok) in c.synced


def test_recorder_fsyncs_the_files_of_waiting_blocks_together(tmp_path, monkeypatch):
    """Blocks waiting for the recorder have their files fsynced together (fsyncs in flight
    share the file system's journal commits), one at a time before; each is still recorded
    in order, once its own files are durable."""
    files = [tmp_path / f"f{i}.bin" for i in range(6)]
    for f in files:
        f.write_bytes(b"x" * 4096)
    real = os.fsync
    lock = threading.Lock()
    active, most = [0], [0]
    synced: set[str] = set()

    def spy(fd):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.02)  # room for fsyncs to overlap
            return real(fd)
        finally:
            with lock:
                active[0] -= 1
                synced.add(os.readlink(f"/proc/self/fd/{fd}"))

    gate = threading.Event()
    done = []

    def on_durable(item):
        if item == 0:
            assert gate.wait(30)
        assert str(files[item]) in synced  # its file is durable before its record
        done.append(item)

    monkeypatch.setattr(os, "fsync", spy)
    c = commit_mod.BlockCommit(tmp_path / "o", fingerprint="f", num_blocks=6)
    rec = DurableRecorder(c, on_durable)
    for i, f in enumerate(files):  # 1-5 wait while block 0 is being recorded
        rec.put([str(f)], i)
    gate.set()
    rec.close()
    assert done == list(range(6))
    assert most[0] > 1, "the waiting blocks' fsyncs ran one at a time"


def test_recorder_holds_at_most_maxsize_blocks_those_being_fsynced_included(tmp_path):
    """The blocks handed over and not yet recorded are what a prepare to object storage keeps
    on local disk: at most ``maxsize`` of them, those in the recorder's batch of fsyncs
    included (with the batch taken off the queue, ``maxsize`` more could wait beside it: the
    S3 campaign's local-disk bound was passed by a block)."""
    files = [tmp_path / f"f{i}.bin" for i in range(8)]
    for f in files:
        f.write_bytes(b"x")
    gate, first = threading.Event(), threading.Event()

    def on_durable(item):
        first.set()
        assert gate.wait(30)

    c = commit_mod.BlockCommit(tmp_path / "o", fingerprint="f", num_blocks=8)
    rec = DurableRecorder(c, on_durable, maxsize=3)
    handed = [0]

    def writer():
        for i, f in enumerate(files):
            rec.put([str(f)], i)
            handed[0] += 1

    t = threading.Thread(target=writer, daemon=True)
    t.start()
    assert first.wait(30)  # block 0 is being recorded: the recorder holds it
    deadline = time.monotonic() + 30
    while handed[0] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)  # room for a put the bound should stop
    assert handed[0] == 3, f"{handed[0]} blocks handed over for a bound of 3"
    gate.set()
    t.join(30)
    rec.close()
    assert handed[0] == 8


def test_write_tasks_do_not_sleep_without_the_throttle(tmp_path, small_nc, monkeypatch):
    """The throttle (``SHARDLOAD_THROTTLE_S``, a testing aid) unset, a write task does not
    call ``time.sleep`` (``sleep(0)`` still gave up the GIL: 1-5 ms a call beside the
    statistics thread, once per block and array)."""
    monkeypatch.delenv("SHARDLOAD_THROTTLE_S", raising=False)
    calls = []
    real = pipeline.time.sleep
    monkeypatch.setattr(pipeline.time, "sleep", lambda s: (calls.append(s), real(s)))
    shardload.prepare(conf(small_nc, tmp_path / "s", execution={"scheduler": "sync"}))
    assert calls == []
