"""Where raw inputs are and what they are: URLs, globs, and the xarray engine a file needs
(by name, or for local files by magic bytes). No xarray import: the row readers use it too."""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence
from typing import Any

from shardload.errors import SourceError, require

GRIB_SUFFIXES = (".grib", ".grb", ".grib1", ".grib2", ".grb2")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")
SEGY_SUFFIXES = (".sgy", ".segy")  # as shardload.prep.sources.segy (not imported: needs no segyio)


def is_url(p: str) -> bool:
    return "://" in p and not p.startswith("file://")


def expand_paths(paths: Sequence[str], storage_options: dict[str, Any] | None = None) -> list[str]:
    """Expand globs (local or remote) keeping order; fail naming the path that matches nothing."""
    out: list[str] = []
    for p in paths:
        if is_url(p):
            if any(c in p for c in "*?["):
                import fsspec

                fs, _, found = fsspec.get_fs_token_paths(p, storage_options=storage_options or {})
                if not found:
                    raise SourceError(f"no files match {p}")
                out.extend(fs.unstrip_protocol(f) for f in sorted(found))
            else:
                out.append(p)
            continue
        p = p[len("file://") :] if p.startswith("file://") else p
        if any(c in p for c in "*?["):
            found = sorted(glob.glob(os.path.expanduser(p)))
            if not found:
                raise SourceError(f"no files match {p}")
            out.extend(found)
        else:
            if not os.path.exists(p):
                raise SourceError(f"input file not found: {p}")
            out.append(p)
    return out


def guess_engine(path: str) -> str | None:
    """Pick the xarray engine from the name, or for local files from the magic bytes.

    netCDF4/HDF5 files go to h5netcdf and netCDF3 files to scipy, so that only h5py's copy of
    libhdf5 is loaded in the process: netCDF4-python brings a second copy, and the two together
    crash (seen with hdf5plugin's filters registered).
    """
    low = path.lower().rstrip("/")
    if low.endswith(SEGY_SUFFIXES):
        return "segy"  # read by sources/segy.py (segyio), not by xarray
    if low.endswith(GRIB_SUFFIXES):
        require("cfgrib", "grib")
        return "cfgrib"
    if low.endswith(".zarr") or is_zarr_dir(path):
        return "zarr"
    if low.endswith(HDF5_SUFFIXES):
        return "h5netcdf"
    if not is_url(path) and os.path.isfile(path):
        with open(path, "rb") as f:
            magic = f.read(8)
        if magic.startswith(b"\x89HDF"):
            return "h5netcdf"
        if magic.startswith(b"CDF\x01") or magic.startswith(b"CDF\x02"):
            return "scipy"
        # GRIB editions 1 and 2, whatever the file is called, also behind a WMO bulletin
        # header (``\x01\r\r\nNNN\r\r\nTTAAii CCCC YYGGgg\r\r\n`` before ``GRIB``): ecCodes
        # skips such bytes, as it does here
        if grib_offset(path, GRIB_HEADER_BYTES) is not None:
            require("cfgrib", "grib")
            return "cfgrib"
    return None


#: how far into a file ``guess_engine`` looks for ``GRIB`` (WMO headers are ~30-100 bytes)
GRIB_HEADER_BYTES = 4096


def grib_offset(path: str, nbytes: int) -> int | None:
    """Where ``GRIB`` (a GRIB message's start) first occurs in the first ``nbytes`` bytes of
    local file ``path`` (None: not there, or not a readable local file)."""
    if is_url(path) or not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            head = f.read(nbytes)
    except OSError:
        return None
    at = head.find(b"GRIB")
    return None if at < 0 else at


def is_zarr_dir(path: str) -> bool:
    return (
        not is_url(path)
        and os.path.isdir(path)
        and any(
            os.path.exists(os.path.join(path, m))
            for m in ("zarr.json", ".zgroup", ".zmetadata", ".zarray")
        )
    )
