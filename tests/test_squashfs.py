"""SquashFS images: ``shardload pack``, ``open_store("X.sqfs")`` through one shared squashfuse
mount per node, unmounted after the last user ends (exit, exception, SIGTERM, SIGKILL).

Uses the real tools (squashfs-tools, squashfuse, fuse3; ``make test`` installs them as root)
and skips, saying why, where they or FUSE are missing."""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shardload
from _stores import check_values, make_store
from shardload.errors import ImageError, IncompleteStoreError, StoreError, StoreExistsError
from shardload.move import mount as squashfs
from shardload.move.pack import pack

pytestmark = pytest.mark.timeout(120)
SRC = str(Path(__file__).resolve().parents[1] / "src")


def _fuse_problem() -> str | None:
    for tool in ("mksquashfs", "squashfuse"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (apt-get install squashfs-tools squashfuse fuse3)"
    if not (shutil.which("fusermount3") or shutil.which("fusermount")):
        return "fusermount is not installed (apt-get install fuse3)"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is missing or not usable: FUSE mounts are impossible here"
    return None


@pytest.fixture(scope="module")
def tools() -> None:
    problem = _fuse_problem()
    if problem:
        pytest.skip(f"SquashFS tests need the real tools: {problem}")


@pytest.fixture(autouse=True)
def private_registry(tmp_path, monkeypatch):
    # each test its own mount registry, so tests never share (or wait for) a mount
    monkeypatch.setenv(squashfs.MOUNT_DIR_ENV, str(tmp_path / "mounts"))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("sq"), fmt="zarr", compression="lz4", n=311, chunk_rows=9
    )


@pytest.fixture(scope="module")
def image(store, tools, tmp_path_factory) -> Path:
    return pack(store.url, tmp_path_factory.mktemp("img") / "store.sqfs")


def mounts_at(path: Path | str) -> int:
    return sum(
        1
        for line in Path("/proc/mounts").read_text().splitlines()
        if line.split(" ")[1] == str(path)
    )


def wait_unmounted(path: Path | str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while mounts_at(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert mounts_at(path) == 0, f"{path} is still mounted {timeout_s} s after its users ended"


def test_pack_and_read_back_value_for_value(store, image):
    assert squashfs.is_image(image)
    st = shardload.open_store(image)
    try:
        assert st.url == str(image) and st.manifest == store.manifest
        root = Path(st.root)
        assert mounts_at(root) == 1
        assert (root.parent.stat().st_mode & 0o777) == 0o700  # the private registry
        for name in store.arrays:
            np.testing.assert_array_equal(st.read(name), store.read(name))
        batches = list(shardload.iter_batches(image, batch_size=16, split="train", seed=3))
        for b in batches[:5]:
            check_values(store, b)
        # a second open in the same process shares the mount
        assert shardload.open_store(image).root == st.root and mounts_at(root) == 1
    finally:
        squashfs.unmount(image)
    wait_unmounted(root)
    deadline = time.monotonic() + 10  # then the watcher removes its mount point and files
    while list(root.parent.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sorted(p.name for p in root.parent.iterdir()) == []


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_pack_options(store, tools, tmp_path, compression):
    img = pack(store.url, tmp_path / "x.sqfs", compression=compression, block_size=16384)
    with pytest.raises(StoreExistsError, match=r"x\.sqfs exists"):
        pack(store.url, img, compression=compression)
    pack(store.url, img, compression=compression, overwrite=True)
    assert not list(tmp_path.glob(".x.sqfs.tmp-*"))
    st = shardload.open_store(img)
    np.testing.assert_array_equal(st.read("x"), store.read("x"))
    squashfs.unmount(img)
    wait_unmounted(st.root)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_streaming_dataset_workers_read_through_the_mount(store, image, context):
    torch = pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(str(image), batch_size=16, split="train", seed=1)
    loader = StreamingDataLoader(ds, num_workers=2, multiprocessing_context=context)
    batches = list(loader)
    idx = np.concatenate([b["index"].numpy() for b in batches])
    ref = StreamingDataset(store, batch_size=16, split="train", seed=1)
    want = np.concatenate(
        [b["index"].numpy() for b in torch.utils.data.DataLoader(ref, batch_size=None)]
    )
    np.testing.assert_array_equal(np.sort(idx), np.sort(want))
    for b in batches:
        check_values(store, {k: v.numpy() for k, v in b.items()})
    assert mounts_at(ds.store.root) == 1
    root = ds.store.root
    del loader, ds  # its workers persist (the default) until the loader goes
    gc.collect()
    squashfs.unmount(image)
    wait_unmounted(root)


USER = """
import os, signal, sys, time
sys.path.insert(0, {src!r})
import shardload
st = shardload.open_store({image!r})
st.read("x", 0, 50)
print(st.root, flush=True)
how = sys.argv[1]
sys.stdin.readline()  # the test says when to end
if how == "exception":
    raise RuntimeError("a training error")
if how == "sigterm":
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(30)
if how == "hang":
    time.sleep(60)
"""


def start_user(image: Path, how: str) -> tuple[subprocess.Popen, str]:
    code = USER.format(src=SRC, image=str(image))
    proc = subprocess.Popen(
        [sys.executable, "-c", code, how],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ},
    )
    assert proc.stdout is not None
    root = proc.stdout.readline().strip()
    assert root, proc.stderr.read() if proc.stderr else ""
    return proc, root


@pytest.mark.parametrize("how", ["exit", "exception", "sigterm", "sigkill"])
def test_unmounted_after_the_users_end(image, how):
    proc, root = start_user(image, "hang" if how == "sigkill" else how)
    assert mounts_at(root) == 1
    if how == "sigkill":
        proc.kill()
    else:
        proc.stdin.write("\n")  # type: ignore[union-attr]
        proc.stdin.flush()  # type: ignore[union-attr]
    rc = proc.wait(timeout=30)
    assert (
        rc
        == {"exit": 0, "exception": 1, "sigterm": -signal.SIGTERM, "sigkill": -signal.SIGKILL}[how]
    )
    wait_unmounted(root)


def test_one_mount_shared_by_several_processes(store, image):
    users = [start_user(image, "hang") for _ in range(3)]
    roots = {root for _, root in users}
    assert len(roots) == 1
    (root,) = roots
    assert mounts_at(root) == 1
    st = shardload.open_store(image)  # this process joins the same mount
    assert st.root == root and mounts_at(root) == 1
    for proc, _ in users:
        proc.kill()
        proc.wait()
    time.sleep(0.5)  # longer than the watcher's poll: it must not unmount while we use it
    assert mounts_at(root) == 1
    np.testing.assert_array_equal(st.read("y"), store.read("y"))
    squashfs.unmount(image)
    wait_unmounted(root)


def test_a_killed_watcher_unmounts_and_the_next_open_mounts_again(store, image):
    root = squashfs.mount(image)
    state = json.loads(Path(f"{root}.json").read_text())
    os.kill(state["watcher"], signal.SIGKILL)  # squashfuse gets SIGTERM (pdeathsig), unmounts
    wait_unmounted(root)
    st = shardload.open_store(image)  # the dead mount is noticed and replaced
    assert st.root == str(root) and mounts_at(root) == 1
    np.testing.assert_array_equal(st.read("x"), store.read("x"))
    squashfs.unmount(image)
    wait_unmounted(root)


# -- errors ------------------------------------------------------------------------------------------
def test_missing_tools_are_named(store, image, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(
        ImageError, match=r"cannot pack .*'mksquashfs' program is not on PATH.*squashfs-tools"
    ):
        pack(store.url, tmp_path / "y.sqfs")
    with pytest.raises(
        ImageError, match=rf"cannot mount {image}: the 'squashfuse' program is not on PATH"
    ):
        shardload.open_store(image)


def test_missing_fuse_device_is_named(image, monkeypatch):
    monkeypatch.setattr(squashfs, "FUSE_DEVICE", "/nonexistent/fuse")
    with pytest.raises(ImageError, match=rf"cannot mount {image}: /nonexistent/fuse is missing"):
        squashfs.mount(image)


def test_incomplete_store_and_non_store_are_refused(store, tmp_path):
    with pytest.raises(StoreError, match=r"cannot pack .*not a shardload store"):
        (tmp_path / "empty").mkdir()
        pack(tmp_path / "empty", tmp_path / "e.sqfs")
    with pytest.raises(StoreError, match="does not exist"):
        pack(tmp_path / "nothing", tmp_path / "e.sqfs")
    copy = tmp_path / "copy"
    shutil.copytree(store.url, copy)
    manifest = copy / "shardload.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "complete": False}))
    with pytest.raises(IncompleteStoreError, match=r"cannot pack .*not complete"):
        pack(copy, tmp_path / "c.sqfs")
    os.rename(copy, tmp_path / "copy.partial")  # a prepare interrupted: only OUT.partial exists
    with pytest.raises(IncompleteStoreError, match=r"cannot pack .*not complete"):
        pack(copy, tmp_path / "c.sqfs")
    assert not list(tmp_path.glob("*.sqfs"))


def test_a_file_that_is_no_image(tmp_path):
    bad = tmp_path / "bad.sqfs"
    bad.write_bytes(b"not an image")
    with pytest.raises(ImageError, match="is not a SquashFS image"):
        squashfs.mount(bad)
    with pytest.raises(StoreError, match="not a shardload store"):
        shardload.open_store(bad)


def test_cli_pack(store, tools, tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "shardload",
        "pack",
        store.url,
        "--to",
        str(tmp_path / "c.sqfs"),
        "--block-size",
        "64K",
    ]
    env = {**os.environ, "PYTHONPATH": SRC}
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr
    assert "packed" in res.stdout and squashfs.is_image(tmp_path / "c.sqfs")
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    assert res.returncode == 2 and "c.sqfs exists" in res.stderr and "--overwrite" in res.stderr


def test_a_killed_squashfuse_leaves_no_mount(image):
    root = squashfs.mount(image)
    state = json.loads(Path(f"{root}.json").read_text())
    os.kill(state["squashfuse"], signal.SIGKILL)  # fusermount3 (auto_unmount) unmounts
    wait_unmounted(root)
    assert squashfs.mount(image) == root and mounts_at(root) == 1  # mounted again
    squashfs.unmount(image)
    wait_unmounted(root)


def test_a_store_handed_to_another_process_refuses_a_changed_image(store, tools, tmp_path):
    import pickle

    img = pack(store.url, tmp_path / "h.sqfs")
    st = shardload.open_store(img)
    blob = pickle.dumps(st)
    assert pickle.loads(blob).root == st.root  # unpickling takes a use of the same mount
    os.utime(img, ns=(1, 1))  # the image changed (as if repacked)
    with pytest.raises(StoreError, match=r"h\.sqfs changed or vanished since it was opened"):
        pickle.loads(blob)
    squashfs.unmount(img)
    wait_unmounted(st.root)


HOLDER = """
import pickle, sys
sys.path.insert(0, {src!r})
st = pickle.loads(bytes.fromhex(sys.stdin.readline()))
print("ok", flush=True)
sys.stdin.readline()
print(st.read("x", 0, 5).sum(), flush=True)
"""


def test_a_pickled_store_keeps_the_mount_in_the_process_that_unpickles_it(store, image):
    import pickle

    st = shardload.open_store(image)
    root = st.root
    child = subprocess.Popen(
        [sys.executable, "-c", HOLDER.format(src=SRC)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    child.stdin.write(pickle.dumps(st).hex() + "\n")  # type: ignore[union-attr]
    child.stdin.flush()  # type: ignore[union-attr]
    assert child.stdout.readline().strip() == "ok"  # type: ignore[union-attr]
    squashfs.unmount(image)  # this process lets go; the child still reads through the mount
    time.sleep(0.5)
    assert mounts_at(root) == 1
    out, _ = child.communicate("\n", timeout=30)
    assert float(out) == pytest.approx(float(store.read("x", 0, 5).sum()))
    wait_unmounted(root)


def test_processes_opening_at_once_make_one_mount(store, image):
    code = USER.format(src=SRC, image=str(image))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", code, "exit"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    roots = {p.stdout.readline().strip() for p in procs}  # type: ignore[union-attr]
    assert len(roots) == 1 and "" not in roots
    (root,) = roots
    assert mounts_at(root) == 1
    for p in procs:
        p.communicate("\n", timeout=30)
        assert p.returncode == 0
    wait_unmounted(root)


def test_a_later_pack_removes_a_killed_packs_leftover(store, tools, tmp_path):
    from shardload.util import procs

    dead = next(p for p in range(4_000_000, 4_100_000) if not procs.alive(p, None))
    killed = tmp_path / f".x.sqfs.tmp-{dead}"
    killed.write_bytes(b"half an image")
    running = tmp_path / f".x.sqfs.tmp-{os.getppid()}"  # a pack still running: kept
    running.write_bytes(b"being written")
    pack(store.url, tmp_path / "x.sqfs")
    assert not killed.exists() and running.exists()


def test_a_failed_mount_leaves_no_lock_files(tools, tmp_path):
    bad = tmp_path / "bad.sqfs"
    bad.write_bytes(b"hsqs" + b"\x30" * 4000)  # the magic, then garbage
    with pytest.raises(ImageError, match=r"cannot mount .*bad\.sqfs"):
        shardload.open_store(bad)
    registry = tmp_path / "mounts"
    assert not [p.name for p in registry.iterdir() if p.suffix in (".setup", ".lock")]


@pytest.mark.parametrize("where", [0.3, 0.5, 0.7])
def test_garbage_inside_an_image_is_an_error_naming_the_file(tools, tmp_path, where):
    """Damaged compressed blocks read as EIO through squashfuse: the error names the chunk and
    file (or the manifest), never a bare OSError."""
    from shardload.errors import ShardloadError

    s = make_store(tmp_path, fmt="npy", n=20000, chunk_rows=1000, name="s")
    img = pack(s.url, tmp_path / "s.sqfs", compression="gzip")
    data = bytearray(img.read_bytes())
    at = int(len(data) * where)
    data[at : at + 64] = bytes(b ^ 0xFF for b in data[at : at + 64])
    img.write_bytes(bytes(data))
    with pytest.raises(ShardloadError) as err:
        st = shardload.open_store(img)
        for k in range(20):
            st.read("x", k * 1000, k * 1000 + 1000)
    assert re.search(r"chunk \d+ of array 'x'.*\.npy|shardload\.json|\.sqfs", str(err.value))


def test_mounts_in_a_process_with_more_than_1024_open_files(store, image):
    """The mount's start-up waits on the watcher's pipe with ``selectors``: in a process that
    already holds over 1,024 files (a long test run, a training job with many shards open) the
    pipe's descriptor is above select()'s limit, which failed with "filedescriptor out of
    range in select()" before."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-file limit ({hard}) is below 1,200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        st = shardload.open_store(image)
        root = Path(st.root)
        for name in store.arrays:
            np.testing.assert_array_equal(st.read(name), store.read(name))
        squashfs.unmount(image)
        wait_unmounted(root)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
