"""Error messages of the prepare config: each pydantic error as ``(key path, message)`` in
the words of the YAML (union tags removed from the path, known keys listed, hints)."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
)

from shardload.prep.config_models.execution import CLUSTER_KINDS
from shardload.prep.config_models.fields import (
    HINTS,
    VIEW_NAMES,
    did_you_mean,
)
from shardload.prep.config_models.views import FlatViewModel, GraphViewModel


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


def _walk(loc: tuple[Any, ...], root: type[BaseModel]) -> tuple[str, type[BaseModel] | None]:
    """The key path to show for a pydantic ``loc`` (union tags removed) and the model that
    holds the last key (to list its known keys)."""
    t: Any = root
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


def describe_error(
    e: Mapping[str, Any], raw: Mapping[str, Any], root: type[BaseModel]
) -> tuple[str, str]:
    """``(key path, message)`` of one pydantic error ``e`` of model ``root``."""
    loc = tuple(e["loc"])
    path, holder = _walk(loc, root)
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
