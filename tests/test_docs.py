"""The docs run as written: the README tour and every shell / Python block of docs/*.md.

Each document runs on its own, in a fresh copy of the repository root (the docs speak from
there: ``src/shardload/configs/...``), with ``HOME`` in the temporary folder (for
``~/.shardload``), ``shardload`` and ``python`` on ``PATH`` running the code under test, and
its blocks in order: a ``bash`` block with ``bash -euo pipefail``, a ``python`` block as a
script in a fresh interpreter (so every Python block must stand on its own, as a reader copies
it). A block that cannot run here is marked just above its fence with
``<!-- not-run: reason -->``; the reasons are listed in the test output (``-ra``). Every fence
must name its language, so a shell command cannot hide in an untagged block.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
RUN_LANGS = {"bash": "bash", "sh": "bash", "shell": "bash", "python": "python"}
# languages of blocks that are not commands (configs, output, diagrams)
OTHER_LANGS = {"yaml", "text", "json", "toml"}
# documents whose runnable blocks take more than ~10 s on a 2-core machine
SLOW = {"README.md", "loading.md", "training.md"}
BLOCK_TIMEOUT_S = 300

_FENCE = re.compile(r"^```([\w+-]*)[ \t]*\n(.*?)^```[ \t]*$", re.S | re.M)
_NOT_RUN = re.compile(r"<!--\s*not-run:\s*(.*?)\s*-->\s*$", re.S)


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def parse_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a markdown file, with the ``not-run`` mark just above each."""
    text = path.read_text()
    blocks = []
    for m in _FENCE.finditer(text):
        before = text[: m.start()].rstrip("\n")
        prev = before.rsplit("\n", 1)[-1]
        mark = _NOT_RUN.search(prev)
        blocks.append(
            Block(
                doc=path.name,
                line=text.count("\n", 0, m.start()) + 1,
                lang=m.group(1),
                code=m.group(2),
                not_run=mark.group(1) if mark else None,
            )
        )
    return blocks


def test_parse_blocks_reads_languages_and_marks(tmp_path: Path) -> None:
    md = tmp_path / "x.md"
    md.write_text(
        "intro\n```bash\necho hi\n```\n\n<!-- not-run: needs a cluster -->\n"
        "```python\nimport nope\n```\n```yaml\na: 1\n```\n"
    )
    blocks = parse_blocks(md)
    assert [(b.lang, b.line, b.not_run) for b in blocks] == [
        ("bash", 2, None),
        ("python", 7, "needs a cluster"),
        ("yaml", 10, None),
    ]
    assert blocks[0].code == "echo hi\n"


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_block_names_its_language(doc: Path) -> None:
    problems = []
    for b in parse_blocks(doc):
        if b.lang not in RUN_LANGS and b.lang not in OTHER_LANGS:
            problems.append(
                f"{b.where}: fence language {b.lang!r} (use one of "
                f"{sorted(set(RUN_LANGS) | OTHER_LANGS)})"
            )
        if b.not_run is not None and (b.lang not in RUN_LANGS or not b.not_run):
            problems.append(f"{b.where}: a not-run mark needs a reason and a bash/python block")
    assert not problems, "\n".join(problems)


def _workdir(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    work = tmp_path / "repo"
    shutil.copytree(
        REPO,
        work,
        ignore=shutil.ignore_patterns(
            ".git",
            ".venv",
            ".venv-anemoi",  # make anemoi-venv: 843 MB, no doc uses it
            "__pycache__",
            "*.egg-info",
            ".mypy_cache",
            ".ruff_cache",
            ".pytest_cache",
            ".hypothesis",
        ),
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, line in (
        ("shardload", f'exec "{sys.executable}" -m shardload "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
    ):
        script = bin_dir / name
        script.write_text(f"#!/bin/sh\n{line}\n")
        script.chmod(0o755)
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLOAD_")}
    src = str(work / "src")
    env.update(
        HOME=str(home),
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
        SHARDLOAD_LOG="off",
        MPLBACKEND="Agg",
    )
    return work, env


def _run(block: Block, work: Path, env: dict[str, str], n: int) -> None:
    if RUN_LANGS[block.lang] == "bash":
        cmd = ["bash", "-euo", "pipefail", "-c", block.code]
    else:
        script = work / f".docs-block-{n}.py"
        script.write_text(block.code)
        cmd = [sys.executable, str(script)]
    try:
        res = subprocess.run(
            cmd, cwd=work, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"{block.where}: {block.lang} block ran past {BLOCK_TIMEOUT_S} s\n{e.stderr}")
    if res.returncode != 0:
        pytest.fail(
            f"{block.where}: {block.lang} block exited {res.returncode}\n--- block\n{block.code}"
            f"--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-5000:]}"
        )


@pytest.mark.parametrize(
    "doc",
    [pytest.param(d, marks=[pytest.mark.slow] if d.name in SLOW else []) for d in DOCS],
    ids=lambda p: p.name,
)
def test_doc_runs_as_written(doc: Path, tmp_path: Path) -> None:
    blocks = [b for b in parse_blocks(doc) if b.lang in RUN_LANGS]
    runnable = [b for b in blocks if b.not_run is None]
    if not runnable:
        pytest.skip(f"{doc.name} has no runnable block")
    work, env = _workdir(tmp_path)
    for n, block in enumerate(runnable):
        _run(block, work, env, n)


NOT_RUN = [b for d in DOCS for b in parse_blocks(d) if b.not_run is not None]


@pytest.mark.parametrize("block", NOT_RUN, ids=lambda b: b.where)
def test_not_run_block(block: Block) -> None:
    """One skip per marked block, so the report lists every block the docs test leaves out."""
    pytest.skip(f"not run: {block.not_run}")
