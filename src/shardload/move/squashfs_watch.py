"""The watcher of one SquashFS mount (run as a script by :mod:`shardload.move.mount`; stdlib only).

One watcher per mounted image and node. It runs ``squashfuse -f`` as its child and unmounts as
soon as no process uses the mount: every using process holds a *shared* ``flock`` on the
image's lock file, and the kernel drops the locks of a process however it ends (exit,
exception, SIGTERM, SIGKILL). The watcher polls for the *exclusive* lock; once it gets it, no
user is left and it unmounts.

Transitions (mounting, unmounting, cleaning up after a dead ``squashfuse``) happen only under
the image's *setup* lock (exclusive); users take their shared lock under it too, so a user
never joins a mount that is being taken down, and the exclusive lock is never held without
the setup lock (no lock-order deadlock).

If the watcher itself is killed, ``squashfuse`` gets SIGTERM (``PR_SET_PDEATHSIG``) and
unmounts; if ``squashfuse`` is killed, ``fusermount3`` (``-o auto_unmount``) unmounts. The
next user on the node finds the state file of a dead watcher and mounts afresh.

Usage (internal)::

    python squashfs_watch.py IMAGE MOUNTPOINT STEM_PATH SQUASHFUSE FUSERMOUNT

``STEM_PATH`` + ``.lock`` / ``.setup`` / ``.json`` / ``.log`` are the lock, setup lock, state
and log files. The first line on stdout is ``ready`` or ``error: MESSAGE``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.2
MOUNT_TIMEOUT_S = 60.0
PR_SET_PDEATHSIG = 1


def mounted(path: str) -> bool:
    """``path`` is a mount point (read from ``/proc/self/mounts``; never touches the mount)."""
    try:
        with open("/proc/self/mounts", "rb") as f:
            lines = f.read().splitlines()
    except OSError:
        return os.path.ismount(path)
    want = os.fsencode(path)
    for line in lines:
        fields = line.split(b" ")
        if len(fields) > 1 and _unescape(fields[1]) == want:
            return True
    return False


def _unescape(field: bytes) -> bytes:
    # /proc/mounts writes space, tab, newline and backslash as octal escapes (\040 ...)
    if b"\\" not in field:
        return field
    out, i = bytearray(), 0
    while i < len(field):
        if field[i : i + 1] == b"\\" and field[i + 1 : i + 4].isdigit():
            out.append(int(field[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


# Its own flock helper, not shardload.util.locks: this file runs as a script by path
# (``python -I squashfs_watch.py``), with the standard library only.
def try_lock(path: str, how: int) -> int | None:
    """An fd holding ``flock(how | LOCK_NB)`` on ``path``, or None if someone else holds it.
    The file must still be the one at ``path`` (a remover unlinks it under the lock)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, how | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise BlockingIOError
    except (BlockingIOError, FileNotFoundError):
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def unmount(fusermount: str, mountpoint: str) -> None:
    """Unmount ``mountpoint``; lazily (``-z``) if it is busy, so no stale mount remains."""
    if not mounted(mountpoint):
        return
    res = subprocess.run([fusermount, "-u", mountpoint], capture_output=True, timeout=30)
    if res.returncode != 0 and mounted(mountpoint):
        subprocess.run([fusermount, "-u", "-z", mountpoint], capture_output=True, timeout=30)


def _pdeathsig() -> None:
    # squashfuse gets SIGTERM when this watcher dies, however it dies; it then unmounts
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def _say(line: str) -> None:
    with contextlib.suppress(OSError):
        os.write(1, (line.replace("\n", " ") + "\n").encode())
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)  # the parent reads until EOF: let it go
        os.close(devnull)


def _tail(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read()[-2000:].decode(errors="replace").strip()
    except OSError:
        return ""


def _cleanup(
    stem: str, mountpoint: str, fusermount: str, fuse: subprocess.Popen | None, *, setup: bool
) -> None:
    """Unmount and remove the image's files (``.setup`` too when ``setup``: only while holding
    it; a waiter that opened it notices the unlinked inode and opens the new one)."""
    unmount(fusermount, mountpoint)
    if fuse is not None:
        try:
            fuse.wait(timeout=10)
        except subprocess.TimeoutExpired:
            fuse.kill()
            fuse.wait()
    for suffix in (".json", ".lock", ".log", *((".setup",) if setup else ())):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(stem + suffix)
    with contextlib.suppress(OSError):
        os.rmdir(mountpoint)


def main(argv: list[str]) -> int:
    image, mountpoint, stem, squashfuse, fusermount = argv
    # detach: the intermediate process exits at once, so no zombie stays with the caller
    if os.fork() > 0:
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.makedirs(mountpoint, mode=0o700, exist_ok=True)
    with open(stem + ".log", "wb") as log:
        fuse = subprocess.Popen(
            [squashfuse, "-f", "-o", "ro,auto_unmount", image, mountpoint],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            preexec_fn=_pdeathsig,
        )
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while not mounted(mountpoint):
        if fuse.poll() is not None or time.monotonic() > deadline:
            if fuse.poll() is None:
                fuse.kill()
            fuse.wait()
            _say(f"error: squashfuse exited with status {fuse.returncode}: {_tail(stem + '.log')}")
            _cleanup(stem, mountpoint, fusermount, None, setup=False)
            return 1
        time.sleep(0.01)
    state = {
        "watcher": os.getpid(),
        "watcher_start": _start_time(os.getpid()),
        "squashfuse": fuse.pid,
        "image": image,
        "mountpoint": mountpoint,
    }
    tmp = f"{stem}.json.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, stem + ".json")
    _say("ready")
    while True:
        time.sleep(POLL_S)
        setup = try_lock(stem + ".setup", fcntl.LOCK_EX)
        if setup is None:
            continue  # a user is joining or a transition runs: look again later
        try:
            if fuse.poll() is not None:  # squashfuse died: clear its mount (auto_unmount may have)
                _cleanup(stem, mountpoint, fusermount, fuse, setup=True)
                return 0
            users = try_lock(stem + ".lock", fcntl.LOCK_EX)
            if users is not None:  # no process holds a shared lock: nobody uses the mount
                try:
                    _cleanup(stem, mountpoint, fusermount, fuse, setup=True)
                finally:
                    os.close(users)
                return 0
        finally:
            os.close(setup)


def _start_time(pid: int) -> int | None:
    # as shardload.util.procs.start_time; this script runs by path with the standard library only
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return int(data[data.rindex(b")") + 2 :].split()[19])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
