"""Open raw inputs lazily with xarray + dask: files, globs, lists, folders (Zarr) and URLs.

Nothing is loaded: variables are dask arrays over the files' own chunking (``chunks={}``), and
views index them. Several files combine along a dimension (``combine``/``concat_dim``).
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Sequence
from typing import Any

import xarray as xr

from ..config import SourceConfig
from ..errors import SourceError, require

log = logging.getLogger(__name__)

GRIB_SUFFIXES = (".grib", ".grb", ".grib1", ".grib2", ".grb2")
HDF5_SUFFIXES = (".h5", ".hdf5", ".hdf", ".he5")


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
    if low.endswith(GRIB_SUFFIXES):
        require("cfgrib", "grib")
        return "cfgrib"
    if low.endswith(".zarr") or _is_zarr_dir(path):
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
    return None


def _is_zarr_dir(path: str) -> bool:
    return (
        not is_url(path)
        and os.path.isdir(path)
        and any(
            os.path.exists(os.path.join(path, m))
            for m in ("zarr.json", ".zgroup", ".zmetadata", ".zarray")
        )
    )


def open_kwargs(cfg: SourceConfig, engine: str | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"chunks": {}}
    if engine:
        kw["engine"] = engine
    if cfg.decode_times is not None:
        kw["decode_times"] = cfg.decode_times
    if cfg.group is not None:
        kw["group"] = cfg.group
    if engine == "cfgrib":
        kw.setdefault("backend_kwargs", {"indexpath": ""})  # no index files beside the data
    if engine == "h5netcdf":
        kw.setdefault("phony_dims", "sort")  # HDF5 files without dimension scales
    kw.update(cfg.open_kwargs)
    return kw


def _open_one_target(path: str, engine: str | None, cfg: SourceConfig) -> Any:
    """What xarray opens: a local path, or for URLs a file object (netCDF/HDF5) / mapper (zarr)."""
    if not is_url(path):
        return path
    import fsspec

    so = dict(cfg.storage_options)
    if engine == "zarr":
        return fsspec.get_mapper(path, **so)
    return fsspec.open(path, "rb", **so).open()


def open_source(cfg: SourceConfig, *, sample_chunks: dict[str, int] | None = None) -> xr.Dataset:
    """Open the configured inputs as one lazy dataset.

    ``sample_chunks`` aligns dask chunks with the store's chunks along the sample dim (e.g.
    ``{"column": 846}``): a write task then reads only its rows from the files, where the
    files' own chunking (often one chunk per variable) would make every task read everything.
    """
    if cfg.kind == "radiation":
        from .radiation import DEFAULT_CHUNK_COLUMNS, open_radiation

        return open_radiation(
            expand_paths(cfg.paths, dict(cfg.storage_options)),
            expand_paths(cfg.outputs, dict(cfg.storage_options)) if cfg.outputs else None,
            chunks=(sample_chunks or {}).get("column", DEFAULT_CHUNK_COLUMNS),
        )
    paths = expand_paths(cfg.paths, dict(cfg.storage_options))
    engine = cfg.engine or guess_engine(paths[0])
    if engine == "h5netcdf" or (engine is None and any(is_url(p) for p in paths)):
        require("h5netcdf", "remote")
        engine = engine or "h5netcdf"
    kw = open_kwargs(cfg, engine)
    if sample_chunks and "chunks" not in cfg.open_kwargs:
        kw["chunks"] = dict(sample_chunks)
    try:
        if len(paths) == 1:
            ds = xr.open_dataset(_open_one_target(paths[0], engine, cfg), **kw)
        else:
            targets = [_open_one_target(p, engine, cfg) for p in paths]
            mf: dict[str, Any] = {"combine": cfg.combine, "parallel": False}
            if cfg.concat_dim:
                mf["concat_dim"] = cfg.concat_dim
            elif cfg.combine == "nested":
                raise SourceError("source.concat_dim is needed with combine: nested")
            ds = xr.open_mfdataset(targets, **mf, **kw)
    except SourceError:
        raise
    except FileNotFoundError as exc:
        raise SourceError(f"input file not found: {exc.filename or paths}") from exc
    except (OSError, ValueError, TypeError, KeyError) as exc:
        where = paths[0] if len(paths) == 1 else f"{len(paths)} files ({paths[0]} ...)"
        raise SourceError(
            f"cannot open {where} (engine={engine}): {type(exc).__name__}: {exc}"
        ) from exc
    if cfg.variables:
        missing = [v for v in cfg.variables if v not in ds.variables]
        if missing:
            raise SourceError(
                f"variable(s) {missing} not found in {paths[0]}; it has {sorted(map(str, ds.data_vars))}"
            )
        ds = ds[list(cfg.variables)]
    log.info("opened %d file(s) lazily: %s", len(paths), dict(ds.sizes))
    return ds


def open_rows(cfg: SourceConfig, ds: xr.Dataset, sample_dims: Sequence[str]) -> Any:
    """A :class:`~shardload.views.rows.RowReader` that reads ``ds``'s rows without dask, or
    None where there is none (then views read through dask). Today: local radiation files with
    the column as the sample axis, and plain variables of one local netCDF-4/HDF5 file."""
    if cfg.kind != "radiation":
        return _plain_rows(cfg, ds, sample_dims)
    if tuple(sample_dims or ("column",)) != ("column",):
        return None
    from .radiation_rows import radiation_rows

    so = dict(cfg.storage_options)
    outputs = expand_paths(cfg.outputs, so) if cfg.outputs else None
    return radiation_rows(expand_paths(cfg.paths, so), outputs, ds)


def _plain_rows(cfg: SourceConfig, ds: xr.Dataset, sample_dims: Sequence[str]) -> Any:
    """:class:`~shardload.sources.h5_rows.H5Rows` for one local netCDF-4/HDF5 file opened
    with neutral options (None otherwise)."""
    from .h5_rows import h5_rows, open_kwargs_are_neutral

    paths = expand_paths(cfg.paths, dict(cfg.storage_options))
    if len(paths) != 1 or is_url(paths[0]) or not open_kwargs_are_neutral(cfg.open_kwargs):
        return None
    if (cfg.engine or guess_engine(paths[0])) != "h5netcdf" or not sample_dims:
        return None
    phony = str(cfg.open_kwargs.get("phony_dims", "sort"))
    return h5_rows(paths[0], ds, sample_dims, group=cfg.group, phony_dims=phony)
