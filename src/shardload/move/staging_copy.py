"""The copying half of :mod:`shardload.move.staging`: size, fingerprint and copy of one source.

A source is a store folder, a URL (anything fsspec opens) or a ``.tar``/``.tar.gz``/``.tgz``
archive holding a store (at its top level or in one top folder).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from shardload.errors import RemoteNotFoundError, StagingError
from shardload.layout import MANIFEST_NAME
from shardload.move.remote import is_url, open_fs, read_bytes
from shardload.move.retries import call_with_retries

ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar")
STORE_MARKERS = (MANIFEST_NAME, "zarr.json", ".zgroup")
URL_THREADS = 8


def source_kind(src: str | os.PathLike) -> str:
    """``"url"``, ``"tar"`` or ``"dir"``; raises StagingError for anything else."""
    if is_url(str(src)):
        return "url"
    path = Path(src).expanduser()
    if path.is_file() and str(path).endswith(ARCHIVE_SUFFIXES):
        return "tar"
    if path.is_dir():
        return "dir"
    raise StagingError(f"cannot stage {src}: not a store folder, a URL or a .tar/.tgz archive")


def source_name(src: str | os.PathLike) -> str:
    """A short readable name for the staged copy (the last path part, archive suffix removed)."""
    name = str(src).rstrip("/").rsplit("/", 1)[-1]
    for suffix in ARCHIVE_SUFFIXES:
        name = name.removesuffix(suffix)
    return "".join(c if c.isalnum() or c in "._-" else "_" for c in name).lstrip(".") or "store"


def source_identity(src: str | os.PathLike) -> str:
    """The same string for every spelling of one source (absolute path, or the URL)."""
    if is_url(str(src)):
        return str(src).rstrip("/")
    return str(Path(src).expanduser().resolve())


def source_fingerprint(src: str | os.PathLike, kind: str, storage_options=None) -> str | None:
    """A cheap token that changes when the source is re-prepared (None: cannot tell)."""
    if kind == "tar":
        st = Path(src).stat()
        return f"{st.st_size}-{st.st_mtime_ns}"
    try:
        if kind == "dir":
            data = (Path(src).expanduser() / MANIFEST_NAME).read_bytes()
        else:
            fs, root = open_fs(str(src), storage_options=storage_options)
            try:
                data = read_bytes(fs, f"{root}/{MANIFEST_NAME}", what="the manifest")
            finally:  # its connections now, not at a garbage collection (each fs has its own)
                fs.release()
    except (FileNotFoundError, RemoteNotFoundError):
        return None
    return hashlib.sha256(data).hexdigest()


def _copy_file(src: str, dst: str) -> None:
    shutil.copyfile(src, dst)


def _list_dir(root: Path) -> dict[str, int]:
    files = {}
    for dirpath, _, names in os.walk(root, followlinks=True):
        for name in names:
            path = Path(dirpath) / name
            files[path.relative_to(root).as_posix()] = path.stat().st_size
    return files


def _list_url(src: str, storage_options) -> tuple[Any, str, dict[str, int]]:
    fs, root = open_fs(src, storage_options=storage_options)
    paths = call_with_retries(lambda: fs.find(root), url=src, what="the file listing")
    paths = [p for p in paths if p.startswith(root + "/")]
    sizes = call_with_retries(lambda: fs.sizes(paths), url=src, what="the file sizes")
    files = {p[len(root) + 1 :]: int(s or 0) for p, s in zip(paths, sizes, strict=True)}
    return fs, root, files


def _tar_members(archive: Path) -> list[tarfile.TarInfo]:
    try:
        with tarfile.open(archive) as tf:
            return tf.getmembers()
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise StagingError(f"cannot read the archive {archive}: {exc}") from exc


def source_size(src: str | os.PathLike, kind: str, storage_options=None) -> int:
    """Total bytes of the store's files (uncompressed for archives)."""
    if kind == "dir":
        return sum(_list_dir(Path(src).expanduser()).values())
    if kind == "tar":
        return sum(m.size for m in _tar_members(Path(src)) if m.isfile())
    fs, _, files = _list_url(str(src), storage_options)
    fs.release()
    return sum(files.values())


def copy_store(src: str | os.PathLike, kind: str, tmp: Path, storage_options=None) -> Path:
    """Copy the store into the empty folder ``tmp``; return the folder holding the store.

    The number of bytes written is checked against the source listing.
    """
    if kind == "dir":
        local = Path(src).expanduser()
        files = _list_dir(local)
        for rel in files:
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            _copy_file(str(local / rel), str(tmp / rel))
        expected, top = files, tmp
    elif kind == "tar":
        expected = {m.name: m.size for m in _tar_members(Path(src)) if m.isfile()}
        try:
            with tarfile.open(src) as tf:
                _extract(tf, tmp)
        except tarfile.FilterError as exc:  # an absolute path, '..', a link out, a device
            member = exc.tarinfo.name if exc.tarinfo is not None else "?"
            raise StagingError(
                f"refusing to stage {src}: archive member {member!r} is unsafe ({exc})"
            ) from None
        except (tarfile.TarError, EOFError) as exc:
            raise StagingError(f"cannot extract the archive {src}: {exc}") from exc
        top = _store_root(tmp)
        expected = {
            (tmp / name).relative_to(top).as_posix(): size
            for name, size in expected.items()
            if (tmp / name).is_relative_to(top)
        }
    else:
        fs, root, expected = _list_url(str(src), storage_options)

        def fetch(rel: str) -> None:
            data = read_bytes(fs, f"{root}/{rel}", what=f"file {rel!r} of the store")
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp / rel).write_bytes(data)

        try:
            with ThreadPoolExecutor(URL_THREADS) as pool:
                list(pool.map(fetch, expected))
        finally:
            fs.release()
        top = tmp
    got = _list_dir(top)
    missing = {rel for rel, size in expected.items() if got.get(rel) != size}
    if missing:
        raise StagingError(
            f"staging {src} is incomplete: {len(missing)} of {len(expected)} files missing or "
            f"of the wrong size (e.g. {sorted(missing)[0]!r})"
        )
    return top


def _extract(tf: tarfile.TarFile, dest: Path) -> None:
    if hasattr(tarfile, "data_filter"):
        tf.extractall(dest, filter="data")  # strips leading slashes; refuses ".." and links out
        return
    for m in tf.getmembers():  # pragma: no cover - Python without extraction filters
        target = (dest / m.name).resolve()
        if not target.is_relative_to(dest.resolve()) or m.issym() or m.islnk() or m.isdev():
            raise StagingError(
                f"refusing to stage {tf.name!r}: archive member {m.name!r} is unsafe"
            )
    tf.extractall(dest)  # pragma: no cover


def _store_root(folder: Path) -> Path:
    """``folder`` when it holds a store, else its single sub-folder (``tar czf x.tgz store/``)."""
    if any((folder / m).exists() for m in STORE_MARKERS):
        return folder
    children = list(folder.iterdir())
    if len(children) == 1 and children[0].is_dir():
        return children[0]
    return folder


def check_complete(path: Path, src: str | os.PathLike) -> None:
    """Raise StagingError unless the manifest, when there is one, says ``complete: true``."""
    import json

    manifest = path / MANIFEST_NAME
    if not manifest.is_file():
        return
    try:
        complete = json.loads(manifest.read_text()).get("complete") is True
    except (OSError, ValueError, AttributeError) as exc:
        raise StagingError(f"the manifest of {src} cannot be read: {exc}") from exc
    if not complete:
        raise StagingError(
            f"{src} is not a complete store (its {MANIFEST_NAME} says complete: false); "
            "finish or re-run prepare before staging it"
        )
