"""Stores in S3, against a real S3-protocol server: moto's server mode on 127.0.0.1, started by
these tests (one process for the session, a fresh bucket per test).

``prepare`` writing to ``s3://`` with the guarantees of a local store (the manifest last, a lock
by conditional put, a killed run resumes, a second writer refused), and every reader from
``s3://``: open_store, iter_batches, the torch datasets, verify, copy and stage.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import shardload
from conftest import make_dataset
from shardload.errors import (
    ConfigError,
)

pytestmark = pytest.mark.integration

SRC = str(Path(__file__).resolve().parents[2] / "src")
#: what the moto server accepts (it checks no signature); the tests pass them explicitly
KEY, SECRET = "shardload-test-key", "shardload-test-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a moto S3 server run for this session, stopped at the end."""
    try:
        import moto.server  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc}); pip install -e '.[dev]'")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"{endpoint}/moto-api/", timeout=2).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the moto server did not start on {endpoint}")
                time.sleep(0.2)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture()
def s3_env(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """No AWS credentials in the environment (tests pass them), a private SHARDLOAD_HOME
    (where prepare stages a store before uploading it) and a fresh bucket."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("SHARDLOAD_HOME", str(tmp_path / "home"))
    options = {"key": KEY, "secret": SECRET, "endpoint_url": s3_endpoint}
    bucket = f"bkt-{uuid.uuid4().hex[:12]}"
    _fs(options).mkdir(bucket)
    return {"options": options, "bucket": bucket, "endpoint": s3_endpoint}


def _fs(options: dict[str, Any]) -> Any:
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True, **options)


def _config(tmp_path: Path, out: str, **extra: Any) -> dict[str, Any]:
    src = tmp_path / "src.nc"
    if not src.exists():
        make_dataset(120, seed=3).to_netcdf(src)
    return {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "arrays": {"x": ["a", "b", "c"], "y": ["b"]},
        "chunk_rows": 10,
        "out": out,
        **extra,
    }


def _values(store: Any) -> dict[str, np.ndarray]:
    return {name: store.read(name) for name in sorted(store.arrays)}


def _assert_same(a: Any, b: Any) -> None:
    va, vb = _values(a), _values(b)
    assert sorted(va) == sorted(vb)
    for name in va:
        np.testing.assert_array_equal(va[name], vb[name], err_msg=name)


# -- prepare to s3:// ---------------------------------------------------------------------------
def test_prepare_to_s3_writes_the_bucket_not_a_local_folder(s3_env, tmp_path, monkeypatch):
    """Before: ``out: s3://b/store`` wrote the local folder ``s3:/b/store`` and said it wrote
    the store. Now the objects are in the bucket, the manifest among them, nothing local."""
    monkeypatch.chdir(tmp_path)
    url = f"s3://{s3_env['bucket']}/stores/small"
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    store = shardload.prepare(cfg, progress=False)
    assert not (tmp_path / "s3:").exists()
    fs = _fs(s3_env["options"])
    keys = {p.split("/stores/small/", 1)[1] for p in fs.find(f"{s3_env['bucket']}/stores/small")}
    assert "shardload.json" in keys and "checksums.npz" in keys
    assert not [k for k in keys if k.startswith("_progress")], keys
    assert not fs.exists(f"{s3_env['bucket']}/stores/small.partial.lock")
    assert not any((tmp_path / "home" / "uploads").glob("*/*")), "the staging copy is removed"
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local")), progress=False)
    remote = shardload.open_store(url, storage_options=s3_env["options"])
    assert store.url == url
    _assert_same(remote, local)
    assert remote.manifest.stats["x"].mean.tolist() == local.manifest.stats["x"].mean.tolist()
    text = fs.cat_file(f"{s3_env['bucket']}/stores/small/shardload.json").decode()
    assert SECRET not in text and KEY not in text  # credentials never reach the provenance


def test_prepare_refuses_urls_it_cannot_write(tmp_path):
    with pytest.raises(ConfigError, match=r"out: http://host/store: prepare writes to"):
        shardload.prepare(_config(tmp_path, "http://host/store"), progress=False)
    with pytest.raises(ConfigError, match=r"out: s3://bucket: name a prefix"):
        shardload.prepare(_config(tmp_path, "s3://bucket"), progress=False)


def test_prepare_and_read_with_credentials_from_the_environment(s3_env, tmp_path, monkeypatch):
    """AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_ENDPOINT_URL, no storage_options: the
    store is in the bucket (before the fix: a local folder 's3:' and a success message)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_env["endpoint"])
    url = f"s3://{s3_env['bucket']}/store"
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump(_config(tmp_path, url)))
    res = subprocess.run(
        [sys.executable, "-m", "shardload", "prepare", str(conf), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": SRC},
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (tmp_path / "s3:").exists(), "prepare wrote a local folder named s3:"
    assert _fs(s3_env["options"]).exists(f"{s3_env['bucket']}/store/shardload.json")
    remote = shardload.open_store(url)  # credentials and endpoint from the environment
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local")), progress=False)
    _assert_same(remote, local)
