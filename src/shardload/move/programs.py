"""The external programs that packing and mounting images run, found on PATH or refused with
the package to install."""

from __future__ import annotations

import shutil
from pathlib import Path

from shardload.errors import ImageError


def require_program(name: str, action: str, target: object, package: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise ImageError(
            f"cannot {action} {target}: the '{name}' program is not on PATH "
            f"(install the '{package}' package, e.g. apt-get install {package})"
        )
    return path


def find_fusermount(image: Path) -> str:
    for name in ("fusermount3", "fusermount"):
        path = shutil.which(name)
        if path:
            return path
    raise ImageError(
        f"cannot mount {image}: neither 'fusermount3' nor 'fusermount' is on PATH "
        "(install the 'fuse3' package, e.g. apt-get install fuse3)"
    )
