"""Staging: local folders, archives, URLs, one copy per node, cleanup on every exit path."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import tarfile
import textwrap
import time
from collections import namedtuple
from pathlib import Path

import pytest

from conftest import make_store, python_env, spawn, tree_bytes
from shardload.errors import StagingError
from shardload.move.serve import serving
from shardload.move.staging import stage, staged

T = 30


def leftovers(to_dir: Path) -> list[str]:
    return sorted(p.name for p in to_dir.iterdir()) if to_dir.exists() else []


def test_local_folder(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    with staged(src, to) as path:
        assert path.parent == to.resolve() and path.name.startswith("store-")
        assert tree_bytes(path) == tree_bytes(src)
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert leftovers(to) == []
    assert tree_bytes(src)  # the source is untouched


@pytest.mark.parametrize(
    ("suffix", "mode", "nested"), [(".tar", "w", False), (".tgz", "w:gz", True)]
)
def test_tar_archive(tmp_path: Path, suffix: str, mode: str, nested: bool) -> None:
    src = make_store(tmp_path / "store")
    archive = tmp_path / f"store{suffix}"
    with tarfile.open(archive, mode) as tf:
        tf.add(src, arcname="store" if nested else ".")
    with staged(archive, tmp_path / "shm") as path:
        assert tree_bytes(path) == tree_bytes(src)
    assert leftovers(tmp_path / "shm") == []


def test_over_http_from_our_server(stores: Path, tmp_path: Path) -> None:
    with serving(stores) as url, staged(url + "alpha/", tmp_path / "shm") as path:
        assert path.name.startswith("alpha-")
        assert tree_bytes(path) == tree_bytes(stores / "alpha")
    assert leftovers(tmp_path / "shm") == []


def test_open_store_stage_to(tmp_path: Path) -> None:
    import shardload
    from _stores import make_store as prepared_store

    src = prepared_store(tmp_path / "p", fmt="npy", n=50, chunk_rows=7)
    to = tmp_path / "shm"
    with serving(tmp_path / "p") as url:
        store = shardload.open_store(url + "store", stage_to=to, stage_keep=True)
    # the server is gone: the store reads from its node-local copy
    assert Path(store.root).parent == to.resolve() and store.is_local
    for name in src.arrays:
        assert (store.read(name) == src.read(name)).all()
    first = shardload.open_store(src.root, stage_to=to, stage_keep=True)
    again = shardload.open_store(src.root, stage_to=to, stage_keep=True)
    assert first.root == again.root != store.root  # one copy per source, reused
    assert len([p for p in to.iterdir() if not p.name.startswith(".")]) == 2
    shutil.rmtree(to)


def test_keep_leaves_the_copy_and_a_later_run_reuses_it(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    with staged(src, to, keep=True) as path:
        pass
    assert tree_bytes(path) == tree_bytes(src)
    mtime = path.stat().st_mtime_ns
    assert stage(src, to) == path and path.stat().st_mtime_ns == mtime  # reused, not copied


def test_incomplete_store_is_refused(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store", complete=False)
    with pytest.raises(StagingError, match="complete: false"):
        stage(src, tmp_path / "shm")
    assert not any(p.startswith("store-") or ".tmp-" in p for p in leftovers(tmp_path / "shm"))


def test_not_enough_space(tmp_path: Path, monkeypatch) -> None:
    src = make_store(tmp_path / "store")
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(10**6, 10**6 - 100, 100))
    size = sum(len(b) for b in tree_bytes(src).values())
    with pytest.raises(StagingError, match=rf"needs {size:,} bytes .* 100 bytes .* free"):
        stage(src, tmp_path / "shm")
    assert not any(p.startswith("store-") for p in leftovers(tmp_path / "shm"))


def test_bad_source(tmp_path: Path) -> None:
    with pytest.raises(StagingError, match="not a store folder"):
        stage(tmp_path / "nothing", tmp_path / "shm")


WORKER = textwrap.dedent(
    """
    import logging, sys, time
    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    from pathlib import Path
    from shardload.move import staging_copy
    from shardload.move.staging import exit_on_sigterm, staged
    exit_on_sigterm()  # a program that wants cleanup on SIGTERM says so (the library does not)
    slow = float(sys.argv[3])
    if slow:
        real = staging_copy._copy_file
        def copy(a, b):
            print("copying", flush=True)
            time.sleep(slow)
            real(a, b)
        staging_copy._copy_file = copy
    with staged(sys.argv[1], sys.argv[2]) as path:
        files = {p.relative_to(path).as_posix(): p.stat().st_size for p in path.rglob("*") if p.is_file()}
        print("ready", path, len(files), sum(files.values()), flush=True)
        time.sleep(float(sys.argv[4]))
    """
)


def worker(src: Path, to: Path, slow: float = 0, hold: float = 0) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", WORKER, str(src), str(to), str(slow), str(hold)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=python_env(),
    )


@pytest.mark.integration
def test_two_processes_at_once_share_one_copy(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    procs = [worker(src, to, slow=0.1, hold=1.0) for _ in range(2)]
    try:
        outs = [p.communicate(timeout=T) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert [p.returncode for p in procs] == [0, 0], outs
    ready = [next(line for line in out.splitlines() if line.startswith("ready")) for out, _ in outs]
    size = sum(len(b) for b in tree_bytes(src).values())
    assert ready[0] == ready[1] and ready[0].endswith(f" 4 {size}")  # same path, complete data
    assert sum(" bytes in " in err for _, err in outs) == 1  # one copy
    assert sum("reusing " in err for _, err in outs) == 1
    assert leftovers(to) == []


@pytest.mark.integration
@pytest.mark.parametrize("when", ["copying", "ready"])
def test_sigterm_leaves_nothing(tmp_path: Path, when: str) -> None:
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    proc = worker(src, to, slow=0.5, hold=60)
    try:
        line = proc.stdout.readline()
        while not line.startswith(when):
            line = proc.stdout.readline()
            assert line, proc.stderr.read()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=T) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait(T)
    assert leftovers(to) == []


@pytest.mark.integration
def test_a_killed_copy_does_not_block_the_next_run(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    proc = worker(src, to, slow=5, hold=0)
    try:
        assert proc.stdout.readline().startswith("copying")
        proc.kill()  # SIGKILL: no handler runs, the temp folder and lock file stay
        proc.wait(T)
    finally:
        proc.kill()
    assert any(".tmp-" in name for name in leftovers(to))
    t0 = time.monotonic()
    with staged(src, to) as path:
        assert tree_bytes(path) == tree_bytes(src)
    assert time.monotonic() - t0 < 5
    assert leftovers(to) == []


@pytest.mark.integration
def test_cli_stage_keep_and_command(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    proc = spawn("stage", str(src), "--to", str(to), "--keep")
    out, err = proc.communicate(timeout=T)
    assert proc.returncode == 0, err
    staged_at = Path(out.strip().rsplit(" at ", 1)[1])
    assert out.startswith(f"staged {src} at ") and tree_bytes(staged_at) == tree_bytes(src)
    shutil.rmtree(staged_at)
    for name in leftovers(to):
        os.remove(to / name)

    check = "import os,sys; sys.exit(0 if os.path.isfile(sys.argv[1] + '/shardload.json') else 3)"
    run = f'{sys.executable} -c "{check}" {{}}'
    proc = spawn("stage", str(src), "--to", str(to), "--run", run)
    out, err = proc.communicate(timeout=T)
    assert proc.returncode == 0, (out, err)
    assert leftovers(to) == []


def test_cli_help(capsys) -> None:
    from shardload.cli.app import main

    with pytest.raises(SystemExit):
        main(["stage", "--help"])
    text = capsys.readouterr().out
    assert "--to" in text and "--keep" in text and ".tgz" in text and "SHARDLOAD_STAGED" in text


def test_users_file_records_the_source(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    with staged(src, tmp_path / "shm") as path:
        users = json.loads((path.parent / f".{path.name}.users").read_text())
        assert users["source"] == str(src.resolve()) and len(users["users"]) == 1


# -- archives with unsafe members, signals, PID reuse ---------------------------------------------
@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("../evil.txt", tarfile.REGTYPE),
        ("store/dev", tarfile.CHRTYPE),
        ("store/link", tarfile.SYMTYPE),
    ],
)
def test_unsafe_archive_member_is_a_staging_error_naming_it(tmp_path: Path, name, kind) -> None:
    src = make_store(tmp_path / "store")
    archive = tmp_path / "bad.tar"
    with tarfile.open(archive, "w") as tf:
        tf.add(src, arcname="store")
        info = tarfile.TarInfo(name)
        info.type = kind
        if kind != tarfile.REGTYPE:
            info.linkname = "/etc/passwd"
            tf.addfile(info)
        else:
            data = b"pwned"
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    with pytest.raises(StagingError, match="unsafe") as err:
        stage(archive, tmp_path / "shm")
    assert repr(name) in str(err.value)
    assert not (tmp_path / "evil.txt").exists()
    assert not any(p.startswith("bad-") for p in leftovers(tmp_path / "shm"))


def test_corrupt_archive_is_a_staging_error(tmp_path: Path) -> None:
    archive = tmp_path / "junk.tgz"
    archive.write_bytes(os.urandom(2000))
    with pytest.raises(StagingError, match=r"junk\.tgz"):
        stage(archive, tmp_path / "shm")


def test_the_library_installs_no_signal_handler(tmp_path: Path) -> None:
    src = make_store(tmp_path / "store")
    code = textwrap.dedent(
        """
        import signal, sys
        import shardload
        from shardload.move.staging import stage
        before = signal.getsignal(signal.SIGTERM)
        stage(sys.argv[1], sys.argv[2])
        try:
            shardload.open_store(sys.argv[1], stage_to=sys.argv[2])
        except Exception:
            pass  # a fake store: only the staging matters here
        print(signal.getsignal(signal.SIGTERM) is before)
        """
    )
    res = subprocess.run(
        [sys.executable, "-c", code, str(src), str(tmp_path / "shm")],
        capture_output=True,
        text=True,
        env=python_env(),
        timeout=T,
        check=False,
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "True"
    assert leftovers(tmp_path / "shm") == []  # atexit still ended the uses


def test_a_reused_pid_is_not_a_user(tmp_path: Path) -> None:
    """A users entry whose PID now belongs to another process (here: ours, with another start
    time) is a dead use: the last real use still removes the copy."""
    src = make_store(tmp_path / "store")
    to = tmp_path / "shm"
    with staged(src, to) as path:
        users_file = path.parent / f".{path.name}.users"
        state = json.loads(users_file.read_text())
        state["users"].append(f"{os.getpid()}-1-deadbeef")  # same pid, started at tick 1
        users_file.write_text(json.dumps(state))
    assert leftovers(to) == []


def test_process_identity_compares_start_times() -> None:
    from shardload.util import procs

    me, start = os.getpid(), procs.my_start_time()
    assert start is not None and procs.alive(me, start)
    assert not procs.alive(me, start + 1)  # the pid was reused by another process
    assert procs.alive_packed(procs.pack(me, start))
    assert not procs.alive_packed(procs.pack(me, start + 1))
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(T)
    assert not procs.alive(child.pid, None) and not procs.alive_packed(procs.pack(child.pid, 5))


def test_ring_reclaims_a_dead_workers_slot_even_if_its_pid_lives_on() -> None:
    import numpy as np

    from shardload.load.ring import BatchRing
    from shardload.util import procs

    ring = BatchRing({"x": ((4,), np.dtype("f4"))}, 8, slots=2)
    me = procs.my_start_time()
    ring._flags[0] = procs.pack(os.getpid(), me + 1)  # a worker that died; its pid is ours now
    ring._flags[1] = procs.pack(os.getpid(), me)  # a live worker (this process)
    ring._reclaim_dead()
    assert ring._flags[0] == 0 and ring._flags[1] != 0
