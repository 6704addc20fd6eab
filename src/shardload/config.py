"""The prepare configuration: YAML (or a dict) -> a validated, frozen :class:`PrepareConfig`.

Keys (see docs/config.md for the full reference with examples)::

    source: {paths, kind, engine, combine, concat_dim, decode_times, group, variables,
             open_kwargs, storage_options, outputs, filter}
    sample_dims, view, arrays, dtype,
    chunk_rows | target_chunk_bytes, format, compression, compression_level, shard_chunks,
    splits, split_seed, split_shuffle, nan, out, overwrite,
    execution: {scheduler, num_workers, threads_per_worker, address, cluster}

Relative paths (source paths, out) resolve against the config file's folder.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import ConfigError
from .formats.base import COMPRESSIONS, DEFAULT_COMPRESSION, REGISTRY
from .plan.chunks import DEFAULT_TARGET_CHUNK_BYTES

SCHEDULERS = ("auto", "threads", "processes", "distributed", "jobqueue", "sync")
NAN_POLICIES = ("warn", "fail", "ignore")


@dataclass(frozen=True)
class SourceConfig:
    paths: tuple[str, ...]
    kind: str = "xarray"  # or "radiation"
    outputs: tuple[str, ...] = ()  # radiation: 3dcorrection output files
    engine: str | None = None
    combine: str = "by_coords"  # or "nested"
    concat_dim: str | None = None
    decode_times: bool | None = None
    group: str | None = None
    variables: tuple[str, ...] | None = None
    open_kwargs: Mapping[str, Any] = field(default_factory=dict)
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    #: GRIB: select messages by key, e.g. {typeOfLevel: isobaricInhPa} (cfgrib's filter_by_keys)
    filter: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ExecutionConfig:
    #: "auto": the active dask.distributed client if the process has one, else threads
    scheduler: str = "auto"
    num_workers: int | None = None
    threads_per_worker: int = 1
    address: str | None = None
    cluster: Mapping[str, Any] = field(
        default_factory=dict
    )  # jobqueue: {kind: slurm, jobs: 4, ...}


@dataclass(frozen=True)
class PrepareConfig:
    source: SourceConfig
    out: str
    sample_dims: tuple[str, ...] = ()
    view: str = "flat"
    view_options: Mapping[str, Any] = field(default_factory=dict)
    arrays: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    dtype: str | None = None
    chunk_rows: int | None = None
    target_chunk_bytes: int = DEFAULT_TARGET_CHUNK_BYTES
    format: str = "zarr"
    compression: str = DEFAULT_COMPRESSION
    compression_level: int | None = None
    shard_chunks: int | None = None
    splits: Mapping[str, float] = field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1}
    )
    split_seed: int = 0
    split_shuffle: bool = True
    nan: str = "warn"
    overwrite: bool = False
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    base_dir: str = "."

    def to_dict(self) -> dict[str, Any]:
        return _plain(asdict(self))


TOP_KEYS = {f for f in PrepareConfig.__dataclass_fields__}
SOURCE_KEYS = {f for f in SourceConfig.__dataclass_fields__}
EXEC_KEYS = {f for f in ExecutionConfig.__dataclass_fields__}


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def _unknown(keys: Sequence[str], allowed: set[str], where: str) -> None:
    for k in keys:
        if k not in allowed:
            close = difflib.get_close_matches(k, sorted(allowed), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {k!r}{hint}; known keys: {sorted(allowed)}")


def _strs(v: Any, key: str) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, (str, os.PathLike)):
        return (os.fspath(v),)
    if isinstance(v, Sequence) and all(isinstance(x, (str, os.PathLike)) for x in v):
        return tuple(os.fspath(x) for x in v)
    raise ConfigError(f"{key}: expected a string or a list of strings, got {v!r}")


def _filter(v: Any) -> dict[str, Any]:
    if v is None:
        return {}
    if not isinstance(v, Mapping) or not all(isinstance(k, str) for k in v):
        raise ConfigError(
            f"source.filter: expected a mapping of GRIB keys to values "
            f"(e.g. {{typeOfLevel: isobaricInhPa}}), got {v!r}"
        )
    return dict(v)


def _resolve(p: str, base: Path) -> str:
    if "://" in p or os.path.isabs(os.path.expanduser(p)):
        return os.path.expanduser(p)
    return str(base / p)


def parse_size(v: Any, key: str) -> int:
    """``16MiB``, ``1GB``, ``4096`` -> bytes."""
    if isinstance(v, bool):
        raise ConfigError(f"{key}: expected a size, got {v!r}")
    if isinstance(v, (int, float)):
        return int(v)
    units = {
        "k": 10**3,
        "m": 10**6,
        "g": 10**9,
        "t": 10**12,
        "ki": 2**10,
        "mi": 2**20,
        "gi": 2**30,
        "ti": 2**40,
    }
    s = str(v).strip().lower().rstrip("b")
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            try:
                return int(float(s[: -len(u)]) * units[u])
            except ValueError:
                break
    try:
        return int(float(s))
    except ValueError as exc:
        raise ConfigError(f"{key}: cannot read {v!r} as a size (e.g. 16MiB, 1GB, 4096)") from exc


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides (values parsed as YAML) to a raw config dict."""
    out = dict(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. --set chunk_rows=4096)")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        node = out
        for p in parts[:-1]:
            child = node.get(p)
            child = dict(child) if isinstance(child, Mapping) else {}
            node[p] = child
            node = child
        node[parts[-1]] = yaml.safe_load(value)
    return out


def load_config(
    source: str | os.PathLike[str] | Mapping[str, Any],
    overrides: Sequence[str] = (),
    *,
    base_dir: str | os.PathLike[str] | None = None,
) -> PrepareConfig:
    """Read a YAML file (or take a dict), apply ``--set`` overrides and validate."""
    if isinstance(source, Mapping):
        raw = dict(source)
        base = Path(base_dir or os.getcwd())
    else:
        path = Path(source)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
        if not isinstance(raw, Mapping):
            raise ConfigError(
                f"{path}: the config must be a mapping of keys, got {type(raw).__name__}"
            )
        base = Path(base_dir) if base_dir else path.resolve().parent
    raw = apply_overrides(dict(raw), overrides)
    return validate(raw, base)


def validate(raw: Mapping[str, Any], base: Path) -> PrepareConfig:
    _unknown(list(raw), TOP_KEYS - {"base_dir"}, "config")
    if "source" not in raw:
        raise ConfigError("config: 'source' is required (source: {paths: [...]})")
    if "out" not in raw:
        raise ConfigError("config: 'out' is required (the store folder to write)")
    src = raw["source"]
    if isinstance(src, (str, list)):
        src = {"paths": src}
    if not isinstance(src, Mapping):
        raise ConfigError(f"source: expected a mapping, got {src!r}")
    _unknown(list(src), SOURCE_KEYS, "source")
    paths = _strs(src.get("paths"), "source.paths")
    if not paths:
        raise ConfigError("source.paths: give at least one file, glob, folder or URL")
    source = SourceConfig(
        paths=tuple(_resolve(p, base) for p in paths),
        kind=str(src.get("kind", "xarray")),
        outputs=tuple(_resolve(p, base) for p in _strs(src.get("outputs"), "source.outputs")),
        engine=src.get("engine"),
        combine=str(src.get("combine", "by_coords")),
        concat_dim=src.get("concat_dim"),
        decode_times=src.get("decode_times"),
        group=src.get("group"),
        variables=_strs(src.get("variables"), "source.variables") or None,
        open_kwargs=dict(src.get("open_kwargs") or {}),
        storage_options=dict(src.get("storage_options") or {}),
        filter=_filter(src.get("filter")),
    )
    if source.kind not in ("xarray", "radiation"):
        raise ConfigError(
            f"source.kind: unknown kind {source.kind!r}; choose 'xarray' or 'radiation'"
        )
    if source.combine not in ("by_coords", "nested"):
        raise ConfigError(f"source.combine: {source.combine!r}; choose 'by_coords' or 'nested'")

    view = raw.get("view", "flat")
    view_options: dict[str, Any] = dict(raw.get("view_options") or {})
    if isinstance(view, Mapping):
        view_options = {**{k: v for k, v in view.items() if k != "name"}, **view_options}
        view = view.get("name") or ("function" if "function" in view else None)
        if view is None:
            raise ConfigError("view: a mapping needs 'name' (flat, graph, window) or 'function'")
    view = str(view)
    if ":" in view:  # "pkg.module:function"
        view_options = {"function": view, **view_options}
        view = "function"

    arrays_raw = raw.get("arrays") or {}
    if not isinstance(arrays_raw, Mapping):
        raise ConfigError(f"arrays: expected a mapping NAME: [variables...], got {arrays_raw!r}")
    arrays = {str(k): _strs(v, f"arrays.{k}") for k, v in arrays_raw.items()}
    if view in ("flat", "window") and not arrays:
        raise ConfigError(
            f"arrays: the {view!r} view needs at least one array, e.g. arrays: {{x: [t, z]}}"
        )

    fmt = str(raw.get("format", "zarr"))
    if fmt not in REGISTRY:
        raise ConfigError(f"format: unknown format {fmt!r}; choose one of {sorted(REGISTRY)}")
    default_comp = "none" if fmt == "npy" else DEFAULT_COMPRESSION
    comp = str(raw.get("compression", default_comp)).lower()
    if comp not in COMPRESSIONS:
        raise ConfigError(
            f"compression: unknown value {comp!r}; choose one of {list(COMPRESSIONS)}"
        )

    chunk_rows = raw.get("chunk_rows")
    if chunk_rows is not None and (
        not isinstance(chunk_rows, int) or isinstance(chunk_rows, bool) or chunk_rows <= 0
    ):
        raise ConfigError(f"chunk_rows: expected a positive integer, got {chunk_rows!r}")
    shard_chunks = raw.get("shard_chunks")
    if shard_chunks is not None and (not isinstance(shard_chunks, int) or shard_chunks <= 0):
        raise ConfigError(f"shard_chunks: expected a positive integer, got {shard_chunks!r}")
    if shard_chunks and fmt != "zarr":
        raise ConfigError(f"shard_chunks: only the zarr format has shards (format is {fmt!r})")
    nan = str(raw.get("nan", "warn"))
    if nan not in NAN_POLICIES:
        raise ConfigError(f"nan: unknown policy {nan!r}; choose one of {list(NAN_POLICIES)}")
    splits = raw.get("splits", {"train": 0.8, "val": 0.1, "test": 0.1})
    if splits is None:
        splits = {}
    if not isinstance(splits, Mapping):
        raise ConfigError(f"splits: expected a mapping of name: fraction, got {splits!r}")

    ex = raw.get("execution") or {}
    if isinstance(ex, str):
        ex = {"scheduler": ex}
    _unknown(list(ex), EXEC_KEYS, "execution")
    execution = ExecutionConfig(
        scheduler=str(ex.get("scheduler", "auto")),
        num_workers=ex.get("num_workers"),
        threads_per_worker=int(ex.get("threads_per_worker", 1)),
        address=ex.get("address"),
        cluster=dict(ex.get("cluster") or {}),
    )
    if execution.scheduler not in SCHEDULERS:
        raise ConfigError(
            f"execution.scheduler: unknown {execution.scheduler!r}; choose one of {list(SCHEDULERS)}"
        )

    sample_dims = _strs(raw.get("sample_dims"), "sample_dims")
    return PrepareConfig(
        source=source,
        out=_resolve(str(raw["out"]), base),
        sample_dims=sample_dims,
        view=view,
        view_options=view_options,
        arrays=arrays,
        dtype=raw.get("dtype"),
        chunk_rows=chunk_rows,
        target_chunk_bytes=parse_size(
            raw.get("target_chunk_bytes", DEFAULT_TARGET_CHUNK_BYTES), "target_chunk_bytes"
        ),
        format=fmt,
        compression=comp,
        compression_level=raw.get("compression_level"),
        shard_chunks=shard_chunks,
        splits={str(k): float(v) for k, v in splits.items()},
        split_seed=int(raw.get("split_seed", 0)),
        split_shuffle=bool(raw.get("split_shuffle", True)),
        nan=nan,
        overwrite=bool(raw.get("overwrite", False)),
        execution=execution,
        base_dir=str(base),
    )
