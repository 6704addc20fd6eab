"""docs/moving.md, "From the storage machine to a notebook", run as written: prepare a window
store, serve it with a token over TLS (a self-signed certificate the block makes with the
openssl CLI), open the URL from a "notebook" (a fresh Python process) with the token, look at
it as xarray, read a batch, and train the LSTM example on it by URL.

The blocks carry ``not-run`` marks for tests/test_docs.py (a server in the foreground, two
machines); here each runs in order, with ``/data/stores`` a temporary folder, the host
``storage.example.org`` the name ``localhost`` (the certificate is made for it) and port 8443 a
free port (the server's first line says which), ``HOME`` a temporary folder.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from test_docs import parse_blocks

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]
REPO = Path(__file__).resolve().parents[1]
SECTION = "## From the storage machine to a notebook"


def story_blocks() -> list[str]:
    doc = REPO / "docs" / "moving.md"
    text = doc.read_text()
    start = text.index(SECTION)
    end = text.index("\n## ", start + len(SECTION))
    first, last = text.count("\n", 0, start) + 1, text.count("\n", 0, end) + 1
    return [b.code for b in parse_blocks(doc) if first <= b.line <= last]


def test_the_story_has_its_four_blocks() -> None:
    blocks = story_blocks()
    assert len(blocks) == 4
    assert "shardload serve" in blocks[1] and "--token-file" in blocks[1]
    assert "--tls-cert" in blocks[1] and "shardload train lstm https://" in blocks[3]


def test_storage_machine_to_notebook_story(tmp_path: Path) -> None:
    pytest.importorskip("lightning")
    prepare, serve, notebook, train = story_blocks()
    stores, home, nb, bin_dir = (tmp_path / d for d in ("stores", "home", "nb", "bin"))
    for d in (stores, home, nb, bin_dir):
        d.mkdir()
    for name, line in (
        ("shardload", f'exec "{sys.executable}" -m shardload "$@"'),
        ("python", f'exec "{sys.executable}" "$@"'),
    ):
        (bin_dir / name).write_text(f"#!/bin/sh\n{line}\n")
        (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLOAD_")}
    env.update(
        HOME=str(home),
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        PYTHONPATH=str(REPO / "src"),
        SHARDLOAD_LOG="off",
        MPLBACKEND="Agg",
    )

    def here(code: str, port: int | None = None) -> str:
        code = code.replace("/data/stores", str(stores)).replace("storage.example.org", "localhost")
        code = code.replace("src/shardload/configs/", f"{REPO}/src/shardload/configs/")
        code = code.replace("--host 0.0.0.0", "--host 127.0.0.1").replace("--port 8443", "--port 0")
        return code if port is None else code.replace(":8443", f":{port}")

    def run(code: str, lang: str = "bash") -> str:
        cmd = ["bash", "-euo", "pipefail", "-c", code] if lang == "bash" else [sys.executable]
        res = subprocess.run(
            cmd, input=None if lang == "bash" else code, cwd=nb, env=env,
            capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        assert res.returncode == 0, f"{code}\n--- stdout\n{res.stdout}\n--- stderr\n{res.stderr}"
        return res.stdout

    run(here(prepare))
    assert (stores / "era5-window" / "shardload.json").is_file()
    server = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", here(serve)], cwd=nb, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        m = re.search(r"at https://127\.0\.0\.1:(\d+)/ \((\d+) stores, 1 token\(s\)\)", line)
        assert m, line + server.stderr.read() if server.poll() is not None else line
        port = int(m.group(1))
        out = run(here(notebook, port), "python")
        assert "windows" in out and "<xarray.Dataset>" in out and "'x': (256," in out, out
        run(here(train, port))
        metrics = nb / "lstm-by-url" / "metrics.json"
        assert metrics.is_file() and "val_loss" in metrics.read_text()
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        _, err = server.communicate(timeout=30)
    token = (home / ".shardload-token").read_text().strip()
    assert "Traceback" not in err and token not in err
