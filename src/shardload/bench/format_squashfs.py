"""The ``squashfs`` format of ``shardload bench formats``: the npy stack in a SquashFS image,
mounted read-only with squashfuse (:func:`shardload.move.mount.mount`) and read through the mount
with the npy stack's reader.

The image is made by ``mksquashfs`` called here, not by :func:`shardload.move.pack.pack`: that
packs *stores* (it refuses a folder ``open_store`` cannot open), and the npy stack of the
benchmark is a plain folder of ``.npy`` files. The options are those ``pack`` passes.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from shardload.bench.format_data import BenchData
from shardload.bench.format_io import write_npy_stack
from shardload.errors import StoreError

COMPRESSION = "zstd"  # pack's default
BLOCK_BYTES = 131072  # pack's default


def squashfs_unavailable() -> str | None:
    """Why the squashfs format cannot run here, or ``None`` when it can."""
    if importlib.util.find_spec("shardload.move.mount") is None:
        return "shardload.move.mount (mounting images) is not in this version"
    missing = [t for t in ("mksquashfs", "squashfuse") if shutil.which(t) is None]
    if shutil.which("fusermount3") is None and shutil.which("fusermount") is None:
        missing.append("fusermount")
    if missing:
        return (
            f"{', '.join(missing)} not found (Debian: apt-get install squashfs-tools squashfuse "
            "fuse3; `make sysdeps`)"
        )
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "/dev/fuse is missing or not usable by this user (FUSE is not available here)"
    return None


def write_squashfs(data: BenchData, image: Path, *, group_rows: int) -> None:
    """Write the npy stack into a folder beside ``image``, pack it, remove the folder."""
    folder = image.with_name(image.name + ".src")
    write_npy_stack(data, folder, group_rows=group_rows)
    try:
        cmd = [
            "mksquashfs",
            str(folder),
            str(image),
            "-noappend",
            "-no-progress",
            "-quiet",
            "-b",
            str(BLOCK_BYTES),
            "-comp",
            COMPRESSION,
        ]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise StoreError(
                f"mksquashfs failed packing {folder} into {image} (status {res.returncode}): "
                f"{(res.stderr or res.stdout).strip()[-2000:]}"
            )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def mount_image(image: Path) -> Path:
    """The folder the image shows, mounted read-only for as long as this process lives."""
    from shardload.move.mount import mount

    return mount(image)


def unmount_image(image: Path) -> None:
    """End this process's use of the mount (unmounted once no process uses it)."""
    from shardload.move.mount import unmount

    unmount(image)
