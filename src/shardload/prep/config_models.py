"""The prepare config as typed models: what a YAML file (or dict) may say, checked strictly.

Pydantic v2 models describe the *input* (YAML as written, with its shorthands); ``config.py``
turns a valid input into the frozen :class:`~shardload.prep.config.PrepareConfig` that prepare uses.
Everything here is pure: no file is opened (relative paths are resolved later, in config.py).

Strict types: a quoted ``"false"`` is a string, not a boolean; ``"four"`` is not an integer.
Unknown keys are errors at every level (top, source, view options of every view, execution,
cluster) and each gets a "did you mean" hint. :func:`validate_input` reports every problem at
once, each with its key path (``view.lookbak``, ``execution.cluster.queu``).
"""

from __future__ import annotations

import contextlib
import difflib
import re
import types
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
    field_validator,
)

from shardload.errors import ConfigError
from shardload.formats.registry import FORMAT_NAMES, REGISTRY

DEFAULT_TARGET_CHUNK_BYTES_TEXT = "16MiB"
FORMATS = FORMAT_NAMES
if TYPE_CHECKING:
    FormatName = str
else:  # the registry's names: the JSON schema's enum
    FormatName = Literal[FORMAT_NAMES]
COMPRESSION_NAMES = ("none", "zstd", "lz4")
VIEW_NAMES = ("flat", "graph", "window", "function")
SCHEDULERS = ("auto", "threads", "processes", "distributed", "jobqueue", "sync")
NUMERIC_DTYPES = (
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)
#: keys people write that are not (or no longer) keys, with what to write instead
HINTS = {
    "view_options": "put view options in the view mapping, e.g. view: {name: window, lookback: 2}",
    "options": "put view options in the view mapping itself, e.g. view: {name: window, lookback: 2}",
    "env_extra": "deprecated in dask-jobqueue: use job_script_prologue",
    "job_extra": "deprecated in dask-jobqueue: use job_extra_directives",
    "extra": "deprecated in dask-jobqueue: use worker_extra_args",
    "header_skip": "deprecated in dask-jobqueue: use job_directives_skip",
    "n_workers": "use jobs (the number of batch jobs)",
}


class ConfigValidationError(ConfigError):
    """A config has one or more problems; ``problems`` lists ``(key path, message)``."""

    def __init__(self, where: str, problems: list[tuple[str, str]]) -> None:
        self.where = where
        self.problems = problems
        n = len(problems)
        head = f"{where}: {n} problem{'s' if n > 1 else ''}"
        super().__init__(head + "".join(f"\n  {p or '(top)'}: {m}" for p, m in problems))


# -- field types --------------------------------------------------------------------------------
def _listify(v: Any) -> Any:
    """A single string stands for a list of one."""
    return [v] if isinstance(v, str) else v


_STR_OR_LIST = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
StrList = Annotated[list[str], BeforeValidator(_listify), WithJsonSchema(_STR_OR_LIST)]
PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


def parse_size(v: Any) -> int:
    """``16MiB``, ``1GB``, ``4096`` -> bytes; raises ValueError naming what it could not read."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"expected a size such as 16MiB, 1GB or 4096, got {v!r}")
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
    m = re.fullmatch(r"\s*([0-9.]+(?:e[+-]?[0-9]+)?)\s*([kmgt]i?)?b?\s*", v.lower())
    if not m:
        raise ValueError(f"cannot read {v!r} as a size (e.g. 16MiB, 1GB, 4096)")
    try:
        number = float(m.group(1))
    except ValueError:
        raise ValueError(f"cannot read {v!r} as a size (e.g. 16MiB, 1GB, 4096)") from None
    return int(number * (units[m.group(2)] if m.group(2) else 1))


def _size(v: Any) -> int:
    n = parse_size(v)
    if n <= 0:
        raise ValueError(f"expected a positive size, got {v!r}")
    return n


Size = Annotated[
    int,
    BeforeValidator(_size),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 1}, {"type": "string"}]}),
]


def _dtype(v: Any) -> Any:
    if v is None:
        return None
    if not isinstance(v, str):
        raise ValueError(f"expected a dtype name such as float32, got {v!r}")
    try:
        dt = np.dtype(v)
    except TypeError:
        raise ValueError(f"unknown dtype {v!r}{did_you_mean(v, NUMERIC_DTYPES)}") from None
    if dt.kind not in "biuf":
        raise ValueError(f"dtype {v!r} is not numeric; choose one of {', '.join(NUMERIC_DTYPES)}")
    return dt.name


DType = Annotated[
    Union[str, None],  # noqa: UP007 - evaluated at runtime by pydantic on Python 3.10
    BeforeValidator(_dtype),
    WithJsonSchema({"anyOf": [{"enum": list(NUMERIC_DTYPES)}, {"type": "null"}]}),
]


def did_you_mean(word: str, choices: Any) -> str:
    """`` (did you mean 'x'?)`` for the closest choice (case aside first), or ``""``."""
    names = [str(c) for c in choices]
    same = [c for c in names if c.lower() == str(word).lower()]
    close = same or difflib.get_close_matches(str(word), names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class _Model(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


# -- source ---------------------------------------------------------------------------------------
class SourceModel(_Model):
    """Raw files to read (``source:``; a string or a list is shorthand for ``paths``)."""

    paths: StrList = Field(min_length=1, description="files, globs, Zarr folders or URLs")
    kind: Literal["xarray", "radiation"] = "xarray"
    outputs: StrList = Field(default_factory=list, description="radiation: output files")
    engine: str | None = None
    combine: Literal["by_coords", "nested"] = "by_coords"
    concat_dim: str | None = None
    decode_times: bool | None = None
    group: str | None = None
    variables: StrList | None = None
    open_kwargs: dict[str, Any] = Field(default_factory=dict)
    storage_options: dict[str, Any] = Field(default_factory=dict)
    filter: dict[str, Any] = Field(
        default_factory=dict,
        description="GRIB: keep messages with these key values, e.g. {typeOfLevel: isobaricInhPa} "
        "(cfgrib's filter_by_keys)",
    )


# -- views ----------------------------------------------------------------------------------------
class FlatViewModel(_Model):
    """``view: flat``: every array flattened after the sample axis (no options)."""

    name: Literal["flat"]


class GraphViewModel(_Model):
    """``view: graph``: radiation columns as path graphs (no options)."""

    name: Literal["graph"]


class WindowViewModel(_Model):
    """``view: {name: window, ...}``: look-back windows along a time dimension."""

    name: Literal["window"]
    time_dim: str = "time"
    lookback: PositiveInt = 2
    stride: PositiveInt = 1
    horizon: NonNegativeInt = 0
    targets: dict[str, StrList] | None = None
    #: store the series once and cut the windows at load time (docs/design.md)
    at_load: bool = False


def _function(v: Any) -> Any:
    if callable(v):
        return v
    if not isinstance(v, str):
        raise ValueError(f"expected 'package.module:function', got {v!r}")
    mod, sep, attr = v.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected 'package.module:function', got {v!r}")
    return v


class FunctionViewModel(_Model):
    """``view: pkg.mod:fn`` or ``{function: pkg.mod:fn, kwargs: {...}}``: your own function."""

    name: Literal["function"]
    function: Annotated[
        Any, BeforeValidator(_function), WithJsonSchema({"type": "string", "pattern": ".+:.+"})
    ]
    kwargs: dict[str, Any] = Field(default_factory=dict)


ViewModel = Annotated[
    Union[FlatViewModel, GraphViewModel, WindowViewModel, FunctionViewModel],  # noqa: UP007
    Field(discriminator="name"),
]


def _view(v: Any) -> Any:
    """``flat`` -> ``{name: flat}``; ``pkg.mod:fn`` -> a function view; no name + function -> one."""
    if isinstance(v, str):
        return {"name": "function", "function": v} if ":" in v else {"name": v}
    if callable(v):
        return {"name": "function", "function": v}
    if isinstance(v, Mapping):
        d = dict(v)
        name = d.get("name")
        if name is None and "function" in d:
            d["name"] = "function"
        elif isinstance(name, str) and ":" in name:
            d["name"] = "function"
            d.setdefault("function", name)
        return d
    return v


# -- execution ------------------------------------------------------------------------------------
class _JobqueueCommon(_Model):
    """Keys every dask-jobqueue cluster takes (``dask_jobqueue.core.Job`` and
    ``JobQueueCluster``), with shardload's ``jobs``. Passed on as written."""

    jobs: PositiveInt = Field(1, description="batch jobs to start (cluster.scale(jobs=N))")
    cores: PositiveInt | None = None
    memory: str | None = None
    processes: PositiveInt | None = None
    nanny: bool | None = None
    protocol: str | None = None
    interface: str | None = None
    death_timeout: float | None = None
    local_directory: str | None = None
    worker_command: str | None = None
    worker_extra_args: list[str] | None = None
    job_extra_directives: list[str] | None = None
    job_script_prologue: list[str] | None = None
    job_directives_skip: list[str] | None = None
    log_directory: str | None = None
    shebang: str | None = None
    python: str | None = None
    job_name: str | None = None
    name: str | None = None
    config_name: str | None = None
    shared_temp_directory: str | None = None
    dashboard_address: str | None = None
    host: str | None = None
    scheduler_options: dict[str, Any] | None = None
    silence_logs: str | None = None


class _Batch(_JobqueueCommon):
    queue: str | None = None
    project: str | None = None
    walltime: str | None = None

    @field_validator("walltime", mode="before")
    @classmethod
    def _clock(cls, v: Any) -> Any:
        if isinstance(v, int) and not isinstance(v, bool):
            h, rest = divmod(v, 3600)
            raise ValueError(
                f"YAML read an unquoted time as the number {v} (base 60); quote it: "
                f"walltime: '{h:02d}:{rest // 60:02d}:{rest % 60:02d}'"
            )
        return v


class SLURMClusterModel(_Batch):
    kind: Literal["slurm"]
    account: str | None = None
    job_cpu: PositiveInt | None = None
    job_mem: str | None = None


class PBSClusterModel(_Batch):
    kind: Literal["pbs"]
    account: str | None = None
    resource_spec: str | None = None


class LSFClusterModel(_Batch):
    kind: Literal["lsf"]
    ncpus: PositiveInt | None = None
    mem: PositiveInt | None = None
    lsf_units: str | None = None
    use_stdin: bool | None = None


class SGEClusterModel(_Batch):
    kind: Literal["sge"]
    resource_spec: str | None = None


class OARClusterModel(_Batch):
    kind: Literal["oar"]
    resource_spec: str | None = None
    memory_per_core_property_name: str | None = None


class MoabClusterModel(_Batch):
    kind: Literal["moab"]
    account: str | None = None
    resource_spec: str | None = None


class HTCondorClusterModel(_JobqueueCommon):
    kind: Literal["htcondor"]
    disk: str | None = None
    submit_command_extra: list[str] | None = None
    cancel_command_extra: list[str] | None = None


ClusterModel = Annotated[
    Union[  # noqa: UP007
        SLURMClusterModel,
        PBSClusterModel,
        LSFClusterModel,
        SGEClusterModel,
        OARClusterModel,
        MoabClusterModel,
        HTCondorClusterModel,
    ],
    Field(discriminator="kind"),
]
#: cluster kind -> (dask_jobqueue class, its model)
CLUSTER_KINDS: dict[str, tuple[str, type[_JobqueueCommon]]] = {
    "slurm": ("SLURMCluster", SLURMClusterModel),
    "pbs": ("PBSCluster", PBSClusterModel),
    "lsf": ("LSFCluster", LSFClusterModel),
    "sge": ("SGECluster", SGEClusterModel),
    "oar": ("OARCluster", OARClusterModel),
    "moab": ("MoabCluster", MoabClusterModel),
    "htcondor": ("HTCondorCluster", HTCondorClusterModel),
}


class ExecutionModel(_Model):
    """How write tasks run (``execution:``; a string is shorthand for ``scheduler``)."""

    #: auto: the process's active distributed.Client if there is one, else threads
    scheduler: Literal["auto", "threads", "processes", "distributed", "jobqueue", "sync"] = "auto"
    num_workers: PositiveInt | None = None
    threads_per_worker: PositiveInt = 1
    address: str | None = None
    cluster: ClusterModel | None = None
    #: jobqueue: seconds to wait for the batch jobs' workers, then an error saying what the
    #: batch system reports (never a hang)
    timeout_s: Annotated[float, Field(gt=0)] = 300.0


def _execution(v: Any) -> Any:
    return {"scheduler": v} if isinstance(v, str) else v


def _source(v: Any) -> Any:
    return {"paths": v} if isinstance(v, (str, list)) else v


def _splits(v: Any) -> Any:
    return {} if v is None else v


# -- the whole config -----------------------------------------------------------------------------
class PrepareModel(_Model):
    """A prepare config as written in YAML. docs/config.md describes every key."""

    source: Annotated[
        SourceModel,
        BeforeValidator(_source),
    ]
    out: str = Field(description="the store folder to write (as OUT.partial, then renamed)")
    sample_dims: StrList = Field(default_factory=list)
    view: Annotated[ViewModel, BeforeValidator(_view)] = Field(
        default_factory=lambda: FlatViewModel(name="flat")
    )
    arrays: dict[str, StrList] = Field(default_factory=dict)
    dtype: DType = None
    chunk_rows: PositiveInt | None = None
    target_chunk_bytes: Size = Field(2**24, description="e.g. 16MiB, 1GB or 4096 (bytes)")
    format: FormatName = "zarr"
    compression: Literal["none", "zstd", "lz4"] | None = Field(
        None, description="default: lz4, none for npy"
    )
    compression_level: Annotated[int, Field(ge=0, le=9)] | None = None
    shard_chunks: PositiveInt | None = None
    splits: Annotated[dict[str, Annotated[float, Field(ge=0, le=1)]], BeforeValidator(_splits)] = (
        Field(default_factory=lambda: {"train": 0.8, "val": 0.1, "test": 0.1})
    )
    split_seed: NonNegativeInt = 0
    split_shuffle: bool = True
    nan: Literal["warn", "fail", "ignore"] = "warn"
    overwrite: bool = False
    execution: Annotated[ExecutionModel, BeforeValidator(_execution)] = Field(
        default_factory=ExecutionModel
    )

    @field_validator("splits")
    @classmethod
    def _splits_sum(cls, v: dict[str, float]) -> dict[str, float]:
        total = sum(v.values())
        if v and not 0 < total <= 1 + 1e-9:
            raise ValueError(f"fractions must sum to a value in (0, 1], got {total:g}")
        return v


def _compression_problem(fmt: str, compression: str) -> str:
    allowed = REGISTRY[fmt].compressions
    if allowed == ("none",):
        return f"the {fmt} format stores raw arrays: use 'none', not {compression!r}"
    return f"the {fmt} format takes {list(allowed)}, not {compression!r}"


def cross_checks(model: PrepareModel, skip: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """Rules that tie keys together. A rule that reads a top-level key in ``skip`` (a key
    that failed on its own) is not run, so it never reports a consequence of that failure."""
    problems: list[tuple[str, str]] = []

    def rule(*keys: str) -> bool:
        return not skip.intersection(keys)

    view, ex = model.view, model.execution
    entry = REGISTRY[model.format] if rule("format") else None
    if rule("shard_chunks") and entry and model.shard_chunks is not None and not entry.shards:
        sharded = " / ".join(e.name for e in REGISTRY.values() if e.shards)
        problems.append(
            ("shard_chunks", f"only the {sharded} format has shards (format is {model.format!r})")
        )
    if (
        rule("compression")
        and entry
        and model.compression is not None
        and model.compression not in entry.compressions
    ):
        problems.append(("compression", _compression_problem(model.format, model.compression)))
    if (
        rule("compression", "compression_level")
        and model.compression == "none"
        and model.compression_level is not None
    ):
        problems.append(("compression_level", "has no effect with compression: none"))
    if rule("view", "arrays") and view.name in ("flat", "window") and not model.arrays:
        problems.append(
            (
                "arrays",
                f"the {view.name!r} view needs at least one array, e.g. arrays: {{x: [t, z]}}",
            )
        )
    if rule("view", "sample_dims") and view.name == "flat" and not model.sample_dims:
        problems.append(("sample_dims", "the flat view needs at least one sample dimension"))
    if rule("view") and isinstance(view, FunctionViewModel) and isinstance(view.function, str):
        from shardload.util.imports import import_function

        try:
            import_function(view.function, "view function")
        except ConfigError as exc:
            problems.append(("view.function", str(exc)))
    if rule("execution"):
        if ex.address is not None and ex.scheduler != "distributed":
            problems.append(("execution.address", "only used with scheduler: distributed"))
        if ex.cluster is not None and ex.scheduler != "jobqueue":
            problems.append(("execution.cluster", "only used with scheduler: jobqueue"))
        if ex.scheduler == "jobqueue" and ex.cluster is None:
            problems.append(
                (
                    "execution.cluster",
                    "scheduler: jobqueue needs a cluster, e.g. {kind: slurm, jobs: 4}",
                )
            )
    return problems


def validate_input(raw: Any, *, where: str = "config") -> PrepareModel:
    """Validate a raw config (as loaded from YAML); raise one error listing every problem:
    those of single keys, and the rules between keys whose inputs are valid."""
    if not isinstance(raw, Mapping):
        raise ConfigValidationError(
            where, [("", f"the config must be a mapping of keys, got {type(raw).__name__}")]
        )
    try:
        model = PrepareModel.model_validate(dict(raw))
    except ValidationError as exc:
        errors = exc.errors()
        problems = [_describe(e, raw) for e in errors]
        bad = frozenset(str(e["loc"][0]) for e in errors if e["loc"])
        rest = {k: v for k, v in raw.items() if k not in bad and k in PrepareModel.model_fields}
        rest.setdefault("source", {"paths": ["-"]})  # placeholders: no rule reads them
        rest.setdefault("out", "-")
        with contextlib.suppress(ValidationError):
            problems += cross_checks(PrepareModel.model_validate(rest), bad)
        raise ConfigValidationError(where, problems) from None
    problems = cross_checks(model)
    if problems:
        raise ConfigValidationError(where, problems)
    return model


def validate_execution(raw: Any, *, where: str = "config") -> ExecutionModel:
    """Validate an ``execution:`` value on its own (for configs other than prepare's, e.g.
    ``shardload compute``): the same models, hints and cross-key rules, key paths under
    ``execution.``."""
    placeholder = {"source": {"paths": ["-"]}, "out": "-", "execution": raw}
    try:
        model = PrepareModel.model_validate(placeholder)
    except ValidationError as exc:
        raise ConfigValidationError(
            where, [_describe(e, placeholder) for e in exc.errors()]
        ) from None
    others = frozenset(PrepareModel.model_fields) - {"execution"}
    problems = cross_checks(model, others)
    if problems:
        raise ConfigValidationError(where, problems)
    return model.execution


def config_schema() -> dict[str, Any]:
    """JSON schema of the prepare config, for editors (YAML language servers)."""
    schema = PrepareModel.model_json_schema(mode="validation")
    props = schema["properties"]
    src_ref = props["source"]
    props["source"] = {"anyOf": [src_ref, *_STR_OR_LIST["anyOf"]], "description": "raw files"}
    view = props["view"]
    props["view"] = {
        "anyOf": [{"type": "string", "description": "flat | graph | window | pkg.mod:fn"}, view],
    }
    ex = props["execution"]
    props["execution"] = {"anyOf": [{"enum": list(SCHEDULERS)}, ex]}
    schema["title"] = "shardload prepare config"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema


# -- error messages -------------------------------------------------------------------------------
def _unwrap(t: Any) -> Any:
    while typing.get_origin(t) is Annotated:
        t = typing.get_args(t)[0]
    if typing.get_origin(t) in (Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        args = [_unwrap(a) for a in args]
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        if len(args) == 1:
            return args[0]
        if models and len(models) == len(args):
            return tuple(models)  # a tagged union
        if models:
            return models[0] if len(models) == 1 else tuple(models)
    return t


def _tag_of(model: type[BaseModel]) -> str | None:
    for key in ("name", "kind"):
        f = model.model_fields.get(key)
        if f is not None and typing.get_origin(f.annotation) is Literal:
            return str(typing.get_args(f.annotation)[0])
    return None


def _walk(loc: tuple[Any, ...]) -> tuple[str, type[BaseModel] | None]:
    """The key path to show for a pydantic ``loc`` (union tags removed) and the model that
    holds the last key (to list its known keys)."""
    t: Any = PrepareModel
    shown: list[str] = []
    holder: type[BaseModel] | None = None
    for part in loc:
        t = _unwrap(t)
        if isinstance(t, tuple):  # a tagged union: the loc names the chosen member's tag
            chosen = [m for m in t if _tag_of(m) == part]
            if chosen:
                t = chosen[0]
                continue
            t = None
        if isinstance(t, type) and issubclass(t, BaseModel):
            holder = t
            f = t.model_fields.get(str(part))
            t = f.annotation if f is not None else None
            shown.append(str(part))
            continue
        holder = None
        origin = typing.get_origin(t)
        if origin is dict:
            t = typing.get_args(t)[1]
            shown.append(str(part))
        elif origin is list:
            t = typing.get_args(t)[0]
            if shown:
                shown[-1] += f"[{part}]"
            else:
                shown.append(f"[{part}]")
        else:
            if isinstance(part, int) and shown:
                shown[-1] += f"[{part}]"
            elif part not in ("function-after", "function-before", "function-wrap"):
                shown.append(str(part))
            t = None
    return ".".join(shown), holder


_SHORTHAND_WHAT = {
    "source": "a path, a list of paths or a mapping",
    "view": "a view name (flat, graph, window, package.module:function) or a mapping",
    "execution": "a scheduler name or a mapping",
}


def _got(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:77] + "..."


def _describe(e: Mapping[str, Any], raw: Mapping[str, Any]) -> tuple[str, str]:
    loc = tuple(e["loc"])
    path, holder = _walk(loc)
    kind, value, ctx = e["type"], e.get("input"), e.get("ctx") or {}
    if kind == "extra_forbidden":
        key = str(loc[-1])
        known = sorted(holder.model_fields) if holder is not None else []
        if holder in (FlatViewModel, GraphViewModel):
            view = _tag_of(holder)
            return path, f"unknown key: the {view} view takes no options (only name: {view})"
        hint = f" ({HINTS[key]})" if key in HINTS else did_you_mean(key, known)
        return path, f"unknown key{hint}; known keys: {', '.join(known)}"
    if kind in ("union_tag_invalid", "union_tag_not_found"):
        disc = str(ctx.get("discriminator", "")).strip("'")
        tags = re.findall(r"'([^']*)'", str(ctx.get("expected_tags", "")))
        if not tags:
            tags = list(VIEW_NAMES) if disc == "name" else list(CLUSTER_KINDS)
        key = f"{path}.{disc}" if path else disc
        extra = " or 'package.module:function'" if disc == "name" else ""
        if kind == "union_tag_not_found":
            return key, f"missing; choose one of {', '.join(tags)}{extra}"
        tag = ctx.get("tag")
        return (
            key,
            f"unknown {tag!r}{did_you_mean(str(tag), tags)}; choose one of {', '.join(tags)}{extra}",
        )
    if kind == "missing":
        return path, "required"
    if kind == "literal_error":
        choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
        hint = did_you_mean(value, choices) if isinstance(value, str) else ""
        return path, f"unknown value {_got(value)}{hint}; choose one of {', '.join(choices)}"
    if kind == "bool_type":
        if isinstance(value, str):
            return path, (
                f"expected true or false, got the string {value!r} "
                "(quoted in YAML? write true or false without quotes)"
            )
        return path, f"expected true or false, got {_got(value)}"
    if kind in ("int_type", "int_parsing", "int_from_float"):
        return path, f"expected an integer, got {_got(value)}"
    if kind in ("float_type", "float_parsing"):
        return path, f"expected a number, got {_got(value)}"
    if kind == "string_type":
        return path, f"expected a string, got {_got(value)}"
    if kind in ("list_type", "tuple_type"):
        return path, f"expected a list, got {_got(value)}"
    if kind in ("dict_type", "model_type", "model_attributes_type"):
        what = _SHORTHAND_WHAT.get(path, "a mapping of keys")
        return path, f"expected {what}, got {_got(value)}"
    if kind == "value_error":
        return path, str(e["msg"]).removeprefix("Value error, ")
    msg = str(e["msg"])
    return path, f"{msg[:1].lower()}{msg[1:]}, got {_got(value)}"
