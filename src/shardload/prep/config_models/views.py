"""``view:``: how the source's variables become samples (flat, graph, window, your function)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BeforeValidator,
    Field,
    WithJsonSchema,
)

from shardload.prep.config_models.fields import (
    NonNegativeInt,
    PositiveInt,
    StrictModel,
    StrList,
)


class FlatViewModel(StrictModel):
    """``view: flat``: every array flattened after the sample axis (no options)."""

    name: Literal["flat"]


class GraphViewModel(StrictModel):
    """``view: graph``: radiation columns as path graphs (no options)."""

    name: Literal["graph"]


class WindowViewModel(StrictModel):
    """``view: {name: window, ...}``: look-back windows along a time dimension."""

    name: Literal["window"]
    time_dim: str = "time"
    lookback: PositiveInt = 2
    stride: PositiveInt = 1
    horizon: NonNegativeInt = 0
    targets: dict[str, StrList] | None = None
    #: store the series once and cut the windows at load time (the default, docs/design.md);
    #: false writes every window (lookback + 1 times the data)
    at_load: bool = True


def _function(v: Any) -> Any:
    if callable(v):
        return v
    if not isinstance(v, str):
        raise ValueError(f"expected 'package.module:function', got {v!r}")
    mod, sep, attr = v.partition(":")
    if not sep or not mod or not attr:
        raise ValueError(f"expected 'package.module:function', got {v!r}")
    return v


class FunctionViewModel(StrictModel):
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


def view_shorthand(v: Any) -> Any:
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
