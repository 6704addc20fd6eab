"""The prepare configuration: YAML (or a dict) -> a validated, frozen :class:`PrepareConfig`.

Keys (see docs/config.md for the full reference with examples)::

    source: {paths, kind, engine, combine, concat_dim, decode_times, group, variables,
             open_kwargs, storage_options, outputs, filter}
    sample_dims, view, arrays, dtype,
    chunk_rows | target_chunk_bytes, format, compression, compression_level, shard_chunks,
    splits, split_seed, split_shuffle, nan, out, overwrite,
    dates: {frequency, missing, statistics, tendencies} (or false),
    execution: {scheduler, num_workers, threads_per_worker, address, cluster, timeout_s}

Relative paths (source paths, out) resolve against the config file's folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from shardload.errors import ConfigError
from shardload.formats.base import AUTO
from shardload.formats.registry import format_entry
from shardload.plan.chunks import DEFAULT_TARGET_CHUNK_BYTES

#: The keys that choose a store's layout; a config with none of them gets the default layout.
LAYOUT_KEYS = frozenset({"chunk_rows", "target_chunk_bytes", "shard_chunks"})


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
    #: jobqueue: seconds to wait for the batch jobs' workers (then an error, never a hang)
    timeout_s: float = 300.0


@dataclass(frozen=True)
class DatesConfig:
    """``dates:``: ``enabled`` None (not given: dated where the sample axis is one regular
    time coordinate), False (never) or True (always; an error where it cannot be)."""

    enabled: bool | None = None
    frequency_s: int | None = None
    #: declared missing dates (ISO text), None when none were declared
    missing: tuple[str, ...] | None = None
    #: the split the statistics cover, "all", or None (train if there is one, else all)
    statistics: str | None = None
    tendencies: tuple[int, ...] = (1,)


@dataclass(frozen=True)
class PrepareConfig:
    source: SourceConfig
    out: str
    #: for an ``out`` URL (s3://): passed to s3fs (credentials, endpoint_url, ...)
    out_storage_options: Mapping[str, Any] = field(default_factory=dict)
    sample_dims: tuple[str, ...] = ()
    view: str = "flat"
    view_options: Mapping[str, Any] = field(default_factory=dict)
    arrays: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    dtype: str | None = None
    chunk_rows: int | None = None
    target_chunk_bytes: int = DEFAULT_TARGET_CHUNK_BYTES
    format: str = "zarr"
    compression: str = AUTO
    compression_level: int | None = None
    shard_chunks: int | None = None
    #: No layout key given (chunk_rows, target_chunk_bytes, shard_chunks): prepare picks the
    #: layout from the row size (:func:`shardload.prep.planning.resolve_layout`).
    default_layout: bool = True
    splits: Mapping[str, float] = field(
        default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1}
    )
    split_seed: int = 0
    split_shuffle: bool = True
    #: ``split_shuffle`` not given: a dated store's splits are then contiguous time ranges
    #: (:func:`shardload.prep.planning.resolve_split_shuffle`)
    default_split_shuffle: bool = True
    nan: str = "warn"
    overwrite: bool = False
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    base_dir: str = "."
    dates: DatesConfig = field(default_factory=DatesConfig)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data, secrets of the storage options replaced by ``***`` (it
        goes into the manifest's provenance and the write fingerprint)."""
        d = _plain(asdict(self))
        d["out_storage_options"] = redact(d.get("out_storage_options") or {})
        d["source"]["storage_options"] = redact(d["source"].get("storage_options") or {})
        return d  # type: ignore[no-any-return]


#: storage option names holding a secret (matched as parts of the lower-cased name)
SECRET_WORDS = ("key", "secret", "token", "password", "session", "credential")


def redact(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` with the values of secret-looking names (and of nested mappings') as ``***``."""
    out: dict[str, Any] = {}
    for k, v in options.items():
        if isinstance(v, Mapping):
            out[k] = redact(v)
        elif any(w in str(k).lower() for w in SECRET_WORDS):
            out[k] = "***"
        else:
            out[k] = v
    return out


def _plain(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def resolve_path(p: str, base: Path) -> str:
    """``p`` as written in a config: URLs and absolute paths as they are, others under ``base``."""
    if "://" in p or os.path.isabs(os.path.expanduser(p)):
        return os.path.expanduser(p)
    return str(base / p)


def parse_size(v: Any, key: str) -> int:
    """``16MiB``, ``1GB``, ``4096`` -> bytes."""
    from shardload.prep import config_models as models

    try:
        return models.parse_size(v)
    except ValueError as exc:
        raise ConfigError(f"{key}: {exc}") from None


def apply_overrides(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply ``key.sub=value`` overrides to a raw config dict. Values are parsed as YAML
    (``true`` is a boolean, ``'"true"'`` a string) and validated strictly afterwards."""
    from shardload.prep import config_models as models

    shorthands = {
        "source": models.source_shorthand,
        "view": models.view_shorthand,
        "execution": models.execution_shorthand,
    }
    out = dict(raw)
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE (e.g. --set chunk_rows=4096)")
        key, value = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"--set {item!r}: empty key part in {key!r}")
        node = out
        for depth, p in enumerate(parts[:-1]):
            child = node.get(p)
            if depth == 0 and p in shorthands and child is not None:
                child = shorthands[p](child)  # view: window -> {name: window}
            if child is None:
                child = {"name": "flat"} if depth == 0 and p == "view" else {}
            elif not isinstance(child, Mapping):
                where = ".".join(parts[: depth + 1])
                raise ConfigError(f"--set {item!r}: {where} is {child!r}, not a mapping")
            child = dict(child)
            node[p] = child
            node = child
        try:
            node[parts[-1]] = yaml.safe_load(value)
        except yaml.YAMLError as exc:
            raise ConfigError(f"--set {item!r}: cannot read the value as YAML: {exc}") from None
    return out


def read_yaml_mapping(path: Path) -> dict[str, Any]:
    """The mapping a YAML config file holds; a ConfigError naming the file otherwise."""
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: the config must be a mapping of keys, got {type(raw).__name__}")
    return dict(raw)


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
        where = "config"
    else:
        path = Path(source)
        raw = read_yaml_mapping(path)
        base = Path(base_dir) if base_dir else path.resolve().parent
        where = str(path)
    raw = apply_overrides(dict(raw), overrides)
    return validate(raw, base, where=where)


def _execution_config(ex: Any) -> ExecutionConfig:
    return ExecutionConfig(
        scheduler=ex.scheduler,
        num_workers=ex.num_workers,
        threads_per_worker=ex.threads_per_worker,
        address=ex.address,
        cluster=ex.cluster.model_dump(exclude_none=True) if ex.cluster is not None else {},
        timeout_s=ex.timeout_s,
    )


def execution_config(
    raw: Any, *, default_scheduler: str = "auto", where: str = "config"
) -> ExecutionConfig:
    """An ``execution:`` mapping (or scheduler name) alone -> :class:`ExecutionConfig`, with the
    same keys, strict types, "did you mean" hints and cross-key rules as in a prepare config
    (``shardload compute`` uses it)."""
    from shardload.prep.config_models import validate_execution

    if raw is None:
        raw = {}
    if isinstance(raw, str):
        raw = {"scheduler": raw}
    if isinstance(raw, Mapping) and "scheduler" not in raw:
        raw = {**raw, "scheduler": default_scheduler}
    return _execution_config(validate_execution(raw, where=where))


def validate(raw: Mapping[str, Any], base: Path, *, where: str = "config") -> PrepareConfig:
    """Check a raw config completely (every problem at once, see :mod:`.config_models`) and
    resolve it into a :class:`PrepareConfig`. Pure: opens no file. (pydantic is imported here,
    not at module import: worker processes unpickle a PrepareConfig without it.)"""
    from shardload.prep import config_models as models

    m = models.validate_input(raw, where=where)
    src = m.source
    source = SourceConfig(
        paths=tuple(resolve_path(p, base) for p in src.paths),
        kind=src.kind,
        outputs=tuple(resolve_path(p, base) for p in src.outputs),
        engine=src.engine,
        combine=src.combine,
        concat_dim=src.concat_dim,
        decode_times=src.decode_times,
        group=src.group,
        variables=tuple(src.variables) if src.variables else None,
        open_kwargs=dict(src.open_kwargs),
        storage_options=dict(src.storage_options),
        filter=dict(src.filter),
    )
    view_options = m.view.model_dump(exclude={"name"})
    if m.view.name == "window" and m.view.targets is None:
        view_options.pop("targets")
    if m.view.name == "window" and not m.view.at_load:  # written windows: as before
        view_options.pop("at_load")
    execution = _execution_config(m.execution)
    compression = m.compression or format_entry(m.format).default_compression
    return PrepareConfig(
        source=source,
        out=resolve_path(m.out, base),
        out_storage_options=dict(m.out_storage_options),
        sample_dims=tuple(m.sample_dims),
        view=m.view.name,
        view_options=view_options,
        arrays={k: tuple(v) for k, v in m.arrays.items()},
        dtype=m.dtype,
        chunk_rows=m.chunk_rows,
        target_chunk_bytes=m.target_chunk_bytes,
        format=m.format,
        compression=compression,
        compression_level=m.compression_level,
        shard_chunks=m.shard_chunks,
        default_layout=not LAYOUT_KEYS & m.model_fields_set,
        splits=dict(m.splits),
        split_seed=m.split_seed,
        split_shuffle=m.split_shuffle,
        default_split_shuffle="split_shuffle" not in m.model_fields_set,
        nan=m.nan,
        overwrite=m.overwrite,
        execution=execution,
        base_dir=str(base),
        dates=_dates_config(m.dates),
    )


def _dates_config(d: Any) -> DatesConfig:
    if d is None or not d.enabled:
        return DatesConfig(enabled=None if d is None else False)
    return DatesConfig(
        enabled=True,
        frequency_s=d.frequency,
        missing=None if d.missing is None else tuple(d.missing),
        statistics=d.statistics,
        tendencies=tuple(sorted(set(d.tendencies))),
    )
