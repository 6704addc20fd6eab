"""The commit protocol (shardload.prep.commit): lock, records, resume, publish, overwrite."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import numpy as np
import pytest

from shardload.errors import StoreExistsError, StoreLockedError
from shardload.formats.registry import get_writer
from shardload.prep.commit import BlockCommit, write_block_durably
from shardload.prep.lock import OutputLock


def make(out: Path, fp: str = "fp1", n: int = 4, **kw) -> BlockCommit:
    return BlockCommit(out, fingerprint=fp, num_blocks=n, **kw)


def test_second_writer_is_refused_with_the_holder_named(tmp_path):
    out = tmp_path / "store"
    with make(out) as first:
        first.start(lambda root: None)
        with pytest.raises(StoreLockedError) as info, make(out, fp="other"):
            pass
        msg = str(info.value)
        assert f"another prepare is writing {out}" in msg
        assert f"pid {os.getpid()} on host {socket.gethostname()}, started 20" in msg
        assert first.root.exists()  # the loser touched nothing
    assert not Path(str(out) + ".partial.lock").exists()  # released and removed
    with make(out) as again:  # free again
        assert again.start(lambda root: None) == frozenset()


def test_lock_released_when_the_run_fails(tmp_path):
    out = tmp_path / "store"
    with pytest.raises(RuntimeError), make(out):
        raise RuntimeError("boom")
    lock = OutputLock(out)
    lock.acquire()
    lock.release()


def test_records_carry_named_arrays_and_resume_skips_them(tmp_path):
    out = tmp_path / "store"
    created = []
    with make(out) as c:
        assert c.start(created.append) == frozenset() and created == [c.root]
        c.record(1, {"x/mean": np.arange(3.0), "x/checksum": np.array([7], np.uint64)})
        c.record(3, {"x/mean": np.ones(3)})
    with make(out) as c:
        assert c.start(created.append) == {1, 3} and len(created) == 1  # resumed, not recreated
        assert c.todo() == [0, 2]
        r = c.read_record(1)
        np.testing.assert_array_equal(r["x/mean"], np.arange(3.0))
        assert r["x/checksum"].dtype == np.uint64 and r["x/checksum"][0] == 7
    with make(out, fp="changed") as c:  # another config: restarted from scratch
        assert c.start(created.append) == frozenset() and len(created) == 2
        assert c.todo() == [0, 1, 2, 3]


def test_publish_never_replaces_an_output_without_overwrite(tmp_path):
    out = tmp_path / "store"
    with make(out, n=1) as c:
        c.start(lambda root: None)
        c.record(0, {"v": np.zeros(1)})
        out.mkdir()  # someone else published meanwhile
        (out / "theirs").write_text("keep me")
        with pytest.raises(StoreExistsError, match="stays in"):
            c.publish({"shardload.json": b"{}"})
    assert (out / "theirs").read_text() == "keep me"
    assert (c.root / "shardload.json").exists()  # finished store kept for a later run
    with make(out, n=1, overwrite=True) as c:
        assert c.start(lambda root: None) == {0}
        c.publish({"shardload.json": b"{}"})
    assert (out / "shardload.json").exists() and not (out / "theirs").exists()
    assert not (out / "_progress").exists() and not c.root.exists()
    assert not list(tmp_path.glob("store.old-*"))


def test_existing_output_refused_before_anything_is_written(tmp_path):
    out = tmp_path / "store"
    out.mkdir()
    with pytest.raises(StoreExistsError), make(out):
        pass
    assert not c_partial(out).exists() and not Path(str(out) + ".partial.lock").exists()


def c_partial(out: Path) -> Path:
    return out.with_name(out.name + ".partial")


def test_staging_format_blocks_are_files_until_the_merge(tmp_path):
    """HDF5 (one file, library state lost on kill -9): each block is an fsynced npy file until
    finish_format builds data.h5 from all of them, from scratch."""
    from shardload.formats.base import FormatOptions
    from shardload.manifest.core import ArraySpec
    from shardload.plan.chunks import RegularBounds

    fmt = get_writer("hdf5")
    assert not fmt.parallel_write
    bounds = RegularBounds(10, 4)
    specs = {"x": ArraySpec("x", (10, 2), np.dtype("float32"), None, {})}
    data = np.arange(20, dtype="float32").reshape(10, 2)
    out = tmp_path / "store"

    def create(root):
        fmt.create(root, specs, bounds, FormatOptions("none"))

    with make(out, n=3) as c:
        c.start(create)
        for i, (a, b) in enumerate([(0, 4), (4, 8), (8, 10)]):
            write_block_durably(fmt, c.root, i, "x", i, a, data[a:b], bounds=bounds)
            c.record(i, {})
        (c.root / "data.h5").write_bytes(b"garbage: a file killed mid-write")
        c.finish_format(fmt, create, [(0, 0, 0), (1, 1, 4), (2, 2, 8)], ["x"], bounds=bounds)
        assert not list((c.root / "_staged").glob("*"))
        import h5py

        with h5py.File(c.root / "data.h5", "r") as f:
            np.testing.assert_array_equal(f["x"][:], data)


@pytest.mark.parametrize(
    "fmt",
    [
        {"format": "npy", "compression": "none"},
        {"format": "zarr", "compression": "lz4"},
        {"format": "zarr", "compression": "zstd", "shard_chunks": 2},
        {"format": "hdf5", "compression": "none"},
    ],
    ids=["npy", "zarr", "zarr-sharded", "hdf5"],
)
def test_every_block_is_fsynced_before_its_record(tmp_path, small_nc, monkeypatch, fmt):
    """When a block's progress record is written, every data file its task wrote has been
    fsynced (sync scheduler: one task at a time; their fsyncs are deferred to the recorder
    thread, and tasks go on meanwhile)."""
    import shardload
    from shardload.prep import commit as commit_mod
    from shardload.prep import tasks as pipeline

    synced: set[tuple[int, int]] = set()  # inodes (a file may be renamed after its fsync)
    real_fsync, real_record = os.fsync, commit_mod.BlockCommit.record

    def spy(fd):
        st = os.fstat(fd)
        synced.add((st.st_dev, st.st_ino))
        return real_fsync(fd)

    checked = []
    written: dict[int, set[tuple[int, int]]] = {}  # block: the data files its task wrote
    real_run = pipeline.run_block

    def data_files(root):
        return {
            (p.stat().st_dev, p.stat().st_ino)
            for p in root.rglob("*")
            if p.is_file()
            and "_progress" not in p.parts
            and p.name not in ("zarr.json", "data.h5")
            and not p.name.startswith(".")
        }

    def run_block(job, block):
        before = data_files(Path(job.partial_dir))
        res = real_run(job, block)
        written[block] = data_files(Path(job.partial_dir)) - before
        return res

    def record(self, block, fields):
        data = written[block]
        assert data and data <= synced, f"block {block}: {len(data - synced)} file(s) not fsynced"
        checked.append(block)
        return real_record(self, block, fields)

    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(pipeline, "run_block", run_block)
    monkeypatch.setattr(commit_mod.BlockCommit, "record", record)
    shardload.prepare(
        {
            "source": {"paths": [str(small_nc)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a", "b", "c"]},
            "chunk_rows": 7,
            "out": str(tmp_path / "s"),
            "execution": {"scheduler": "sync"},
            **fmt,
        }
    )
    assert len(checked) == (4 if "shard_chunks" in fmt else 8)


def test_lock_opened_before_its_release_is_not_trusted(tmp_path, monkeypatch):
    """B opened the lock file, A released (unlinked) it, C took a new one: B's flock on the
    old file must not count; B retries on the path and finds C's lock."""
    from shardload.prep import commit as commit_mod

    out = tmp_path / "store"
    a = OutputLock(out)
    a.acquire()
    stale = os.open(a.path, os.O_RDWR)  # B's open, before A's release
    a.release()
    c = OutputLock(out)
    c.acquire()
    real_open, opens = os.open, []

    def b_open(path, flags, mode=0o777):
        opens.append(path)
        return stale if len(opens) == 1 else real_open(path, flags, mode)

    monkeypatch.setattr(commit_mod.os, "open", b_open)
    with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
        OutputLock(out).acquire()
    assert len(opens) == 2  # the stale file was dropped and the path opened again
    c.release()


def test_cli_prepare_refused_while_another_run_holds_the_output(tmp_path, small_nc, capsys):
    import yaml

    from shardload.cli.app import main

    conf = tmp_path / "c.yaml"
    conf.write_text(
        yaml.safe_dump(
            {
                "source": {"paths": [str(small_nc)]},
                "sample_dims": ["sample"],
                "view": "flat",
                "arrays": {"x": ["a"]},
                "out": str(tmp_path / "store"),
            }
        )
    )
    holder = OutputLock(tmp_path / "store")
    holder.acquire()
    try:
        assert main(["prepare", str(conf), "--no-progress"]) == 2
    finally:
        holder.release()
    err = capsys.readouterr().err
    assert f"shardload prepare: error: another prepare is writing {tmp_path / 'store'}" in err
    assert f"pid {os.getpid()}" in err and "Traceback" not in err
    assert not (tmp_path / "store.partial").exists()


def test_a_resumed_run_removes_temporary_files_a_killed_run_left(tmp_path):
    """kill -9 inside write_atomic leaves ``.NAME.tmp-PID-THREAD`` (and HDF5's ``NAME.tmp``) in
    ``OUT.partial``: the run that resumes it (holding the lock, so every such file is a dead
    run's) removes them, so the published store, and the objects uploaded from it, hold none."""
    out = tmp_path / "store"
    with make(out, n=2) as c:
        c.start(lambda root: (root / "x").mkdir())
        c.record(0, {"v": np.zeros(1)})
    left = [
        c.root / ".checksums.npz.tmp-2147483000-140095134870400",
        c.root / "x" / ".zarr.json.tmp-2147483000-1",
        c.root / "data.h5.tmp",
    ]
    for p in left:
        p.write_bytes(b"half")
    (c.root / "x" / "c.tmp-notes").write_bytes(b"kept")  # a name write_atomic never makes
    with make(out, n=2) as c:
        assert c.start(lambda root: None) == {0}
        assert not any(p.exists() for p in left)
        c.record(1, {"v": np.zeros(1)})
        c.publish({"shardload.json": b"{}"})
    names = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert names == ["shardload.json", "x/c.tmp-notes"]


def test_a_fresh_start_fsyncs_nothing_until_the_first_record(tmp_path, monkeypatch):
    """A fresh run's job.json and folders are fsynced before its first record, not at its
    start (two journal commits before any task ran): a crash before any record loses
    nothing worth resuming, and a record is never durable without the job it belongs to."""
    real = os.fsync
    synced: list[str] = []

    def spy(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", spy)
    c = BlockCommit(tmp_path / "o", fingerprint="f", num_blocks=2)
    with c:
        synced.clear()  # the lock's own
        c.start(lambda root: None)
        assert synced == []
        c.record(0, {"a": np.zeros(3)})
        c.record(1, {"a": np.zeros(3)})
    job = [i for i, p in enumerate(synced) if "job.json" in p]
    records = [i for i, p in enumerate(synced) if "block-" in p]
    assert len(job) == 1 and len(records) == 2 and job[0] < records[0], synced
    assert str(c.root) in synced[: records[0]] and str(c.progress) in synced[: records[0]]
