"""Mounting SquashFS images of stores (:mod:`shardload.move.pack` makes them): ``squashfuse``
mounts an image in user space, read-only, and the store is read through the mount like a folder.

Mounts are shared per node and image: the first process that opens an image starts a watcher
(:mod:`shardload.move.squashfs_watch`) that runs ``squashfuse``; every process using the mount
holds a shared ``flock`` on the image's lock file; the watcher unmounts when it can take the
lock exclusively, i.e. when the last user has ended, however it ended (normal exit, exception,
SIGTERM, SIGKILL: the kernel drops the locks of a dead process). The registry is a private
folder (mode 0700) per user: ``$SHARDLOAD_MOUNT_DIR``, else ``/dev/shm/shardload-mounts-UID``,
else ``TMPDIR/shardload-mounts-UID``. For an image it holds ``STEM/`` (the mount point),
``STEM.lock``, ``STEM.setup``, ``STEM.json`` (watcher and squashfuse pids), ``STEM.log``;
``STEM`` names the image by path, inode, size and modification time, so a repacked image gets
a new mount.

This module installs no signal handler and needs no ``atexit``: a process's use ends when its
file descriptor closes, at the latest when the process ends.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import selectors
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from shardload.errors import ImageError, StoreError
from shardload.move.programs import find_fusermount, require_program
from shardload.move.squashfs_watch import mounted
from shardload.util import procs
from shardload.util.locks import locked, try_lock

log = logging.getLogger("shardload.squashfs")

#: SquashFS superblock magic ("hsqs", little-endian)
MAGIC = b"hsqs"
MOUNT_DIR_ENV = "SHARDLOAD_MOUNT_DIR"
FUSE_DEVICE = "/dev/fuse"
POLL_S = 0.02
READY_TIMEOUT_S = 90.0
_WATCHER = str(Path(__file__).with_name("squashfs_watch.py"))

_USES: dict[str, _Use] = {}  # stem -> this process's use of that mount
_GUARD = threading.Lock()


@dataclass(frozen=True)
class _Use:
    fd: int  # holds the shared flock; closing it (or dying) ends the use
    mountpoint: Path
    identity: str


# -- mounting --------------------------------------------------------------------------------------
def is_image(path: str | os.PathLike[str]) -> bool:
    """``path`` is a local file that starts like a SquashFS image."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


def mount(image_path: str | os.PathLike[str]) -> Path:
    """Mount a SquashFS image read-only (shared per node) and return the folder it shows.

    The first process on the node mounts it with ``squashfuse`` at a private mount point; the
    others (and this one, again) reuse that mount. The mount stays while any process that
    called :func:`mount` lives (or until each calls :func:`unmount`), and is unmounted right
    after the last one ends, however it ends (see the module docstring).

    Raises
    ------
    ImageError
        Not a SquashFS image, ``squashfuse`` / ``fusermount`` or ``/dev/fuse`` missing, or
        the mount failed (with ``squashfuse``'s message).
    """
    image = Path(image_path).expanduser().resolve()
    if not image.is_file():
        raise ImageError(
            f"no SquashFS image at {image}: "
            + ("it is a folder" if image.is_dir() else "the file does not exist")
        )
    if not is_image(image):
        raise ImageError(f"{image} is not a SquashFS image (no 'hsqs' magic at its start)")
    identity = _identity(image)
    stem = f"{_safe(image.stem)[:40]}-{hashlib.sha1(identity.encode()).hexdigest()[:12]}"
    with _GUARD:
        use = _USES.get(stem)
        if use is not None and mounted(str(use.mountpoint)):
            return use.mountpoint
        if use is not None:  # the mount died under us (watcher or squashfuse killed)
            _USES.pop(stem)
            os.close(use.fd)
        squashfuse = require_program("squashfuse", "mount", image, "squashfuse")
        fusermount = find_fusermount(image)
        if not os.access(FUSE_DEVICE, os.R_OK | os.W_OK):
            why = "is missing" if not os.path.exists(FUSE_DEVICE) else "is not usable by this user"
            raise ImageError(
                f"cannot mount {image}: {FUSE_DEVICE} {why} (FUSE is not available here); "
                f"unpack it instead: unsquashfs -d DIR {image}"
            )
        registry = _registry()
        base = registry / stem
        with locked(f"{base}.setup", poll_s=POLL_S):
            fd = _share(f"{base}.lock")
            try:
                if not _healthy(base):
                    _clear(base, fusermount)
                    _start_watcher(image, base, squashfuse, fusermount)
            except BaseException:
                os.close(fd)
                _forget(base)
                raise
        _USES[stem] = _Use(fd, base, identity)
        return base


def unmount(image_path: str | os.PathLike[str]) -> None:
    """End this process's use of the image's mount; it is unmounted once no process uses it
    (within a fraction of a second). Does nothing if this process does not use it."""
    prefix = f"{Path(image_path).expanduser().resolve()}|"
    with _GUARD:
        for stem, use in list(_USES.items()):
            if use.identity.startswith(prefix):
                _USES.pop(stem)
                os.close(use.fd)


def _identity(image: Path) -> str:
    st = image.stat()
    return f"{image}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}"


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "image"


def _registry() -> Path:
    """The private folder of this user's mounts (created 0700; refused if others can write)."""
    env = os.environ.get(MOUNT_DIR_ENV)
    if env:
        root = Path(env).expanduser()
    else:
        shm = Path("/dev/shm")
        parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
        root = parent / f"shardload-mounts-{os.getuid()}"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = root.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise ImageError(
            f"the mount folder {root} is not private to this user (owner uid {st.st_uid}, "
            f"mode {st.st_mode & 0o777:o}); set {MOUNT_DIR_ENV} to a folder of your own"
        )
    return root


def _healthy(base: Path) -> bool:
    """A live watcher serves this mount (its state file names a live process, and the mount
    point is mounted)."""
    state = _state(base)
    if not state:
        return False
    return (
        _alive(int(state.get("watcher") or 0), state.get("watcher_start"))
        and _alive(int(state.get("squashfuse") or 0), None)
        and mounted(str(base))
    )


def _alive(pid: int, start: int | None) -> bool:
    """:func:`procs.alive`, and not a zombie (a dead watcher waiting to be reaped)."""
    if not procs.alive(pid, start):
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return not os.path.isdir("/proc/self")
    return data[data.rindex(b")") + 2 :][:1] != b"Z"


def _state(base: Path) -> dict[str, Any]:
    try:
        return dict(json.loads(Path(f"{base}.json").read_text()))
    except (FileNotFoundError, ValueError):
        return {}


def _clear(base: Path, fusermount: str) -> None:
    """Remove what a dead or dying watcher left (called under the setup lock)."""
    state = _state(base)
    for key, start_key in (("watcher", "watcher_start"), ("squashfuse", None)):
        pid = int(state.get(key) or 0)
        if pid and _alive(pid, state.get(start_key) if start_key else None):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9 if key == "watcher" else 15)
            _wait_gone(pid)
    from shardload.move.squashfs_watch import unmount as fuse_unmount

    fuse_unmount(fusermount, str(base))
    with contextlib.suppress(FileNotFoundError):
        Path(f"{base}.json").unlink()
    if base.is_dir() and not mounted(str(base)):
        with contextlib.suppress(OSError):
            base.rmdir()  # recreated 0700 by the watcher


def _forget(base: Path) -> None:
    """After a failed mount, under the setup lock: remove the lock files of ``base`` that no
    process uses (a failed mount left ``STEM.setup`` and ``STEM.lock`` for good). Removing a
    lock file its holder holds is safe: :func:`~shardload.util.locks.locked` re-checks it."""
    fd = try_lock(f"{base}.lock")
    if fd is not None:
        try:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{base}.lock")
        finally:
            os.close(fd)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(f"{base}.setup")


def _wait_gone(pid: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _alive(pid, None) and time.monotonic() < deadline:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(POLL_S)


def _start_watcher(image: Path, base: Path, squashfuse: str, fusermount: str) -> None:
    cmd = [sys.executable, "-I", _WATCHER, str(image), str(base), str(base), squashfuse, fusermount]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # no terminal signal (Ctrl-C) reaches it
    )
    assert proc.stdout is not None
    line = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    # selectors, not select.select: a process with more than 1,024 open files gets descriptors
    # that select() refuses ("filedescriptor out of range")
    with proc.stdout, selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                raise ImageError(f"mounting {image} took more than {READY_TIMEOUT_S:.0f} s")
            chunk = os.read(proc.stdout.fileno(), 4096)
            if not chunk:
                break
            line += chunk
    proc.wait()  # the intermediate process: it exits once the watcher has detached
    text = line.decode(errors="replace").strip()
    if text != "ready":
        raise ImageError(f"cannot mount {image} with squashfuse: {text or 'the watcher died'}")
    log.info("mounted %s read-only at %s", image, base)


def _share(path: str) -> int:
    """A shared ``flock`` on ``path`` (called under the setup lock, when the watcher never
    holds its exclusive lock)."""
    deadline = time.monotonic() + 10
    while True:
        fd = try_lock(path, shared=True)
        if fd is not None:
            return fd
        if time.monotonic() > deadline:
            raise ImageError(f"cannot take the shared lock {path}")
        time.sleep(POLL_S)


# -- handing a store over to other processes -------------------------------------------------------
class MountHold:
    """Keeps an image mounted for a :class:`~shardload.store.core.Store` read through it. Pickled
    into another process (a spawned DataLoader worker), it mounts the image there too, so the
    mount lives as long as any process reading the store; a changed image is refused."""

    def __init__(self, image: Path, identity: str) -> None:
        self.image, self.identity = image, identity

    def __reduce__(self) -> tuple[Any, ...]:
        return (_hold_again, (str(self.image), self.identity))


def _hold_again(image: str, identity: str) -> MountHold:
    path = Path(image)
    try:
        now = _identity(path)
    except OSError:
        now = ""
    if now != identity:
        raise StoreError(f"the SquashFS image {image} changed or vanished since it was opened")
    mount(path)
    return MountHold(path, identity)


def open_image(image_path: str | os.PathLike[str]) -> tuple[Path, MountHold]:
    """Mount ``image_path`` and return the store folder and the hold to keep with the store."""
    image = Path(image_path).expanduser().resolve()
    root = mount(image)
    return root, MountHold(image, _identity(image))
