"""Stage a store onto node-local fast storage (``/dev/shm``, ``$TMPDIR``) once per node.

Every process (rank) calls :func:`stage` or :func:`staged` with the same source and target. In
``TO_DIR`` the source ``SRC`` gets three names (``STEM`` = readable name + hash of the source):

- ``STEM/`` the staged copy (mode 0700), renamed into place only when complete and checked;
- ``.STEM.lock`` an ``flock`` taken while copying and while changing the users file, so one
  process copies and the others wait, then reuse the copy;
- ``.STEM.users`` JSON: the source fingerprint, ``keep``, and one entry ``PID-START-TOKEN`` per
  use (``START``: the process's start time, so a reused PID is not taken for the user).

A use ends at the end of the ``with staged(...)`` block or at interpreter exit (``atexit``), in
the process that began it (a forked child never ends its parent's uses). The last use removes the
copy and its two files unless one use asked to ``keep`` it. Entries of dead processes are dropped
(PID and start time compared, :mod:`shardload.util.procs`) and ``.STEM.tmp-*`` folders found while
holding the lock are leftovers of a killed copy (the lock would be held otherwise), so a killed
run never blocks a later one.

This module installs no signal handler: a library must not change how the whole process reacts
to signals. A process killed by a signal without a handler skips ``atexit``; its entry is dropped
by the next run on the node. To clean up on SIGTERM, turn SIGTERM into ``SystemExit`` in your
program (``shardload stage`` does: :func:`exit_on_sigterm`).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import hashlib
import json
import logging
import os
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shardload.errors import StagingError
from shardload.move import staging_copy
from shardload.util import procs
from shardload.util.locks import locked

log = logging.getLogger("shardload.staging")

POLL_S = 0.05
_ACTIVE: dict[str, _Use] = {}
_GUARD = threading.Lock()
_ATEXIT_REGISTERED = False


@dataclass(frozen=True)
class _Use:
    path: Path
    lock: Path
    users: Path


def stage(
    src: str | os.PathLike,
    to_dir: str | os.PathLike,
    *,
    keep: bool = False,
    storage_options: dict | None = None,
) -> Path:
    """Copy a store to ``to_dir`` (once per node) and return the path of the copy.

    Parameters
    ----------
    src : str or path
        A store folder, a URL, or a ``.tar``/``.tar.gz``/``.tgz`` archive of a store.
    to_dir : str or path
        Node-local target folder, e.g. ``/dev/shm``; created if missing.
    keep : bool
        Leave the copy in place after this process exits.
    storage_options : dict, optional
        fsspec options for URL sources.

    Returns
    -------
    Path
        The staged store; removed at exit of the last process using it (unless kept).

    Raises
    ------
    StagingError
        Not enough free space, an incomplete source or copy, or an unusable source.
    """
    return _stage(src, to_dir, keep=keep, storage_options=storage_options)[0]


@contextlib.contextmanager
def staged(
    src: str | os.PathLike,
    to_dir: str | os.PathLike,
    keep: bool = False,
    *,
    storage_options: dict | None = None,
) -> Iterator[Path]:
    """:func:`stage` for the duration of a ``with`` block; the use ends with the block."""
    path, token = _stage(src, to_dir, keep=keep, storage_options=storage_options)
    try:
        yield path
    finally:
        _release(token)


def _stage(src, to_dir, *, keep: bool, storage_options) -> tuple[Path, str]:
    """:func:`_stage_once`, its OS errors as a StagingError naming the folder (a read-only or
    full ``to_dir``: two stores copied at once into room for one both pass the free-space
    check, and one of them runs out of space while copying)."""
    try:
        return _stage_once(src, to_dir, keep=keep, storage_options=storage_options)
    except OSError as exc:
        where = Path(to_dir).expanduser()
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise StagingError(
                f"not enough space in {where} to stage {src}: the disk filled up while copying "
                f"(another copy into the same folder?): {exc}"
            ) from exc
        raise StagingError(f"cannot stage {src} into {where}: {exc}") from exc


def _stage_once(src, to_dir, *, keep: bool, storage_options) -> tuple[Path, str]:
    kind = staging_copy.source_kind(src)
    to_dir = Path(to_dir).expanduser().resolve()
    to_dir.mkdir(parents=True, exist_ok=True)
    identity = staging_copy.source_identity(src)
    stem = f"{staging_copy.source_name(src)}-{hashlib.sha1(identity.encode()).hexdigest()[:10]}"
    use = _Use(to_dir / stem, to_dir / f".{stem}.lock", to_dir / f".{stem}.users")
    start = procs.my_start_time()
    token = f"{os.getpid()}-{start if start is not None else 'x'}-{uuid.uuid4().hex[:8]}"
    _register_atexit()
    fingerprint = staging_copy.source_fingerprint(src, kind, storage_options)
    with locked(use.lock, poll_s=POLL_S):
        for leftover in to_dir.glob(f".{stem}.tmp-*"):
            log.info("removing %s, left by a killed staging run", leftover)
            shutil.rmtree(leftover, ignore_errors=True)
        state = _read_users(use.users)
        if use.path.exists():
            stale = state.get("fingerprint") != fingerprint or state.get("source") != identity
            if stale and not state["users"]:
                log.info("%s is out of date or unknown; copying %s again", use.path, src)
                shutil.rmtree(use.path)
            else:
                if stale:
                    log.warning("%s differs from %s but is in use; reusing it", use.path, src)
                staging_copy.check_complete(use.path, src)
                log.info("reusing %s staged at %s", src, use.path)
        if not use.path.exists():
            try:
                _copy(src, kind, to_dir, stem, use.path, storage_options)
            except BaseException:
                if not state["users"]:  # nothing else refers to these names
                    _unlink(use.users, use.lock)
                raise
            state = {"source": identity, "fingerprint": fingerprint, "keep": False, "users": []}
        state["users"].append(token)
        state["keep"] = bool(state.get("keep")) or keep
        _write_users(use.users, state)
        with _GUARD:
            _ACTIVE[token] = use
    return use.path, token


def _copy(src, kind: str, to_dir: Path, stem: str, final: Path, storage_options) -> None:
    need = staging_copy.source_size(src, kind, storage_options)
    free = shutil.disk_usage(to_dir).free
    if need > free:
        raise StagingError(
            f"not enough space in {to_dir} to stage {src}: it needs {need:,} bytes "
            f"({need / 2**30:.2f} GiB), {free:,} bytes ({free / 2**30:.2f} GiB) are free"
        )
    tmp = to_dir / f".{stem}.tmp-{os.getpid()}"
    tmp.mkdir(mode=0o700)
    t0 = time.monotonic()
    try:
        top = staging_copy.copy_store(src, kind, tmp, storage_options)
        staging_copy.check_complete(top, src)
        os.chmod(top, 0o700)
        os.rename(top, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log.info("staged %s at %s: %d bytes in %.1fs", src, final, need, time.monotonic() - t0)


def _release(token: str) -> None:
    if not _mine(token):  # a forked child: the use is its parent's to end
        return
    with _GUARD:
        use = _ACTIVE.get(token)
    if use is None:
        return
    if not use.lock.parent.is_dir():  # the target folder was removed under us: nothing to do
        with _GUARD:
            _ACTIVE.pop(token, None)
        return
    with locked(use.lock, poll_s=POLL_S):
        state = _read_users(use.users)
        if token in state["users"]:
            state["users"].remove(token)
        if state["users"] or state.get("keep"):
            _write_users(use.users, state)
        else:
            shutil.rmtree(use.path, ignore_errors=True)
            _unlink(use.users, use.lock)  # waiters notice the unlinked lock and open a new one
            log.info("removed the staged copy %s", use.path)
    with _GUARD:
        _ACTIVE.pop(token, None)


def release_all() -> None:
    """End every use of this process (run at exit; safe to call more than once)."""
    with _GUARD:
        tokens = list(_ACTIVE)
    for token in tokens:
        try:
            _release(token)
        except Exception:  # exit paths must not raise; a later run cleans up
            log.exception("could not release the staged copy of use %s", token)


def _register_atexit() -> None:
    """End this process's uses at interpreter exit (a finalizer; no signal handler)."""
    global _ATEXIT_REGISTERED
    with _GUARD:
        if _ATEXIT_REGISTERED:
            return
        _ATEXIT_REGISTERED = True
    atexit.register(release_all)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(143)`` so ``finally`` blocks and ``atexit`` run.

    For programs (the ``shardload`` command line calls it); the library never installs it.
    Call from the main thread.
    """

    def on_sigterm(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM kills at once
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_sigterm)


def _unlink(*paths: Path) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _parse(token: str) -> tuple[int, int | None]:
    """``(pid, start time)`` of a use token (start None in tokens of older versions)."""
    parts = token.split("-")
    pid = int(parts[0])
    start = int(parts[1]) if len(parts) == 3 and parts[1].isdigit() else None
    return pid, start


def _mine(token: str) -> bool:
    try:
        return _parse(token)[0] == os.getpid()
    except ValueError:
        return False


def _alive(token: str) -> bool:
    try:
        pid, start = _parse(token)
    except ValueError:
        return True  # not ours to judge: keep it
    return procs.alive(pid, start)


def _read_users(path: Path) -> dict:
    try:
        state = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        state = {}
    state["users"] = [t for t in state.get("users", []) if _alive(t)]
    return state


def _write_users(path: Path, state: dict) -> None:
    tmp = path.with_name(path.name + f".{os.getpid()}")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)
