"""Kill ``shardload prepare`` subprocesses at chosen moments, resume, compare with a clean run.

Shared by the kill campaign (slow) and its smoke test. A *kill point* is a signal and a trigger:
``"job"`` (right after ``OUT.partial`` is created), an integer ``k`` (once ``k`` more progress
records than at launch exist), ``"all"`` (every block recorded: the merge / publish phase) or a
float (seconds after launch).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml

import shardload

SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM}


def write_config(tmp_path: Path, conf: dict) -> Path:
    path = tmp_path / f"conf-{conf['format']}.yaml"
    path.write_text(yaml.safe_dump(conf))
    return path


def records(progress: Path) -> int:
    try:
        return sum(1 for e in os.scandir(progress) if e.name.startswith("block-"))
    except FileNotFoundError:
        return 0


def launch(conf: Path, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "shardload", "prepare", str(conf), "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )


def kill_at(
    conf: Path, out: Path, num_blocks: int, sig: str, trigger: object, env: dict[str, str]
) -> str:
    """Run prepare and kill its whole process group at ``trigger``; what happened, in words."""
    partial = out.with_name(out.name + ".partial")
    progress = partial / "_progress"
    start = records(progress)
    proc = launch(conf, env)
    t0 = time.monotonic()
    fired = None
    try:
        while proc.poll() is None and time.monotonic() - t0 < 120:
            n = records(progress)
            if (
                (trigger == "job" and (progress / "job.json").exists())
                or (trigger == "all" and n >= num_blocks)
                or (isinstance(trigger, int) and n >= start + trigger)
                or (isinstance(trigger, float) and time.monotonic() - t0 >= trigger)
            ):
                os.killpg(proc.pid, SIGNALS[sig])
                fired = f"{sig} at {trigger!r} ({n} records)"
                break
            time.sleep(0.003)
    finally:
        if proc.poll() is None and fired is None:
            os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=60)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # stragglers (pool workers) of the group
    if fired is None:
        assert proc.returncode == 0, err.decode()[-3000:]
        return "finished before the kill point"
    return fired


def finish(conf: Path, out: Path, env: dict[str, str]) -> None:
    if out.exists():
        return  # published by a run killed after its rename
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "prepare", str(conf), "--no-progress"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]


def assert_same_store(got: Path, want: Path) -> None:
    a, b = shardload.open_store(got), shardload.open_store(want)
    assert a.manifest.complete and a.manifest.chunk_bounds == b.manifest.chunk_bounds
    for name in b.manifest.arrays:
        x, y = a.read(name), b.read(name)
        if b.manifest.arrays[name].is_ragged:  # (values, lengths)
            assert a.manifest.arrays[name].ragged == b.manifest.arrays[name].ragged
            np.testing.assert_array_equal(x.lengths, y.lengths)
            x, y = x.values, y.values
        assert x.dtype == y.dtype and x.shape == y.shape
        bad = np.flatnonzero(~((x == y) | (np.isnan(x) & np.isnan(y))).reshape(len(x), -1).all(1))
        assert not len(bad), f"array {name!r}: rows {bad[:10].tolist()}... differ from a clean run"
        sa, sb = a.manifest.stats[name], b.manifest.stats[name]
        np.testing.assert_allclose(sa.mean, sb.mean, rtol=1e-12)
        np.testing.assert_allclose(sa.std, sb.std, rtol=1e-12)
        assert np.array_equal(sa.count, sb.count)
        np.testing.assert_array_equal(sa.min, sb.min)
        np.testing.assert_array_equal(sa.max, sb.max)
    assert not got.with_name(got.name + ".partial").exists()


def campaign(
    tmp_path: Path, conf: dict, kill_points: list[tuple[str, object]], *, throttle_s: float
) -> list[str]:
    """Clean reference in-process, then kill/resume ``conf`` at every kill point, then finish;
    the resumed store must equal the clean one value for value."""
    ref = shardload.prepare(
        {**conf, "out": str(tmp_path / f"ref-{conf['format']}"), "execution": {"scheduler": "sync"}}
    )
    num_blocks = len(ref.manifest.options["blocks"]) - 1
    path = write_config(tmp_path, conf)
    out = tmp_path / conf["out"]
    env = {**os.environ, "SHARDLOAD_THROTTLE_S": str(throttle_s)}
    log = []
    for sig, trigger in kill_points:
        if out.exists():
            break
        log.append(kill_at(path, out, num_blocks, sig, trigger, env))
    finish(path, out, env)
    assert_same_store(out, Path(ref.url))
    return log
