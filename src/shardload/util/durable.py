"""Making written files durable: now, or later in a batch (see docs/design.md, "A block is
durable before its record").

A write task runs inside :func:`collect_written`; every format calls :func:`file_written` where
it used to ``fsync`` a file it wrote. Outside a collection, or in one with ``defer=False``, that
fsyncs at once. With ``defer=True`` it only starts the kernel's writeback of the file
(``sync_file_range(SYNC_FILE_RANGE_WRITE)``, asynchronous) and lists the path: the caller must
fsync every listed path before anything records the block as done (:class:`~shardload.prep.recorder.
DurableRecorder` does). Either way the caller learns which files were written, so the final pass
before publishing does not sync them again.

Why defer: on the development VM's disk an fsync per 25 MiB file wrote 181-198 MB/s and one
fsync pass at the end 374-395 MB/s; a task that waits for its own fsync leaves the disk idle while
it reads and encodes the next block. Deferral keeps the disk busy with writeback started at
once and the fsyncs done by one background thread, while the tasks go on.

No shardload imports: the formats use this module.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import re
import threading
from collections.abc import Callable, Container, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from shardload.util.libc import libc

_LOCAL = threading.local()
_SYNC_FILE_RANGE_WRITE = 2


def _load_sync_file_range() -> object | None:
    try:
        fn = libc(use_errno=True).sync_file_range
    except (OSError, AttributeError):  # not Linux
        return None
    fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
    fn.restype = ctypes.c_int
    return fn


_sync_file_range = _load_sync_file_range()


def start_writeback(fd: int) -> None:
    """Ask the kernel to start writing ``fd``'s dirty pages now, without waiting (a hint: a
    failure is ignored, the later fsync is what counts)."""
    if _sync_file_range is not None:
        _sync_file_range(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)  # type: ignore[operator]


@contextlib.contextmanager
def collect_written(*, defer: bool) -> Iterator[list[str]]:
    """Within this block, :func:`file_written` lists each file (in this thread); with ``defer``
    it does not fsync them: the caller must (:func:`fsync_path`) before recording them done."""
    prev = getattr(_LOCAL, "state", None)
    paths: list[str] = []
    _LOCAL.state = (paths, defer)
    try:
        yield paths
    finally:
        _LOCAL.state = prev


def file_written(fd: int, path: str | os.PathLike[str]) -> None:
    """A file was written through ``fd`` (still open): fsync it, or defer that (see
    :func:`collect_written`)."""
    state = getattr(_LOCAL, "state", None)
    if state is not None and state[1]:
        start_writeback(fd)
    else:
        os.fsync(fd)
    if state is not None:
        state[0].append(os.fspath(path))


def fsync_path(path: str | os.PathLike[str]) -> None:
    """fsync one file or folder now (errors raise)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: the names :func:`write_atomic` (``.NAME.tmp-PID-THREAD``) and the HDF5 writer
#: (``NAME.h5.tmp``) give a file before it is renamed into place
TEMPORARY_NAME = re.compile(r"^\..+\.tmp-\d+-\d+$|^.+\.h5\.tmp$")


def remove_temporaries(root: Path) -> int:
    """Remove every file under ``root`` named as a temporary of :func:`write_atomic` or the
    HDF5 writer (a killed writer's; the caller holds the folder's lock, so no live writer has
    one). Returns how many were removed."""
    removed = 0
    for path in root.rglob("*.tmp*"):
        if TEMPORARY_NAME.match(path.name) and path.is_file():
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


def write_atomic(
    path: Path, data: bytes | Callable[[BinaryIO], object], *, deferrable: bool = False
) -> None:
    """Write ``data`` (bytes, or a function writing into the open file) to a temporary file,
    fsync it, rename it over ``path``. ``deferrable``: the fsync goes through
    :func:`file_written` (inside a deferring collection, the caller fsyncs
    ``path`` later, before recording it)."""
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            _write(f, data)
            if deferrable:
                file_written(f.fileno(), path)
            else:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def temporary_path(path: Path) -> Path:
    """Where :func:`write_atomic` writes ``path`` before renaming it (:data:`TEMPORARY_NAME`)."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")


def write_temporary(path: Path, data: bytes | Callable[[BinaryIO], object]) -> Path:
    """:func:`write_atomic` but its fsync and rename: ``data`` in ``path``'s temporary file,
    its writeback started; the caller fsyncs it (with others, :func:`fsync_all`) and only then
    renames it over ``path``. Returns the temporary file (removed on an error)."""
    tmp = temporary_path(path)
    try:
        with open(tmp, "wb") as f:
            _write(f, data)
            start_writeback(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return tmp


def _write(f: BinaryIO, data: bytes | Callable[[BinaryIO], object]) -> None:
    if callable(data):
        data(f)
    else:
        f.write(data)
    f.flush()


#: threads of :func:`fsync_all`: fsyncs issued together share the filesystem's journal commits
FSYNC_THREADS = 16


def fsync_all(paths: Iterable[str | os.PathLike[str]], *, folders: Iterable[Path] = ()) -> None:
    """fsync every path of ``paths`` (errors raise) and every folder of ``folders`` (where the
    filesystem allows it, as :func:`fsync_dir`), each once, all of them issued at once from a
    few threads. On ext4 each fsync of a small file that waits alone costs a journal commit
    (2-25 ms on the development VM's disk); fsyncs in flight together share one. Returns when
    all are durable."""
    files = list(dict.fromkeys(os.fspath(p) for p in paths))
    dirs = [d for d in dict.fromkeys(Path(f) for f in folders) if os.fspath(d) not in files]
    jobs: list[Callable[[], None]] = [functools.partial(fsync_path, f) for f in files]
    jobs += [functools.partial(fsync_dir, d) for d in dirs]
    if len(jobs) <= 1:
        for job in jobs:
            job()
        return
    with ThreadPoolExecutor(min(FSYNC_THREADS, len(jobs)), "shardload-sync-pass") as pool:
        for fut in [pool.submit(job) for job in jobs]:
            fut.result()  # the first error raises (after all were issued)


def fsync_tree(root: Path, *, skip: Container[str] = (), prune: Container[str] = ()) -> None:
    """fsync every file and folder under ``root``, but the files in ``skip`` (paths as
    ``str(root / ...)``: files already fsynced) and the folders ``root / NAME`` for the names in
    ``prune`` (with all they hold), all at once (:func:`fsync_all`)."""
    files: list[str] = []
    folders: list[Path] = []
    for folder, subs, names in os.walk(root):
        if folder == os.fspath(root):
            subs[:] = [s for s in subs if s not in prune]
        files += [p for p in (os.path.join(folder, n) for n in names) if p not in skip]
        folders.append(Path(folder))
    fsync_all(files, folders=folders)


def fsync_dir(path: Path) -> None:
    """fsync a folder where the filesystem allows it (some refuse: ignored)."""
    with contextlib.suppress(OSError):
        fsync_path(path)
