"""The workspace: a log per command under ``$SHARDLOAD_HOME/logs``, the demo's raw data rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _cli(home: Path, *args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {
        **os.environ,
        "SHARDLOAD_HOME": str(home),
        "PYTHONPATH": str(REPO / "src"),
        **(env_extra or {}),
    }
    return subprocess.run(
        [sys.executable, "-m", "shardload", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "rc"),
    [(("config-schema",), 0), (("inspect", "/nonexistent/store"), 2), (("verify", "/nope"), 2)],
)
def test_every_command_writes_a_log_and_says_where(tmp_path, args, rc):
    res = _cli(tmp_path, *args)
    assert res.returncode == rc, res.stderr
    logs = list((tmp_path / "logs").glob(f"{args[0]}-*.log"))
    assert len(logs) == 1, logs
    assert f"log in {logs[0]}" in res.stderr
    text = logs[0].read_text()
    assert f"shardload {' '.join(args)}" in text and f"exit status {rc}" in text
    if rc:
        assert "error" in text.lower() and "/n" in text  # the error, with the path it names


def test_log_keeps_info_with_quiet_console_and_can_be_turned_off(tmp_path):
    res = _cli(tmp_path, "-q", "config-schema")
    assert res.returncode == 0 and "log in" not in res.stderr  # -q: nothing said on success
    assert len(list((tmp_path / "logs").glob("config-schema-*.log"))) == 1
    off = _cli(tmp_path / "off", "config-schema", env_extra={"SHARDLOAD_LOG": "off"})
    assert off.returncode == 0 and not (tmp_path / "off" / "logs").exists()


def test_demo_never_deletes_raw_files_it_did_not_write(tmp_path):
    from shardload.cli.demo import SAMPLE_MARKER, sample_files

    calls = []

    def write(raw, *, columns, timesteps, patches, seed, reuse):
        raw.mkdir(parents=True, exist_ok=True)
        assert reuse  # the demo keeps its own files where up to date (their stamp)
        out = [raw / f"rad_{columns}_{p}.nc" for p in patches]
        if all(f.exists() for f in out):
            return out
        calls.append(columns)
        for f in out:
            f.write_text("sample")
        return out

    raw = tmp_path / "raw"
    files, what = sample_files(raw, {"columns": 8, "patches": 2, "seed": 0}, write)
    assert what == "written" and len(files) == 2 and (raw / SAMPLE_MARKER).exists()
    files, what = sample_files(raw, {"columns": 8, "patches": 2, "seed": 0}, write)
    assert what.startswith("reused") and calls == [8]
    user = raw / "my_own_file.nc"
    user.write_text("precious")
    files, _ = sample_files(raw, {"columns": 16, "patches": 1, "seed": 0}, write)
    # the demo's own files of other parameters are gone; the user's file stays, untouched,
    # and is what the demo uses (it writes nothing next to files it did not write)
    assert user.read_text() == "precious" and files == [user] and calls == [8]
    assert not list(raw.glob("rad_8_*"))


@pytest.mark.parametrize("splits", [{"train": 0.8, "val": 0.2}, {"train": 0.5, "val": 0.5}])
def test_the_split_is_written_as_metadata_json_beside_the_data(tmp_path, splits):
    import json

    from _stores import make_store

    s = make_store(tmp_path, n=40, chunk_rows=40 if splits["val"] == 0.5 else 4, splits=splits)
    meta = json.loads((Path(s.url) / "metadata.json").read_text())
    m = s.manifest
    assert meta["samples"] == len(s) and meta["fractions"] == splits
    for name in splits:
        got = meta["splits"][name]
        assert got["chunks"] == list(m.splits[name]) and got["rows"] == m.split_num_rows(name)
        assert got["row_range"] == (list(m.split_rows[name]) if name in m.split_rows else None)
    assert (meta["splits"]["val"]["row_range"] is None) == (splits["val"] == 0.2)


def test_the_demo_replaces_an_earlier_default_config_but_never_yours(tmp_path):
    """A workspace's config.yaml from an earlier shardload's demo (16 MiB chunks: an unmixed
    store) gives way to today's default; an edited one is kept (issue #25)."""
    import hashlib
    from importlib import resources

    from shardload.cli.demo import EARLIER_DEFAULT_CONFIGS, default_config

    shipped = resources.files("shardload.configs").joinpath("radiation-flat.yaml").read_text()
    assert hashlib.sha256(shipped.encode()).hexdigest() not in EARLIER_DEFAULT_CONFIGS
    config = tmp_path / "config.yaml"
    assert default_config(config).startswith("wrote") and config.read_text() == shipped
    assert "(the default)" in default_config(config)
    # the shipped file before d082ddd: target_chunk_bytes 16MiB, no default layout
    earlier = shipped.replace(
        "compression: lz4                     # no chunk_rows / target_chunk_bytes: the default layout\n"
        "                                     # (small inner chunks in 64 MiB shards: mixes like a uniform shuffle)\n",
        "compression: lz4\n",
    ).replace("dtype: float32\n", "dtype: float32\ntarget_chunk_bytes: 16MiB\n")
    config.write_text(earlier)
    assert hashlib.sha256(earlier.encode()).hexdigest() in EARLIER_DEFAULT_CONFIGS
    assert default_config(config).startswith("replaced") and config.read_text() == shipped
    config.write_text(shipped + "# mine\n")
    assert "yours: kept" in default_config(config) and config.read_text().endswith("# mine\n")
