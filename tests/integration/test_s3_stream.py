"""Prepare to ``s3://`` uploads each block's final files as the block is recorded and removes
the local copies (``prep/remote_stream.py``): local disk holds the blocks in flight, not the
store. Against the moto server of ``test_s3.py``."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import StoreError
from shardload.prep import remote_commit
from shardload.prep.recorder import DurableRecorder
from shardload.prep.remote_stream import LEDGER_NAME, STREAM_BLOCKS, final_files

from . import test_s3 as _s3

_fs, _assert_same = _s3._fs, _s3._assert_same
s3_endpoint, s3_env = _s3.s3_endpoint, _s3.s3_env  # the moto server and a fresh bucket

pytestmark = pytest.mark.integration

ROWS, FEATURES, CHUNK_ROWS = 96 * 512, 32, 512  # 96 blocks of 64 KiB (float32)
WORKERS = 2


def _data_config(tmp_path: Path, out: str, **extra: Any) -> dict[str, Any]:
    src = tmp_path / "wide.nc"
    if not src.exists():
        rng = np.random.default_rng(5)
        x = rng.normal(size=(ROWS, FEATURES)).astype("float32")
        xr.Dataset({"v": (("sample", "feat"), x)}).to_netcdf(src)
    return {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "arrays": {"x": ["v"]},
        "chunk_rows": CHUNK_ROWS,
        "compression": "none",
        "execution": {"scheduler": "threads", "num_workers": WORKERS},
        "out": out,
        **extra,
    }


def _data_bytes(root: Path) -> int:
    """Bytes of the local store's files, progress records left out (small metadata).

    Upload threads remove files while this walks the tree: a file gone between the listing
    and its ``stat`` counts as 0 bytes (it no longer holds disk)."""
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):  # os.walk skips vanished directories
        dirnames[:] = [d for d in dirnames if d != "_progress"]
        for name in filenames:
            try:
                total += os.stat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                continue
    return total


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_local_disk_holds_the_blocks_in_flight_not_the_store(s3_env, tmp_path, monkeypatch, fmt):
    """Before: every block stayed on local disk until the upload after the last one (the
    whole store: 6 MiB here, 1 TB for a 1 TB store). Now: at most the blocks being written,
    waiting to be recorded or being uploaded."""
    uploads = tmp_path / "home" / "uploads"
    peak = [0]
    seen = threading.Event()

    def measure() -> None:
        for root in uploads.glob("*/*.partial"):
            peak[0] = max(peak[0], _data_bytes(root))

    recorded, publish = (
        remote_commit.RemoteCommit.recorded_files,
        remote_commit.RemoteCommit.publish,
    )

    def measured_recorded(self: Any, *a: Any) -> None:
        recorded(self, *a)
        measure()

    def measured_publish(self: Any, files: Any) -> None:
        measure()  # where the whole store used to be local
        seen.set()
        publish(self, files)

    monkeypatch.setattr(remote_commit.RemoteCommit, "recorded_files", measured_recorded)
    monkeypatch.setattr(remote_commit.RemoteCommit, "publish", measured_publish)
    url = f"s3://{s3_env['bucket']}/wide"
    cfg = _data_config(tmp_path, url, out_storage_options=s3_env["options"], format=fmt)
    remote = shardload.prepare(cfg, progress=False)
    assert seen.is_set()
    local = shardload.prepare(_data_config(tmp_path, str(tmp_path / "l"), format=fmt))
    _assert_same(remote, local)
    block_bytes = CHUNK_ROWS * FEATURES * 4
    store_bytes = ROWS * FEATURES * 4
    # tasks in flight (2 per worker), waiting for the recorder, being recorded, being uploaded
    bound = (2 * WORKERS + 8 + 1 + STREAM_BLOCKS) * block_bytes + 256 * 1024  # + headers, json
    print(f"peak local data {peak[0] / 2**20:.2f} MiB of a {store_bytes / 2**20:.1f} MiB store")
    assert 0 < peak[0] <= bound, (peak[0], bound)
    assert peak[0] < store_bytes / 4
    assert not list(uploads.glob("*/*")), "the local folder is removed after publishing"


def test_only_files_final_at_record_time_are_streamed(tmp_path):
    root = tmp_path / "s.partial"
    paths = [
        root / "x/c/3/0",  # a zarr chunk or shard: written by one block
        root / "x/000003.npy",
        root / "_staged/x.000003.npy",  # hdf5's staged block: merged at the end
        root / "_ragged/r/000003.npy",  # zarr's variable-length values: written at the end
        root / "_progress/block-000003.npz",
        tmp_path / "elsewhere",
    ]
    assert sorted(final_files(root, map(str, paths))) == ["x/000003.npy", "x/c/3/0"]


def test_hdf5_streams_nothing_while_writing_and_still_publishes(s3_env, tmp_path, monkeypatch):
    """HDF5 builds its one file from staged blocks after the last one: nothing is final at
    record time, so nothing is put before the publish (the store needs local disk)."""
    puts: list[str] = []
    put = remote_commit.RemoteCommit._put_checked

    def counted(self: Any, rel: str, path: Path) -> str:
        puts.append(rel)
        return put(self, rel, path)

    monkeypatch.setattr(remote_commit.RemoteCommit, "_put_checked", counted)
    sent_while_writing: list[int] = []
    original_close = DurableRecorder.close

    def close(self: Any) -> None:
        original_close(self)
        sent_while_writing.append(len(puts))

    monkeypatch.setattr(DurableRecorder, "close", close)
    url = f"s3://{s3_env['bucket']}/h5"
    cfg = _s3._config(tmp_path, url, out_storage_options=s3_env["options"], format="hdf5")
    remote = shardload.prepare(cfg, progress=False)
    assert sent_while_writing == [0]
    _assert_same(
        remote, shardload.prepare(_s3._config(tmp_path, str(tmp_path / "l"), format="hdf5"))
    )


def test_a_streamed_object_lost_before_publish_is_written_again_by_the_rerun(
    s3_env, tmp_path, monkeypatch
):
    """An object uploaded while writing (its local copy removed) that is gone at publish: an
    error naming it, no manifest; the re-run writes its block again and publishes."""
    url = f"s3://{s3_env['bucket']}/store"
    opts = s3_env["options"]
    fs = _fs(opts)
    upload = remote_commit.RemoteCommit._upload
    victim: list[str] = []

    def lose_one(self: Any) -> None:
        self._streamer.drain()
        rel = sorted(self._streamer.uploaded)[3]
        victim.append(rel)
        fs.rm_file(f"{s3_env['bucket']}/store/{rel}")
        upload(self)

    monkeypatch.setattr(remote_commit.RemoteCommit, "_upload", lose_one)
    cfg = _s3._config(tmp_path, url, out_storage_options=opts)
    with pytest.raises(StoreError) as err:
        shardload.prepare(cfg, progress=False)
    assert f"object {url}/{victim[0]} (and 0 more) is missing or changed" in str(err.value)
    assert "re-run: block(s) [" in str(err.value)
    assert not fs.exists(f"{s3_env['bucket']}/store/shardload.json")
    ledger = next((tmp_path / "home" / "uploads").glob(f"*/store.partial/_progress/{LEDGER_NAME}"))
    assert victim[0] not in {json.loads(line)["rel"] for line in ledger.read_text().splitlines()}
    monkeypatch.setattr(remote_commit.RemoteCommit, "_upload", upload)
    store = shardload.prepare(cfg, progress=False)
    _assert_same(store, shardload.prepare(_s3._config(tmp_path, str(tmp_path / "l"))))


@pytest.mark.slow
def test_killed_while_streaming_the_rerun_sends_no_noted_object_again(
    s3_env, tmp_path, monkeypatch
):
    """kill -9 once some blocks' objects are uploaded, noted and removed locally, while other
    blocks are still written: the prefix is no store; the re-run puts none of the noted
    objects again and publishes a store equal to a clean run's."""

    import yaml

    bucket, opts = s3_env["bucket"], s3_env["options"]
    url = f"s3://{bucket}/store"
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump(_s3._config(tmp_path, url, out_storage_options=opts)))
    proc = _s3._throttled_prepare(tmp_path, conf)
    partial = tmp_path / "home" / "uploads"

    def noted() -> set[str]:
        found = list(partial.glob(f"*/store.partial/_progress/{LEDGER_NAME}"))
        if not found:
            return set()
        lines = found[0].read_text().splitlines()
        return {json.loads(line)["rel"] for line in lines if line.endswith("}")}

    _s3._kill_when(proc, lambda: len(noted()) >= 2 * STREAM_BLOCKS + 1)
    sent_before = noted()
    fs = _fs(opts)
    assert not fs.exists(f"{bucket}/store/shardload.json")
    with pytest.raises(shardload.errors.IncompleteStoreError, match="is not complete"):
        shardload.open_store(url, storage_options=opts)
    for rel in sent_before:  # uploaded and checked
        assert fs.exists(f"{bucket}/store/{rel}")
    # and no longer local, but for a file whose upload slot the kill stopped between its note
    # and its removal: at most one a slot
    local = [rel for rel in sent_before if list(partial.glob(f"*/store.partial/{rel}"))]
    assert len(local) <= STREAM_BLOCKS < len(sent_before) - STREAM_BLOCKS, local
    puts: list[str] = []
    put = remote_commit.RemoteCommit._put_checked

    def counted(self: Any, rel: str, path: Path) -> str:
        puts.append(rel)
        return put(self, rel, path)

    monkeypatch.setattr(remote_commit.RemoteCommit, "_put_checked", counted)
    resumed = shardload.prepare(
        _s3._config(tmp_path, url, out_storage_options=opts), progress=False
    )
    assert puts and not set(puts) & sent_before, sorted(set(puts) & sent_before)
    clean = shardload.prepare(_s3._config(tmp_path, str(tmp_path / "clean")), progress=False)
    _assert_same(resumed, clean)
    keys = sorted(p.split("/store/", 1)[1] for p in fs.find(f"{bucket}/store"))
    assert not [k for k in keys if k.startswith("_progress")], keys
    assert not fs.exists(f"{bucket}/store.partial.lock")
