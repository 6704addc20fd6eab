"""The compute config: which source, which attributes (function, depth, boundary), which blocks.

See docs/compute.md. Parsed into frozen dataclasses; every error names the key at fault.
Functions are imported here, before any file is read.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from shardload.blockwise.plan import Boundary, normalize_boundary, normalize_depth
from shardload.blockwise.steps import STEP_KINDS, StepConfig, check_steps, parse_step
from shardload.errors import ConfigError
from shardload.prep.config import (
    ExecutionConfig,
    SourceConfig,
    apply_overrides,
    execution_config,
    parse_size,
    read_yaml_mapping,
    resolve_path,
)
from shardload.prep.sources.segy import VARIABLE as SEGY_VARIABLE
from shardload.prep.sources.segy import is_segy
from shardload.util.imports import import_function

SCHEDULERS = ("threads", "processes", "sync", "distributed", "jobqueue", "auto")
ATTRIBUTE_KEYS = ("function", "depth", "boundary", "dtype", "kwargs")
TOP_KEYS = (
    "source",
    "attributes",
    "chunks",
    "out",
    "execution",
    "memory_limit",
    "allow_nan",
    "overwrite",
    "compression",
)
SOURCE_KEYS = (
    "paths",
    "variable",
    "engine",
    "combine",
    "concat_dim",
    "decode_times",
    "group",
    "open_kwargs",
    "storage_options",
)


@dataclass(frozen=True)
class AttributeConfig:
    """One attribute: ``function(window, **kwargs)`` on each block with its halo."""

    name: str
    function: str  # "module:name"
    depth: Mapping[int, int] | int | None = None
    boundary: Boundary | Mapping[int, Boundary] | None = None
    dtype: str | None = None  # declared output dtype (default: the source's)
    kwargs: Mapping[str, Any] = field(default_factory=dict)

    def resolved(self, ndim: int) -> tuple[tuple[int, ...], tuple[Boundary, ...]]:
        where = f"attributes.{self.name}"
        return (
            normalize_depth(self.depth, ndim, f"{where}.depth"),
            normalize_boundary(self.boundary, ndim, f"{where}.boundary"),
        )


@dataclass(frozen=True)
class ComputeConfig:
    source: SourceConfig
    variable: str
    attributes: Mapping[str, AttributeConfig]
    out: str
    chunks: Mapping[int, int] | None = None  # None: the source's own chunks
    execution: ExecutionConfig = field(default_factory=ExecutionConfig)
    memory_limit: int | None = None
    allow_nan: bool = False
    overwrite: bool = False
    compression: str = "zstd"
    #: standardisation / k-means steps on whole attributes, run after them (steps.py)
    steps: Mapping[str, StepConfig] = field(default_factory=dict)


def check_kwargs(func: Callable[..., Any], kwargs: Mapping[str, Any], where: str) -> None:
    """The function accepts the window and these keyword options (typos fail here)."""
    try:
        sig = inspect.signature(func)
    except (TypeError, ValueError):  # builtins without a signature: trust them
        return
    try:
        sig.bind(np.empty(0), **kwargs)
    except TypeError as exc:
        raise ConfigError(
            f"{where}: the function does not accept options {sorted(kwargs)}: {exc}"
        ) from None


def _attribute(name: str, raw: Any) -> AttributeConfig:
    where = f"attributes.{name}"
    if isinstance(raw, str):
        raw = {"function": raw}
    if not isinstance(raw, Mapping) or "function" not in raw:
        raise ConfigError(f"{where}: give a mapping with at least 'function: module:name'")
    kwargs = dict(raw.get("kwargs") or {})
    # any other key is an option of the function (e.g. ``axis: -1``), checked against it
    kwargs.update({k: v for k, v in raw.items() if k not in ATTRIBUTE_KEYS})
    dtype = raw.get("dtype")
    if dtype is not None:
        try:
            dtype = np.dtype(dtype).name
        except TypeError as exc:
            raise ConfigError(f"{where}.dtype: {dtype!r} is not a dtype") from exc
    attr = AttributeConfig(
        name=str(name),
        function=raw["function"],
        depth=raw.get("depth"),
        boundary=raw.get("boundary"),
        dtype=dtype,
        kwargs=kwargs,
    )
    func = import_function(attr.function, f"{where}.function")
    check_kwargs(func, kwargs, where)
    return attr


def parse_compute_config(raw: Mapping[str, Any], base: Path) -> ComputeConfig:
    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise ConfigError(f"compute config: unknown key(s) {unknown}; known: {list(TOP_KEYS)}")
    src = raw.get("source")
    if isinstance(src, Mapping) and "paths" in src and "variable" not in src:
        first = src["paths"] if isinstance(src["paths"], str) else next(iter(src["paths"]), "")
        if is_segy(str(first)):
            src = {**src, "variable": SEGY_VARIABLE}  # a SEG-Y file has one volume
    if not isinstance(src, Mapping) or "paths" not in src or "variable" not in src:
        raise ConfigError("source: give {paths: [...], variable: NAME}")
    bad = sorted(set(src) - set(SOURCE_KEYS))
    if bad:
        raise ConfigError(f"source: unknown key(s) {bad}; known: {list(SOURCE_KEYS)}")
    paths = src["paths"]
    paths = [paths] if isinstance(paths, str) else list(paths)
    variable = str(src["variable"])
    source = SourceConfig(
        paths=tuple(resolve_path(str(p), base) for p in paths),
        engine=src.get("engine"),
        combine=src.get("combine", "by_coords"),
        concat_dim=src.get("concat_dim"),
        decode_times=src.get("decode_times"),
        group=src.get("group"),
        variables=(variable,),
        open_kwargs=dict(src.get("open_kwargs") or {}),
        storage_options=dict(src.get("storage_options") or {}),
    )
    attrs_raw = raw.get("attributes")
    if not isinstance(attrs_raw, Mapping) or not attrs_raw:
        raise ConfigError("attributes: give at least one {name: {function: module:name, ...}}")
    is_step = {
        str(k): isinstance(v, Mapping) and "function" not in v and any(s in v for s in STEP_KINDS)
        for k, v in attrs_raw.items()
    }
    attributes = {
        str(k): _attribute(str(k), v) for k, v in attrs_raw.items() if not is_step[str(k)]
    }
    steps = {str(k): parse_step(str(k), v) for k, v in attrs_raw.items() if is_step[str(k)]}
    if not attributes:
        raise ConfigError("attributes: give at least one attribute computed by a function")
    check_steps(steps, list(attributes))
    chunks = raw.get("chunks", "source")
    if chunks in (None, "source"):
        chunks = None
    elif not isinstance(chunks, Mapping):
        raise ConfigError(f"chunks: {chunks!r}; give 'source' or {{axis: size, ...}} (-1: whole)")
    if "out" not in raw:
        raise ConfigError("out: the output store path is required")
    if "://" in str(raw["out"]):  # Path("s3://b/x") would be the local folder "s3:/b/x"
        raise ConfigError(
            f"out: {raw['out']}: compute writes a local folder; copy it to S3 with "
            "'shardload copy STORE s3://bucket/prefix'"
        )
    execution = execution_config(
        raw.get("execution"), default_scheduler="threads", where="compute config"
    )
    limit = raw.get("memory_limit")
    compression = str(raw.get("compression", "zstd"))
    if compression not in ("zstd", "lz4", "none"):
        raise ConfigError(f"compression: {compression!r}; choose zstd, lz4 or none")
    return ComputeConfig(
        source=source,
        variable=variable,
        attributes=attributes,
        steps=steps,
        out=resolve_path(str(raw["out"]), base),
        chunks={int(k): v for k, v in chunks.items()} if chunks is not None else None,
        execution=execution,
        memory_limit=parse_size(limit, "memory_limit") if limit is not None else None,
        allow_nan=bool(raw.get("allow_nan", False)),
        overwrite=bool(raw.get("overwrite", False)),
        compression=compression,
    )


def load_compute_config(
    source: str | os.PathLike[str] | Mapping[str, Any] | ComputeConfig,
    overrides: Sequence[str] = (),
) -> ComputeConfig:
    """A YAML file, a dict or a ComputeConfig -> a validated ComputeConfig."""
    if isinstance(source, ComputeConfig):
        return source
    if isinstance(source, Mapping):
        raw, base = dict(source), Path(os.getcwd())
    else:
        path = Path(source)
        raw = read_yaml_mapping(path)
        base = path.resolve().parent
    return parse_compute_config(apply_overrides(dict(raw), overrides), base)
