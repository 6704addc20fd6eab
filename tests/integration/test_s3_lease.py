"""The lease of an S3 output's lock object (``prep/remote_lock.py``), against the moto server of
``test_s3.py``: a live holder renews it, a dead holder's lock is taken over from another host
once the lease expired (never before), and a holder that lost its lock does not publish."""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import pytest

import shardload
from shardload.errors import StoreLockedError
from shardload.prep import remote_lock
from shardload.prep.remote_lock import ObjectLock

from . import test_s3 as _s3

_config, _fs = _s3._config, _s3._fs
s3_endpoint, s3_env = _s3.s3_endpoint, _s3.s3_env  # the moto server and a fresh bucket

pytestmark = pytest.mark.integration


def _lock(fs: Any, path: str, lease_s: float) -> ObjectLock:
    return ObjectLock(fs, path, out_url="s3://out", lock_url=f"s3://{path}", lease_s=lease_s)


def _as_host(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(remote_lock.socket, "gethostname", lambda: name)


def _wait(cond: Any, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.1)


def test_a_live_holder_renews_its_lease_and_keeps_the_lock(s3_env, monkeypatch):
    """A lease of 3 s (renewed every 1 s, trusted 2 s after each renewal): long enough that a
    renewal to the moto server on a loaded 2-core machine lands in time (a 1 s lease, trusted
    0.67 s, was lost once in a loaded CI run), short enough to outlive in the test."""
    fs = _fs(s3_env["options"])
    path = f"{s3_env['bucket']}/x.partial.lock"
    _as_host(monkeypatch, "host-a")
    a = _lock(fs, path, 3.0)
    a.acquire()
    first = json.loads(fs.cat_file(path))
    assert first["lease_s"] == 3.0 and first["host"] == "host-a"
    time.sleep(4.5)  # 1.5 leases: without renewals it would have expired
    assert json.loads(fs.cat_file(path))["renewals"] >= 2
    _as_host(monkeypatch, "host-b")
    with pytest.raises(StoreLockedError, match=r"lease 3 s, last renewed \d+ s ago"):
        _lock(fs, path, 3.0).acquire()
    a.check()  # still held
    a.release()
    assert not fs.exists(path)


def test_a_dead_holder_on_another_host_is_taken_over_once_its_lease_expired(
    s3_env, tmp_path, monkeypatch, caplog
):
    """Before: a lock left by a run on another host was never taken over (the error said to
    delete it by hand). Now: refused while its lease runs, taken over after it."""
    fs = _fs(s3_env["options"])
    url = f"s3://{s3_env['bucket']}/store"
    path = f"{s3_env['bucket']}/store.partial.lock"
    _as_host(monkeypatch, "host-a")
    dead = _lock(fs, path, 1.0)
    dead.acquire()
    dead._stop.set()  # its process dies: no more renewals, the object stays
    dead._heartbeat.join()
    monkeypatch.undo()
    with pytest.raises(StoreLockedError, match=r"host host-a.*re-run once its lease expires"):
        _lock(fs, path, 1.0).acquire()  # this host, at once: the lease runs
    time.sleep(3.1)  # the lease (1 s) + S3's whole seconds
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    caplog.set_level("WARNING", logger="shardload")
    store = shardload.prepare(cfg, progress=False)
    assert len(store) == 120
    assert "its lease expired" in caplog.text
    assert not fs.exists(path)
    with pytest.raises(StoreLockedError, match=r"this run lost the lock on s3://out"):
        dead.check()  # had it come back, the old holder would find its lock gone
    dead.release()  # never removes a lock it no longer holds


def test_of_two_runs_taking_over_an_expired_lock_one_wins(s3_env, monkeypatch):
    fs = _fs(s3_env["options"])
    path = f"{s3_env['bucket']}/x.partial.lock"
    fs.pipe_file(
        path, json.dumps({"pid": 1, "host": "host-a", "lease_s": 1, "started": "then"}).encode()
    )
    time.sleep(3.1)
    _as_host(monkeypatch, "host-b")
    locks = [_lock(fs, path, 30.0) for _ in range(2)]
    won, lost = [], []
    start = threading.Barrier(2)

    def take(lock: ObjectLock) -> None:
        start.wait()
        try:
            lock.acquire()
            won.append(lock)
        except StoreLockedError as exc:
            lost.append(str(exc))

    threads = [threading.Thread(target=take, args=(lock,)) for lock in locks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1 and len(lost) == 1, (won, lost)
    assert "another prepare is writing" in lost[0]
    won[0].release()


def test_a_holder_that_lost_its_lock_does_not_publish(s3_env, tmp_path, monkeypatch):
    """The lock object is replaced while the run writes (another host took it over): the run's
    next renewal is refused, and it stops with an error saying so; no manifest is put and the
    other run's lock stays."""
    monkeypatch.setenv("SHARDLOAD_LOCK_LEASE_S", "1.5")
    monkeypatch.setenv("SHARDLOAD_THROTTLE_S", "0.3")
    fs = _fs(s3_env["options"])
    url = f"s3://{s3_env['bucket']}/store"
    path = f"{s3_env['bucket']}/store.partial.lock"
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    errors: list[BaseException] = []

    def run() -> None:
        try:
            shardload.prepare(cfg, progress=False)
        except BaseException as exc:  # checked below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    _wait(lambda: fs.exists(path))
    other = json.dumps({"pid": 7, "host": "host-b", "lease_s": 600, "started": "now"}).encode()
    fs.pipe_file(path, other)  # what a take-over by host-b leaves
    t.join(timeout=240)
    assert len(errors) == 1, errors
    assert isinstance(errors[0], StoreLockedError), repr(errors[0])
    assert f"this run lost the lock on {url}" in str(errors[0])
    assert "renewal was refused" in str(errors[0])
    assert not fs.exists(f"{s3_env['bucket']}/store/shardload.json")
    assert fs.cat_file(path) == other


def test_a_bad_lease_setting_is_a_config_error_naming_it(monkeypatch):
    monkeypatch.setenv("SHARDLOAD_LOCK_LEASE_S", "soon")
    with pytest.raises(shardload.errors.ConfigError, match="SHARDLOAD_LOCK_LEASE_S='soon'"):
        remote_lock.lease_s_from_env()
