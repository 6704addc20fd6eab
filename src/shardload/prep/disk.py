"""Where a run writes (``OUT.partial``) and what it says when the disk is full or fails."""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from shardload.errors import DiskFullError, StoreError
from shardload.layout import PARTIAL_SUFFIX


def partial_path(out: Path) -> Path:
    return out.with_name(out.name + PARTIAL_SUFFIX)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)


def os_error(exc: OSError, what: str) -> StoreError:
    if is_disk_full(exc):
        return DiskFullError(f"{what}: the disk is full")
    return StoreError(f"{what}: {exc}")


def disk_full_error(out: Path, needed_bytes: int, detail: str) -> DiskFullError:
    """The error for a full disk: names the output, the bytes still to write and the free space."""
    try:
        free = f"{shutil.disk_usage(out.parent).free:,} bytes free"
    except OSError:
        free = "free space unknown"
    return DiskFullError(
        f"the disk holding {out} is full ({detail}); about {needed_bytes:,} more bytes "
        f"(uncompressed) are needed to finish, {free}. The store stays incomplete in "
        f"{partial_path(out)}: free space and re-run the same command to resume."
    )
