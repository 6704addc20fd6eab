"""The package keeps its layers (docs/design.md, "Layers"): the import-linter contracts in
pyproject.toml (read-side layers, no xarray/dask/pandas below prep, no import cycles) hold."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, SRC


def _lint_imports() -> str | None:
    exe = Path(sys.executable).with_name("lint-imports")
    return str(exe) if exe.exists() else shutil.which("lint-imports")


@pytest.mark.skipif(_lint_imports() is None, reason="import-linter is not installed (extra 'dev')")
def test_import_contracts_are_kept(tmp_path):
    res = subprocess.run(
        [_lint_imports(), "--no-cache"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"},
    )
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-2000:]
    assert "0 broken" in res.stdout


def _sources() -> list[Path]:
    return sorted((REPO / "src" / "shardload").rglob("*.py"))


def test_modules_stay_small():
    """One concept a module: none over 400 lines (docs/design.md, "Packages and modules")."""
    big = {
        str(p.relative_to(REPO)): n
        for p in _sources()
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert big == {}


def test_few_long_functions():
    """Functions under ~80 lines; the few longer ones are public entry points whose length is
    their numpydoc docstring (iter_batches, open_store, StreamingDataset.__init__)."""
    import ast

    long = []
    for p in _sources():
        for node in ast.walk(ast.parse(p.read_text())):
            is_function = isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_function and node.end_lineno - node.lineno + 1 > 80:
                long.append(f"{p.relative_to(REPO)}:{node.name}")
    assert len(long) <= 5, long
