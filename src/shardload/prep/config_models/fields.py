"""Field types, names and the error of the prepare config's models: strict ints, sizes
(``16MiB``), dtypes, lists written as one string, and the "did you mean" hint."""

from __future__ import annotations

import difflib
import re
from typing import TYPE_CHECKING, Annotated, Any, Literal, Union

import numpy as np
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)

from shardload.errors import ConfigError
from shardload.formats.registry import FORMAT_NAMES
from shardload.manifest.core import NUMERIC_DTYPES

DEFAULT_TARGET_CHUNK_BYTES_TEXT = "16MiB"
FORMATS = FORMAT_NAMES
if TYPE_CHECKING:
    FormatName = str
else:  # the registry's names: the JSON schema's enum
    FormatName = Literal[FORMAT_NAMES]
COMPRESSION_NAMES = ("auto", "none", "zstd", "lz4")
VIEW_NAMES = ("flat", "graph", "window", "function")
SCHEDULERS = ("auto", "threads", "processes", "distributed", "jobqueue", "sync")
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


STR_OR_LIST = {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}
StrList = Annotated[list[str], BeforeValidator(_listify), WithJsonSchema(STR_OR_LIST)]
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


class StrictModel(BaseModel):
    """Strict types, unknown keys refused, frozen: the base of every config model."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
