"""The publish's fsyncs (shardload.prep.commit.BlockCommit.publish): every file of the store is
durable before the manifest, in one pass of fsyncs issued together, each path once."""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import xarray as xr

import shardload
from shardload.prep import commit as commit_mod


def _grid_nc(path: Path) -> Path:
    rng = np.random.default_rng(0)
    ds = xr.Dataset(
        {"t": (("lat", "lon"), rng.normal(size=(40, 60)).astype("f4"))},
        coords={"lat": np.linspace(-80, 80, 40), "lon": np.linspace(0, 354, 60)},
    )
    ds.to_netcdf(path, engine="h5netcdf")
    return path


def test_publish_fsyncs_each_path_once_together_and_all_before_the_manifest(tmp_path, monkeypatch):
    """Every file and folder of the store is fsynced once, in one pass of fsyncs in flight
    together, the manifest's temporary file among them, and all are durable before the
    manifest is renamed into place (before: the manifest's fsync came alone after the pass)."""
    src = _grid_nc(tmp_path / "grid.nc")
    out = tmp_path / "store"
    real_fsync, real_publish, real_replace = os.fsync, commit_mod.BlockCommit.publish, os.replace
    synced: list[str] = []  # paths fsynced inside the publish, in order
    events: list[tuple[str, str]] = []  # ("start" | "end", path) inside the publish
    inodes: set[tuple[int, int]] = set()  # every file fsynced in the run (renamed later)
    active, most = [0], [0]
    lock = threading.Lock()
    in_publish = threading.Event()
    renamed: list[tuple[int, int]] = []  # (fsyncs done, fsyncs in flight) at the manifest's rename

    def spy(fd):
        st = os.fstat(fd)
        path = os.readlink(f"/proc/self/fd/{fd}")
        with lock:
            inodes.add((st.st_dev, st.st_ino))
            if in_publish.is_set():
                synced.append(path)
                events.append(("start", path))
            active[0] += 1
            most[0] = max(most[0], active[0])
        try:
            time.sleep(0.005 if in_publish.is_set() else 0)  # room for fsyncs to overlap
            return real_fsync(fd)
        finally:
            with lock:
                active[0] -= 1
                if in_publish.is_set():
                    events.append(("end", path))

    def replace(src_path, dst, *a, **k):
        if in_publish.is_set() and os.fspath(dst).endswith(".partial/shardload.json"):
            with lock:
                renamed.append((len(synced), active[0]))
        return real_replace(src_path, dst, *a, **k)

    def publish(self, files):
        in_publish.set()
        try:
            return real_publish(self, files)
        finally:
            in_publish.clear()

    monkeypatch.setattr(os, "fsync", spy)
    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(commit_mod.BlockCommit, "publish", publish)
    shardload.prepare(
        {
            "source": {"paths": [str(src)], "variables": ["t"]},
            "sample_dims": ["lat", "lon"],
            "arrays": {"x": ["t"]},
            "out": str(out),
        }
    )
    partial = str(out) + ".partial"
    assert len(renamed) == 1 and renamed[0][1] == 0, renamed  # no fsync still in flight
    before = synced[: renamed[0][0]]
    manifest = [p for p in before if ".shardload.json.tmp" in p]
    assert len(manifest) == 1, manifest
    counts = Counter(before)
    assert counts and max(counts.values()) == 1, counts  # each path once
    assert counts[partial] == 1 and len(counts) > 10  # the whole tree, its folders included
    assert not any("_progress" in p for p in counts)  # durable since they were written
    assert most[0] > 1, "the publish's fsyncs ran one at a time"
    # the manifest's fsync went with the pass: another one in flight when it started, or
    # started while it ran
    start, end = events.index(("start", manifest[0])), events.index(("end", manifest[0]))
    in_flight = sum(1 if kind == "start" else -1 for kind, _ in events[:start])
    assert in_flight > 0 or ("start" in [kind for kind, _ in events[start + 1 : end]]), events
    # every file of the published store was fsynced (by the recorder or by the publish)
    files = [p for p in out.rglob("*") if p.is_file()]
    missing = [p for p in files if (p.stat().st_dev, p.stat().st_ino) not in inodes]
    assert files and not missing, missing


def test_fsync_all_raises_a_failed_fsync(tmp_path, monkeypatch):
    from shardload.util.durable import fsync_all

    paths = [tmp_path / f"f{i}" for i in range(5)]
    for p in paths:
        p.write_bytes(b"x")
    real = os.fsync

    def failing(fd):
        if os.readlink(f"/proc/self/fd/{fd}").endswith("f3"):
            raise OSError(5, "Input/output error")
        return real(fd)

    monkeypatch.setattr(os, "fsync", failing)
    try:
        fsync_all(paths, folders=[tmp_path])
    except OSError as exc:
        assert exc.errno == 5
    else:
        raise AssertionError("a failed fsync was not raised")
