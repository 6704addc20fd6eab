"""Packing a store into one SquashFS image (``mksquashfs``): a store of many files becomes one
file, which a slow metadata file system (Lustre, GPFS, NFS) serves with one open instead of one
per chunk. :mod:`shardload.move.mount` mounts the image to read it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import time
from pathlib import Path

from shardload.errors import ImageError, IncompleteStoreError, StoreError, StoreExistsError
from shardload.layout import MANIFEST_NAME, PARTIAL_SUFFIX, PROGRESS_DIR
from shardload.move.programs import require_program
from shardload.util import procs
from shardload.util.durable import fsync_path

log = logging.getLogger("shardload.squashfs")

COMPRESSIONS = ("zstd", "gzip", "xz", "lz4", "lzo", "none")


def pack(
    store_path: str | os.PathLike[str],
    image_path: str | os.PathLike[str],
    *,
    compression: str = "zstd",
    block_size: int = 131072,
    processors: int | None = None,
    overwrite: bool = False,
) -> Path:
    """Pack a complete store folder into a SquashFS image with ``mksquashfs``.

    The image holds the store's files at its root; :func:`~shardload.move.mount.mount` (and ``open_store`` given
    the image) serve them read-only. The image is written under a temporary name beside
    ``image_path`` and renamed into place once complete.

    Parameters
    ----------
    store_path
        A local store folder that ``open_store`` opens: a finished shardload store (or plain
        Zarr data). Partial stores (``STORE.partial``, ``complete: false``) are refused.
    image_path
        The image file to write, e.g. ``era5.sqfs``.
    compression
        ``"zstd"`` (default), ``"gzip"``, ``"xz"``, ``"lz4"``, ``"lzo"`` (as built into
        ``mksquashfs``) or ``"none"`` (nothing compressed: reads cost a copy only).
    block_size
        The SquashFS block size in bytes (4 KiB to 1 MiB, a power of two): a read decodes
        whole blocks, so smaller blocks cost less for small random reads, larger ones compress
        better.
    processors
        Threads ``mksquashfs`` uses (default: all).
    overwrite
        Replace an existing image.

    Returns
    -------
    Path
        The image.

    Raises
    ------
    ImageError
        ``mksquashfs`` is missing or failed, or an option is bad.
    StoreError, IncompleteStoreError
        ``store_path`` is not a complete store.
    StoreExistsError
        ``image_path`` exists and ``overwrite`` is false.
    """
    image = Path(image_path).expanduser().resolve()
    store = _check_pack(Path(store_path).expanduser(), image, compression, block_size, overwrite)
    tool = require_program("mksquashfs", "pack", store, "squashfs-tools")
    try:
        image.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ImageError(f"cannot write the image {image}: {exc}") from exc
    if not os.access(image.parent, os.W_OK):
        raise ImageError(
            f"cannot write the image {image}: the folder {image.parent} is not writable"
        )
    _remove_dead_leftovers(image)
    tmp = image.with_name(f".{image.name}.tmp-{os.getpid()}")
    cmd = [tool, str(store), str(tmp), "-noappend", "-no-progress", "-quiet", "-b", str(block_size)]
    cmd += ["-noI", "-noD", "-noF", "-noX"] if compression == "none" else ["-comp", compression]
    if processors:
        cmd += ["-processors", str(int(processors))]
    files, nbytes = _tree_size(store)
    t0 = time.monotonic()
    _run_mksquashfs(cmd, store, image, tmp)
    size = image.stat().st_size
    log.info(
        "packed %s (%d files, %.1f MB) into %s (%.1f MB, %s compression, %.2f of the store's "
        "bytes) in %.1f s",
        store,
        files,
        nbytes / 1e6,
        image,
        size / 1e6,
        compression,
        size / max(nbytes, 1),
        time.monotonic() - t0,
    )
    return image


def _check_pack(
    store: Path, image: Path, compression: str, block_size: int, overwrite: bool
) -> Path:
    """Refuse bad options, a store that is not complete, an image inside the store or an
    existing image (without ``overwrite``); the store, resolved."""
    if compression not in COMPRESSIONS:
        raise ImageError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
    if block_size < 4096 or block_size > 1 << 20 or block_size & (block_size - 1):
        raise ImageError(f"block_size {block_size} must be a power of two from 4096 to 1048576")
    partial = store.with_name(store.name + PARTIAL_SUFFIX)
    if not store.is_dir() and not partial.exists():
        what = "does not exist" if not store.exists() else "is not a folder"
        raise StoreError(f"cannot pack {store}: it {what} (pack takes a store folder)")
    try:
        _check_complete(store)
    except StoreError as exc:
        raise type(exc)(f"cannot pack {store}: {exc}") from exc
    store = store.resolve()
    if image == store or store in image.parents:
        raise ImageError(f"the image {image} must not be inside the store {store}")
    if image.exists() and not overwrite:
        raise StoreExistsError(f"{image} exists; pass overwrite=True (--overwrite) to replace it")
    return store


def _run_mksquashfs(cmd: list[str], store: Path, image: Path, tmp: Path) -> None:
    """Write the image under ``tmp``, fsync it and rename it into place (``tmp`` removed on
    failure)."""
    try:
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise ImageError(
                f"mksquashfs failed packing {store} into {image} (status {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()[-2000:]}"
            )
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, image)
        fsync_path(image.parent)
    except OSError as exc:
        raise ImageError(f"writing the image {image} failed: {exc}") from exc
    finally:
        with contextlib.suppress(OSError):  # never mask the error above
            tmp.unlink()


def _remove_dead_leftovers(image: Path) -> None:
    """Remove ``.IMAGE.tmp-PID`` files of packs that were killed (their PID is gone); a pack
    still running (its PID alive) keeps its file."""
    for leftover in image.parent.glob(f".{image.name}.tmp-*"):
        pid = leftover.name.rsplit("-", 1)[1]
        if pid.isdigit() and not procs.alive(int(pid), None):
            log.info("removing %s, left by a killed pack", leftover)
            with contextlib.suppress(OSError):
                leftover.unlink()


def _tree_size(root: Path) -> tuple[int, int]:
    files = nbytes = 0
    for dirpath, _, names in os.walk(root):
        for name in names:
            files += 1
            with contextlib.suppress(OSError):
                nbytes += os.lstat(os.path.join(dirpath, name)).st_size
    return files, nbytes


def _check_complete(store: Path) -> None:
    """Refuse a partial store or a folder that is no store, naming why (as ``open_store`` would;
    the manifest alone tells, so packing needs no reader of the store)."""
    partial = store.with_name(store.name + PARTIAL_SUFFIX)
    try:
        text = (store / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        if partial.exists() or (store / PROGRESS_DIR).exists():
            raise IncompleteStoreError(
                f"{store} is not complete: a prepare was interrupted or is still running "
                f"(found {partial}); re-run 'shardload prepare' to resume"
            ) from None
        if any((store / m).exists() for m in ("zarr.json", ".zgroup", ".zarray")):
            return  # plain Zarr data, which open_store reads too
        raise StoreError(
            f"{store} is not a shardload store: no {MANIFEST_NAME} and no Zarr metadata"
        ) from None
    try:
        complete = json.loads(text).get("complete", False)
    except (ValueError, AttributeError) as exc:
        raise StoreError(f"{store / MANIFEST_NAME} is not a manifest: {exc}") from None
    if complete is not True:
        raise IncompleteStoreError(
            f"{store} is not complete ({MANIFEST_NAME} says complete: false)"
        )
