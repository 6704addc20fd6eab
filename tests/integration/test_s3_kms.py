"""Prepare into a bucket encrypted with SSE-KMS, whose ETags are not the MD5s of the objects'
bytes (as on AWS): every object is still checked after its upload (by reading it back), a
damaged one still stops the publish, and the store reads back equal to a local prepare.

moto's S3 gives every object its MD5 as ETag; this test runs moto's server in this process
(so its models can be changed here) with the ETag of every object stored under SSE-KMS made
an opaque value, the way AWS's is. The bucket's default encryption is set through the S3 API.
"""

from __future__ import annotations

import hashlib
import logging
import re
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.errors import IncompleteStoreError, StoreError

from . import test_s3 as _s3

pytest.importorskip("s3fs")
pytest.importorskip("boto3")

_config, _assert_same = _s3._config, _s3._assert_same

KEY, SECRET = "shardload-kms-key", "shardload-kms-secret"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture()
def kms_bucket(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A bucket with SSE-KMS default encryption on an in-process moto server whose encrypted
    objects' ETags are not MD5s."""
    try:
        from moto.s3.models import FakeKey
        from moto.server import ThreadedMotoServer
    except ImportError as exc:
        pytest.skip(f"moto[server] is not installed ({exc}); pip install -e '.[dev]'")
    import boto3

    md5_etag = FakeKey.etag

    def kms_etag(self: Any) -> str:
        plain = md5_etag.fget(self)
        if self.encryption != "aws:kms":
            return plain
        return '"' + hashlib.sha256(b"kms" + plain.encode()).hexdigest()[:32] + '"'

    monkeypatch.setattr(FakeKey, "etag", property(kms_etag))
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("SHARDLOAD_HOME", str(tmp_path / "home"))
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        client = boto3.client(
            "s3",
            endpoint_url=endpoint,
            aws_access_key_id=KEY,
            aws_secret_access_key=SECRET,
            region_name="us-east-1",
        )
        bucket = f"kms-{uuid.uuid4().hex[:12]}"
        client.create_bucket(Bucket=bucket)
        client.put_bucket_encryption(
            Bucket=bucket,
            ServerSideEncryptionConfiguration={
                "Rules": [
                    {
                        "ApplyServerSideEncryptionByDefault": {
                            "SSEAlgorithm": "aws:kms",
                            "KMSMasterKeyID": "alias/shardload-test",
                        }
                    }
                ]
            },
        )
        client.put_object(Bucket=bucket, Key="probe", Body=b"probe")
        head = client.head_object(Bucket=bucket, Key="probe")
        assert head["ServerSideEncryption"] == "aws:kms"
        assert head["ETag"].strip('"') != hashlib.md5(b"probe").hexdigest()  # as on AWS
        client.delete_object(Bucket=bucket, Key="probe")
        options = {"key": KEY, "secret": SECRET, "endpoint_url": endpoint}
        yield {"options": options, "bucket": bucket}
    finally:
        server.stop()


def test_prepare_into_an_sse_kms_bucket_checks_each_object_by_reading_it_back(
    kms_bucket, tmp_path, caplog
):
    url = f"s3://{kms_bucket['bucket']}/store"
    cfg = _config(tmp_path, url, out_storage_options=kms_bucket["options"])
    with caplog.at_level(logging.WARNING, logger="shardload"):
        store = shardload.prepare(cfg, progress=False)
    warned = [r for r in caplog.records if "not the MD5s" in r.getMessage()]
    assert len(warned) == 1 and url in warned[0].getMessage()
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local")), progress=False)
    _assert_same(store, local)
    _assert_same(shardload.open_store(url, storage_options=kms_bucket["options"]), local)
    batches = list(
        shardload.iter_batches(
            url, storage_options=kms_bucket["options"], batch_size=16, seed=4, split="train"
        )
    )
    want = list(shardload.iter_batches(local, batch_size=16, seed=4, split="train"))
    assert len(batches) == len(want) > 0
    for got, exp in zip(batches, want, strict=True):
        for k in exp:
            np.testing.assert_array_equal(got[k], exp[k])


def test_an_object_damaged_on_its_way_into_an_sse_kms_bucket_stops_the_publish(
    kms_bucket, tmp_path, monkeypatch
):
    import s3fs

    put_file = s3fs.S3FileSystem._put_file

    async def damaging_put(self: Any, lpath: str, rpath: str, **kw: Any) -> None:
        data = Path(lpath).read_bytes()
        if rpath.endswith("x/zarr.json"):
            data = data.replace(b"float", b"fl0at")  # same size, other bytes
        await self._pipe_file(rpath, data)

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", damaging_put)
    url = f"s3://{kms_bucket['bucket']}/store"
    cfg = _config(tmp_path, url, out_storage_options=kms_bucket["options"])
    with pytest.raises(StoreError, match=re.escape(f"object {url}/x/zarr.json differs from")):
        shardload.prepare(cfg, progress=False)
    with pytest.raises(IncompleteStoreError, match=re.escape(url)):
        shardload.open_store(url, storage_options=kms_bucket["options"])
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", put_file)
    store = shardload.prepare(cfg, progress=False)
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local")), progress=False)
    _assert_same(store, local)
