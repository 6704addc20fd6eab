"""User functions named in configs: ``"package.module:function"`` -> the callable."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from shardload.errors import ConfigError


def import_function(spec: str, where: str) -> Callable[..., Any]:
    """``"package.module:name"`` (``name`` may be dotted) -> the callable, or a ConfigError
    naming ``where`` (the config key that gave it)."""
    if not isinstance(spec, str) or ":" not in spec:
        raise ConfigError(f"{where}: {spec!r}; give 'package.module:function'")
    mod_name, _, attr = spec.partition(":")
    if not mod_name or not attr:
        raise ConfigError(f"{where}: {spec!r}; give 'package.module:function'")
    try:
        module = importlib.import_module(mod_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module {mod_name!r} ({exc})") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{where}: module {mod_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{where}: {spec!r} is not callable")
    return obj  # type: ignore[no-any-return]
