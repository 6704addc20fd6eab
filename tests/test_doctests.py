"""Every example in shardload's docstrings runs and prints what it shows (``doctest``): a
docstring example is documentation, and one that drifted from the code misleads (the
``plan_runs`` example did, unnoticed, until this test)."""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

import shardload

SRC = Path(shardload.__file__).parent


def _has_examples(path: Path) -> bool:
    return ">>> " in path.read_text(encoding="utf-8")


#: the modules whose source holds a docstring example (read as text: nothing imported to list them)
MODULES = sorted(
    "shardload." + ".".join(p.relative_to(SRC).with_suffix("").parts)
    for p in SRC.rglob("*.py")
    if not p.name.startswith("_") and _has_examples(p)
)


def _examples(name: str) -> int:
    try:
        mod = importlib.import_module(name)
    except ImportError as exc:  # an optional dependency this install lacks
        pytest.skip(f"{name} needs {exc.name}")
    finder = doctest.DocTestFinder(exclude_empty=True)
    return sum(len(t.examples) for t in finder.find(mod, name))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name: str) -> None:
    assert _examples(name), f"{name} holds '>>> ' but no docstring example doctest finds"
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_modules_are_found() -> None:
    assert "shardload.formats.zarr.shard_fetch" in MODULES and len(MODULES) > 40
