"""Open raw inputs lazily with xarray + dask: files, globs, lists, folders (Zarr) and URLs.

Nothing is loaded: variables are dask arrays over the files' own chunking (``chunks={}``), and
views index them. Several files combine along a dimension (``combine``/``concat_dim``). A
source whose rows a row reader reads (:func:`rows_first`) is opened without dask (nor
default indexes) first: its variables are then xarray's lazily indexed backend arrays, which
only describe it.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import re
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import xarray as xr

from shardload.errors import SourceError, require
from shardload.prep.config import SourceConfig
from shardload.prep.sources.paths import (
    expand_paths,
    grib_offset,
    guess_engine,
    is_url,
    is_zarr_dir,
)

log = logging.getLogger(__name__)


def open_kwargs(cfg: SourceConfig, engine: str | None) -> dict[str, Any]:
    kw: dict[str, Any] = {"chunks": {}}
    if engine:
        kw["engine"] = engine
    if cfg.decode_times is not None:
        kw["decode_times"] = cfg.decode_times
    if cfg.group is not None:
        kw["group"] = cfg.group
    if engine == "h5netcdf":
        kw.setdefault("phony_dims", "sort")  # HDF5 files without dimension scales
    kw.update({k: v for k, v in cfg.open_kwargs.items() if k != "backend_kwargs"})
    backend = dict(cfg.open_kwargs.get("backend_kwargs") or {})
    if engine == "cfgrib":
        backend.setdefault("indexpath", "")  # no index files beside the data
        if cfg.filter:
            backend["filter_by_keys"] = {**backend.get("filter_by_keys", {}), **cfg.filter}
    elif cfg.filter:
        raise SourceError(
            f"source.filter selects GRIB messages, but the source is opened with engine "
            f"{engine!r}; remove it or set source.engine: cfgrib"
        )
    if backend:
        kw["backend_kwargs"] = backend
    return kw


@functools.cache
def _opens_without_indexes() -> bool:
    """Whether this xarray's ``open_dataset`` takes ``create_default_indexes`` (2025.7 on)."""
    return "create_default_indexes" in inspect.signature(xr.open_dataset).parameters


def _open_one_target(path: str, engine: str | None, cfg: SourceConfig) -> Any:
    """What xarray opens: a local path, or for URLs a file object (netCDF/HDF5) / mapper (zarr)."""
    if not is_url(path):
        return path
    import fsspec

    so = dict(cfg.storage_options)
    if engine == "zarr":
        return fsspec.get_mapper(path, **so)
    return fsspec.open(path, "rb", **so).open()


def open_source(
    cfg: SourceConfig,
    *,
    sample_chunks: dict[str, int] | None = None,
    chunks: dict[str, int] | None = None,
    dask_chunks: bool = True,
) -> xr.Dataset:
    """Open the configured inputs as one lazy dataset.

    ``dask_chunks=False``: no dask (``chunks=None``, ``cache=False``, no default indexes):
    xarray's lazily indexed backend arrays, for a view whose row reader reads every row
    (``import dask.array`` alone takes 0.25 s or more in a fresh process).

    ``chunks`` (dask chunks of whole source units, from
    :func:`~shardload.prep.sources.layout.plan_reads`) takes the place of ``sample_chunks``
    for files opened through xarray.

    ``sample_chunks`` aligns dask chunks with the store's chunks along the sample dim (e.g.
    ``{"column": 846}``): a write task then reads only its rows from the files, where the
    files' own chunking (often one chunk per variable) would make every task read everything.
    """
    if cfg.kind == "radiation":
        from shardload.prep.sources.radiation import DEFAULT_CHUNK_COLUMNS, open_radiation

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
    if engine == "segy":
        return _open_segy(cfg, paths, sample_chunks)
    kw = open_kwargs(cfg, engine)
    if (chunks or sample_chunks) and "chunks" not in cfg.open_kwargs:
        kw["chunks"] = dict(chunks or sample_chunks or {})
    if not dask_chunks:
        kw["chunks"] = None
        kw.setdefault("cache", False)  # a read through it (none expected) keeps nothing
        # no pandas indexes either: xarray's checks while building them import dask and
        # sparse (numba, scipy: 0.15-0.25 s in a fresh process); views read coordinates' values
        if _opens_without_indexes():
            kw.setdefault("create_default_indexes", False)
    if cfg.combine == "nested" and len(paths) > 1 and not cfg.concat_dim:
        raise SourceError("source.concat_dim is needed with combine: nested")
    where = paths[0] if len(paths) == 1 else f"{len(paths)} files ({paths[0]} ...)"
    skipped: dict[str, str] = {}
    try:
        if engine == "cfgrib":
            _keep_grib(paths)
            parts = [_open_grib(p, kw, skipped, cfg) for p in paths]
            ds = parts[0] if len(parts) == 1 else _combine(parts, cfg)
        elif len(paths) == 1:
            ds = xr.open_dataset(_open_one_target(paths[0], engine, cfg), **kw)
        else:
            targets = [_open_one_target(p, engine, cfg) for p in paths]
            mf: dict[str, Any] = {"combine": cfg.combine, "parallel": False}
            if cfg.concat_dim:
                mf["concat_dim"] = cfg.concat_dim
            ds = xr.open_mfdataset(targets, **mf, **kw)
    except SourceError:
        raise
    except FileNotFoundError as exc:
        raise SourceError(f"input file not found: {exc.filename or paths}") from exc
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise SourceError(_open_error(exc, where, engine, cfg, paths)) from exc
    if not ds.data_vars and not cfg.variables:
        groups = list_groups(paths[0], engine)
        if groups:
            raise SourceError(
                f"{where} has no variables{_in_group(cfg)}; its variables are in groups "
                f"{groups}: set source.group (e.g. group: {groups[0]})"
            )
    if cfg.variables:
        ds = _select_variables(ds, cfg, paths, engine, skipped)
    log.info("opened %d file(s) lazily: %s", len(paths), dict(ds.sizes))
    return ds


def _open_segy(
    cfg: SourceConfig, paths: list[str], sample_chunks: dict[str, int] | None
) -> xr.Dataset:
    from shardload.prep.sources.segy import open_segy_dataset

    ds = open_segy_dataset(
        paths, dict(cfg.open_kwargs), inline_chunks=(sample_chunks or {}).get("inline")
    )
    if cfg.variables:
        missing = [v for v in cfg.variables if v not in ds.variables]
        if missing:
            raise SourceError(
                f"variable(s) {missing} not found in SEG-Y file {paths[0]}; its volume is "
                f"{sorted(map(str, ds.data_vars))}"
            )
        ds = ds[list(cfg.variables)]
    return ds


def _select_variables(
    ds: xr.Dataset, cfg: SourceConfig, paths: list[str], engine: str | None, skipped: dict[str, str]
) -> xr.Dataset:
    """``ds`` reduced to ``source.variables``; a missing one is named, with why it may be."""
    variables = list(cfg.variables or ())
    missing = [v for v in variables if v not in ds.variables]
    if missing:
        hint = ""
        if any(v in skipped for v in missing):
            v = next(v for v in missing if v in skipped)
            hint = f"; cfgrib skipped {v!r} ({skipped[v]}): select it with source.filter"
        else:
            groups = list_groups(paths[0], engine)
            if groups:
                hint = f"; the file has groups {groups}: is source.group what is missing?"
        raise SourceError(
            f"variable(s) {missing} not found in {paths[0]}{_in_group(cfg)}; it has "
            f"{sorted(map(str, ds.data_vars))}{hint}"
        )
    return ds[variables]


def _in_group(cfg: SourceConfig) -> str:
    return f" (group {cfg.group!r})" if cfg.group else " (root group)"


def _open_error(
    exc: BaseException, where: str, engine: str | None, cfg: SourceConfig, paths: list[str]
) -> str:
    """An open failure in the user's terms: the config key that is missing, where we know."""
    text = str(exc)
    if "Could not find any dimension coordinates to use to order the" in text:
        return (
            f"cannot combine {where} by their coordinates: they have no dimension coordinate "
            "that orders them; set source.combine: nested and source.concat_dim: DIM (the "
            f"dimension to join them along, in the order of source.paths) ({text})"
        )
    filters = re.findall(r"filter_by_keys=(\{.*?\})", text)
    if engine == "cfgrib" and filters:
        return (
            f"cannot open {where}: its GRIB messages do not fit one dataset; select some with "
            f"source.filter, one of: {'; '.join(filters)} (cfgrib: {text.splitlines()[0]})"
        )
    msg = f"cannot open {where} (engine={engine}): {type(exc).__name__}: {exc}"
    if engine != "cfgrib":
        at = grib_offset(paths[0], 1 << 20) if paths else None  # ecCodes' way: 'GRIB' anywhere
        if at is not None:
            msg += f"; {paths[0]} holds GRIB data ('GRIB' at byte {at}): set source.engine: cfgrib"
    if cfg.group is not None:
        groups = list_groups(paths[0], engine)
        if groups:
            msg += f"; the file's groups are {groups}"
    return msg


def list_groups(path: str, engine: str | None) -> list[str]:
    """Groups (nested ones as ``a/b``) of a local HDF5 / netCDF-4 file or Zarr folder; [] for
    other files or when they cannot be listed."""
    if is_url(path):
        return []
    try:
        if engine == "zarr" or is_zarr_dir(path):
            import zarr

            root = zarr.open_group(path, mode="r")
            return sorted(name for name, _ in root.groups())
        with open(path, "rb") as f:
            if not f.read(8).startswith(b"\x89HDF"):
                return []
        import h5py

        found: list[str] = []
        with h5py.File(path, "r") as h5:
            h5.visit(lambda name: found.append(name) if isinstance(h5[name], h5py.Group) else None)
        return sorted(found)[:50]
    except Exception:  # a hint only: never hide the real error
        return []


# -- GRIB: each file opened (indexed) once per process -------------------------------------------
_GRIB: dict[str, tuple[Any, dict[str, str]]] = {}
_GRIB_LOCK = threading.Lock()


def _keep_grib(paths: Sequence[str]) -> None:
    """Forget the GRIB files of other sources (one source at a time: memory stays bounded)."""
    keep = set(paths)
    with _GRIB_LOCK:
        for key in [k for k in _GRIB if json.loads(k)[0] not in keep]:
            del _GRIB[key]


def _open_grib(
    path: str, kw: dict[str, Any], skipped: dict[str, str], cfg: SourceConfig
) -> xr.Dataset:
    """Open a GRIB file lazily, scanning it once per process: cfgrib reads every message to
    build its index, and prepare opens the source more than once (the view, then the view
    with chunks aligned to the store). cfgrib's tracebacks for variables it skips become one
    warning per file, naming them and ``source.filter``."""
    chunks = kw.get("chunks")
    open_kw = {k: v for k, v in kw.items() if k != "chunks"}
    target = _open_one_target(path, "cfgrib", cfg)
    st = os.stat(path) if not is_url(path) else None
    key = json.dumps(
        [path, st and (st.st_size, st.st_mtime_ns), open_kw], sort_keys=True, default=str
    )
    with _GRIB_LOCK:
        if key not in _GRIB:
            with _capture_cfgrib_errors() as errors:
                ds = xr.open_dataset(target, chunks=None, cache=False, **open_kw)
            if errors:
                names = ", ".join(f"{k!r}" for k in errors)
                first, why = next(iter(errors.items()))
                log.warning(
                    "%s: cfgrib skipped GRIB variable(s) %s (%s); select them with source.filter "
                    "(cfgrib's filter_by_keys, e.g. filter: {shortName: %s})",
                    path,
                    names,
                    why,
                    first,
                )
            _GRIB[key] = (ds, errors)
        ds, errors = _GRIB[key]
    skipped.update(errors)
    return ds if chunks is None else ds.chunk(chunks)


@contextmanager
def _capture_cfgrib_errors() -> Iterator[dict[str, str]]:
    """Collect cfgrib's "skipping variable" records (logged with a traceback each) by short
    name, instead of letting them print."""
    errors: dict[str, str] = {}

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            msg = record.getMessage()
            m = re.search(r"shortName='([^']+)'", msg)
            why = str(record.exc_info[1]) if record.exc_info and record.exc_info[1] else msg
            errors[m.group(1) if m else msg] = why.splitlines()[0][:200]

    logger = logging.getLogger("cfgrib")
    handler = Collect(level=logging.WARNING)
    old = logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield errors
    finally:
        logger.removeHandler(handler)
        logger.propagate = old


def _combine(parts: list[xr.Dataset], cfg: SourceConfig) -> xr.Dataset:
    if cfg.combine == "nested":
        return xr.combine_nested(parts, concat_dim=cfg.concat_dim)
    return xr.combine_by_coords(parts)  # type: ignore[return-value]


def open_rows(cfg: SourceConfig, ds: xr.Dataset, sample_dims: Sequence[str]) -> Any:
    """A :class:`~shardload.prep.views.rows.RowReader` that reads ``ds``'s rows without dask, or
    None where there is none (then views read through dask). Today: local radiation files with
    the column as the sample axis, and plain variables of one local netCDF-4/HDF5 file."""
    if cfg.kind != "radiation":
        return _plain_rows(cfg, ds, sample_dims)
    if tuple(sample_dims or ("column",)) != ("column",):
        return None
    from shardload.prep.sources.radiation_rows import radiation_rows

    so = dict(cfg.storage_options)
    outputs = expand_paths(cfg.outputs, so) if cfg.outputs else None
    return radiation_rows(expand_paths(cfg.paths, so), outputs, ds)


def rows_first(cfg: SourceConfig, sample_dims: Sequence[str]) -> bool:
    """Whether a view of this source may be read by h5py alone (:func:`open_rows`), so that it
    is opened without dask first (``open_source(dask_chunks=False)``): one local netCDF-4/HDF5
    file, neutral options, no dask ``chunks`` of the user's."""
    return _h5_file(cfg, sample_dims) is not None and "chunks" not in cfg.open_kwargs


def _h5_file(cfg: SourceConfig, sample_dims: Sequence[str]) -> str | None:
    """The one local netCDF-4/HDF5 file, opened with neutral options, whose plain variables
    :class:`~shardload.prep.sources.h5_rows.H5Rows` may read (None otherwise)."""
    from shardload.prep.sources.h5_rows import open_kwargs_are_neutral

    if cfg.kind == "radiation" or not sample_dims:
        return None
    paths = expand_paths(cfg.paths, dict(cfg.storage_options))
    if len(paths) != 1 or is_url(paths[0]) or not open_kwargs_are_neutral(cfg.open_kwargs):
        return None
    if (cfg.engine or guess_engine(paths[0])) != "h5netcdf":
        return None
    return paths[0]


def _plain_rows(cfg: SourceConfig, ds: xr.Dataset, sample_dims: Sequence[str]) -> Any:
    """:class:`~shardload.prep.sources.h5_rows.H5Rows` for one local netCDF-4/HDF5 file opened
    with neutral options (None otherwise)."""
    from shardload.prep.sources.h5_rows import h5_rows

    path = _h5_file(cfg, sample_dims)
    if path is None:
        return None
    phony = str(cfg.open_kwargs.get("phony_dims", "sort"))
    return h5_rows(path, ds, sample_dims, group=cfg.group, phony_dims=phony)
