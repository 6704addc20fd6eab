"""Every example in shardload's docstrings runs and prints what it shows (``doctest``): a
docstring example is documentation, and one that drifted from the code misleads (the
``plan_runs`` example did, unnoticed, until this test)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import shardload

MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(shardload.__path__, "shardload.")
    if not m.name.rsplit(".", 1)[-1].startswith("_")  # compiled or private entry points
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
    if not _examples(name):
        pytest.skip("no examples")
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


def test_the_modules_are_found() -> None:
    assert "shardload.formats.zarr.shard_fetch" in MODULES and len(MODULES) > 100
