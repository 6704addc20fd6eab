"""The whole prepare config: its model, the rules that tie keys together, validation with
every problem at once, and the JSON schema for editors."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Field,
    ValidationError,
    field_validator,
)

from shardload.errors import ConfigError
from shardload.formats.registry import REGISTRY
from shardload.prep.config_models.dates import ALL_ROWS, DatesModel, dates_shorthand
from shardload.prep.config_models.execution import ExecutionModel, execution_shorthand
from shardload.prep.config_models.fields import (
    SCHEDULERS,
    STR_OR_LIST,
    ConfigValidationError,
    DType,
    FormatName,
    NonNegativeInt,
    PositiveInt,
    Size,
    StrictModel,
    StrList,
)
from shardload.prep.config_models.messages import describe_error
from shardload.prep.config_models.source import SourceModel, source_shorthand
from shardload.prep.config_models.views import (
    FlatViewModel,
    FunctionViewModel,
    ViewModel,
    WindowViewModel,
    view_shorthand,
)


def _splits(v: Any) -> Any:
    return {} if v is None else v


class PrepareModel(StrictModel):
    """A prepare config as written in YAML. docs/config.md describes every key."""

    source: Annotated[
        SourceModel,
        BeforeValidator(source_shorthand),
    ]
    out: str = Field(description="the store folder to write (as OUT.partial, then renamed)")
    out_storage_options: dict[str, Any] = Field(
        default_factory=dict,
        description="for out: s3://...: passed to s3fs (credentials, endpoint)",
    )
    sample_dims: StrList = Field(default_factory=list)
    view: Annotated[ViewModel, BeforeValidator(view_shorthand)] = Field(
        default_factory=lambda: FlatViewModel(name="flat")
    )
    arrays: dict[str, StrList] = Field(default_factory=dict)
    dtype: DType = None
    chunk_rows: PositiveInt | None = None
    target_chunk_bytes: Size = Field(2**24, description="e.g. 16MiB, 1GB or 4096 (bytes)")
    format: FormatName = "zarr"
    compression: Literal["auto", "none", "zstd", "lz4"] | None = Field(
        None,
        description="default: auto (lz4 for each array its first chunks shrink by 10% or more, "
        "else none), none for npy",
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
    execution: Annotated[ExecutionModel, BeforeValidator(execution_shorthand)] = Field(
        default_factory=ExecutionModel
    )
    #: a dated store: None (not given) when the sample axis is one regular time coordinate,
    #: ``false`` never, a mapping always (an error where it cannot be)
    dates: Annotated[DatesModel | None, BeforeValidator(dates_shorthand)] = None

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
    if (
        rule("view", "sample_dims")
        and isinstance(view, WindowViewModel)
        and view.time_dim in model.sample_dims
    ):
        problems.append(
            (
                "sample_dims",
                f"{view.time_dim!r} is the window view's time_dim: windows run along it, so it "
                f"cannot also be a sample dimension; remove it from sample_dims "
                f"{list(model.sample_dims)} (or set view.time_dim to another dimension)",
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
    problems += _dates_checks(model, rule)
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


def _dates_checks(model: PrepareModel, rule: Any) -> list[tuple[str, str]]:
    """``dates:`` needs a flat view over one sample dim, and its ``statistics`` a split."""
    dates, problems = model.dates, []
    if dates is None or not dates.enabled or not rule("dates"):
        return []
    if rule("view", "sample_dims") and (model.view.name != "flat" or len(model.sample_dims) != 1):
        problems.append(
            (
                "dates",
                "a dated store is a flat view over one sample dimension, its time (view: flat, "
                f"sample_dims: [time]); this config has view {model.view.name!r} and "
                f"sample_dims {list(model.sample_dims)}",
            )
        )
    splits = sorted(model.splits) or [ALL_ROWS]
    if rule("splits") and dates.statistics not in (None, ALL_ROWS, *splits):
        problems.append(
            (
                "dates.statistics",
                f"{dates.statistics!r} is not a split; choose one of {splits} or {ALL_ROWS!r}",
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
        problems = [describe_error(e, raw, PrepareModel) for e in errors]
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
            where, [describe_error(e, placeholder, PrepareModel) for e in exc.errors()]
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
    props["source"] = {"anyOf": [src_ref, *STR_OR_LIST["anyOf"]], "description": "raw files"}
    view = props["view"]
    props["view"] = {
        "anyOf": [{"type": "string", "description": "flat | graph | window | pkg.mod:fn"}, view],
    }
    ex = props["execution"]
    props["execution"] = {"anyOf": [{"enum": list(SCHEDULERS)}, ex]}
    schema["title"] = "shardload prepare config"
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    return schema
