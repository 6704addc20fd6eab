"""Stores in S3, against a real S3-protocol server: moto's server mode on 127.0.0.1, started by
these tests (one process for the session, a fresh bucket per test).

``prepare`` writing to ``s3://`` with the guarantees of a local store (the manifest last, a lock
by conditional put, a killed run resumes, a second writer refused), and every reader from
``s3://``: open_store, iter_batches, the torch datasets, verify, copy and stage.
"""

from __future__ import annotations

import json
import os
import re
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
    ChunkReadError,
    ConfigError,
    IncompleteStoreError,
    StoreError,
    StoreExistsError,
    StoreLockedError,
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
    assert f"wrote {url}: 120 samples" in res.stdout, res.stdout
    assert _fs(s3_env["options"]).exists(f"{s3_env['bucket']}/store/shardload.json")
    remote = shardload.open_store(url)  # credentials and endpoint from the environment
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local")), progress=False)
    _assert_same(remote, local)


# -- the guarantees of prepare ------------------------------------------------------------------
def _lock_body(pid: int) -> bytes:
    return json.dumps(
        {"pid": pid, "start_time": None, "host": socket.gethostname(), "started": "earlier"}
    ).encode()


def test_a_second_writer_is_refused_naming_the_lock_and_its_holder(s3_env, tmp_path):
    """The lock object exists (created by a conditional put) and its holder runs: refused."""
    url = f"s3://{s3_env['bucket']}/store"
    fs = _fs(s3_env["options"])
    fs.pipe_file(f"{s3_env['bucket']}/store.partial.lock", _lock_body(os.getpid()))
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    with pytest.raises(StoreLockedError) as err:
        shardload.prepare(cfg, progress=False)
    msg = str(err.value)
    assert f"another prepare is writing {url}" in msg
    assert f"lock object {url}.partial.lock" in msg and f"pid {os.getpid()} on host" in msg
    assert fs.find(f"{s3_env['bucket']}/store") == []  # nothing written
    assert fs.cat_file(f"{s3_env['bucket']}/store.partial.lock") == _lock_body(os.getpid())


def test_the_lock_of_a_dead_run_on_this_host_is_taken_over(s3_env, tmp_path):
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    url = f"s3://{s3_env['bucket']}/store"
    fs = _fs(s3_env["options"])
    fs.pipe_file(f"{s3_env['bucket']}/store.partial.lock", _lock_body(int(dead.stdout)))
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    store = shardload.prepare(cfg, progress=False)
    assert len(store) == 120
    assert not fs.exists(f"{s3_env['bucket']}/store.partial.lock")


def test_two_lock_objects_cannot_both_be_created(s3_env):
    """The server honours If-None-Match: * (the lock's whole premise)."""
    from shardload.prep.remote_lock import ObjectLock

    fs = _fs(s3_env["options"])
    path = f"{s3_env['bucket']}/x.partial.lock"
    a = ObjectLock(fs, path, out_url="s3://a", lock_url="s3://a.lock")
    b = ObjectLock(fs, path, out_url="s3://b", lock_url="s3://b.lock")
    a.acquire()
    with pytest.raises(StoreLockedError, match=r"s3://b\.lock"):
        b.acquire()  # the holder (this process) is alive
    a.release()
    b.acquire()
    a.release()  # a no longer holds it: b's lock stays
    assert fs.exists(path)
    b.release()
    assert not fs.exists(path)


@pytest.mark.slow
def test_an_existing_store_or_foreign_objects_are_not_overwritten(s3_env, tmp_path):
    url = f"s3://{s3_env['bucket']}/store"
    opts = s3_env["options"]
    fs = _fs(opts)
    fs.pipe_file(f"{s3_env['bucket']}/store/someone-elses.csv", b"a,b\n")
    with pytest.raises(StoreExistsError, match=r"output s3://.*/store holds objects but no"):
        shardload.prepare(_config(tmp_path, url, out_storage_options=opts), progress=False)
    store = shardload.prepare(
        _config(tmp_path, url, out_storage_options=opts, overwrite=True), progress=False
    )
    assert not fs.exists(f"{s3_env['bucket']}/store/someone-elses.csv")
    with pytest.raises(StoreExistsError, match=r"output s3://.*/store exists"):
        shardload.prepare(_config(tmp_path, url, out_storage_options=opts), progress=False)
    again = shardload.prepare(
        _config(tmp_path, url, out_storage_options=opts, overwrite=True, chunk_rows=7),
        progress=False,
    )
    assert again.manifest.chunk_rows == 7
    _assert_same(again, shardload.prepare(_config(tmp_path, str(tmp_path / "l")), progress=False))
    with pytest.raises(StoreError, match=r"x/zarr\.json says"):  # replaced under an open handle
        store.read("x")


def _throttled_prepare(tmp_path: Path, conf: Path) -> subprocess.Popen:
    """``shardload prepare CONF`` in its own process and session, each block slowed by 0.3 s
    (``SHARDLOAD_THROTTLE_S``), its home under ``tmp_path``: a run to kill mid-write."""
    env = {
        **os.environ,
        "PYTHONPATH": SRC,
        "SHARDLOAD_THROTTLE_S": "0.3",
        "SHARDLOAD_HOME": str(tmp_path / "home"),
    }
    return subprocess.Popen(
        [sys.executable, "-m", "shardload", "prepare", str(conf), "--no-progress"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _kill_when(proc: subprocess.Popen, ready: Any, timeout_s: float = 180) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the kill point was never reached"
        time.sleep(0.05)
    os.killpg(proc.pid, 9)
    proc.wait(timeout=30)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["blocks", "upload"])
def test_a_killed_prepare_resumes_and_leaves_nothing_a_reader_takes_for_data(
    s3_env, tmp_path, phase, caplog
):
    """kill -9 while blocks are written locally, or mid-upload: the prefix is no store (open_store
    names the URL and says interrupted), the re-run finishes, the values equal a clean run's and
    the objects are exactly a clean run's (nothing left over, progress marks gone)."""
    bucket, opts = s3_env["bucket"], s3_env["options"]
    url = f"s3://{bucket}/store"
    conf = tmp_path / "conf.yaml"
    conf.write_text(yaml.safe_dump(_config(tmp_path, url, out_storage_options=opts)))
    proc = _throttled_prepare(tmp_path, conf)
    fs = _fs(opts)
    uploads = tmp_path / "home" / "uploads"

    def records() -> int:
        return len(list(uploads.glob("*/store.partial/_progress/block-*.npz")))

    # blocks: objects are already being uploaded (each block's once recorded); upload: every
    # block recorded, the last blocks' objects and the publish's in flight
    _kill_when(proc, lambda: records() >= (3 if phase == "blocks" else 12))
    assert not fs.exists(f"{bucket}/store/shardload.json")
    if phase == "upload":
        with pytest.raises(IncompleteStoreError, match=re.escape(f"{url} is not complete: a pre")):
            shardload.open_store(url, storage_options=opts)
        fs.pipe_file(f"{bucket}/store/x/stray-object", b"not data")  # left by someone: removed
    assert fs.exists(f"{bucket}/store.partial.lock")  # the dead run's lock: taken over below
    caplog.set_level("INFO", logger="shardload")
    resumed = shardload.prepare(_config(tmp_path, url, out_storage_options=opts), progress=False)
    if phase == "blocks":
        assert "resuming" in caplog.text and "block(s) already written" in caplog.text
    else:  # every block was recorded, and some objects were sent: not sent again
        assert "resuming" in caplog.text and "of 12 block(s) already written" in caplog.text
        sent = [r.args for r in caplog.records if r.getMessage().startswith("uploading")]
        assert len(sent) == 1 and 0 < sent[0][1] < sent[0][2] - 3, sent
    clean_url = f"s3://{bucket}/clean"
    clean = shardload.prepare(
        _config(tmp_path, clean_url, out_storage_options=opts), progress=False
    )
    _assert_same(resumed, clean)
    for name in resumed.manifest.stats:
        assert (
            resumed.manifest.stats[name].mean.tolist() == clean.manifest.stats[name].mean.tolist()
        )
    keys = sorted(p.split("/", 2)[2] for p in fs.find(f"{bucket}/store"))
    assert keys == sorted(p.split("/", 2)[2] for p in fs.find(f"{bucket}/clean"))
    assert not fs.exists(f"{bucket}/store.partial.lock")
    assert not any(uploads.glob("*/*"))


# -- reading from s3:// -------------------------------------------------------------------------
@pytest.fixture()
def s3_store(s3_env, tmp_path) -> dict[str, Any]:
    """A small store prepared into the bucket, and the same store prepared locally."""
    url = f"s3://{s3_env['bucket']}/store"
    opts = s3_env["options"]
    shardload.prepare(_config(tmp_path, url, out_storage_options=opts), progress=False)
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local")), progress=False)
    return {**s3_env, "url": url, "local": local}


def test_iter_batches_from_s3_equals_local(s3_store):
    kw = {"batch_size": 16, "seed": 4, "split": "train"}
    remote = list(
        shardload.iter_batches(s3_store["url"], storage_options=s3_store["options"], **kw)
    )
    local = list(shardload.iter_batches(s3_store["local"], **kw))
    assert len(remote) == len(local) > 0
    for got, want in zip(remote, local, strict=True):
        assert sorted(got) == sorted(want)
        for k in got:
            np.testing.assert_array_equal(got[k], want[k])


@pytest.mark.slow
def test_torch_datasets_from_s3_with_two_workers(s3_store):
    torch = pytest.importorskip("torch")
    from shardload.torch.dataset import StreamingDataset
    from shardload.torch.mapdataset import MapDataset

    def rows(ds: Any, **kw: Any) -> dict[int, np.ndarray]:
        out = {}
        for batch in torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, **kw):
            for i, row in zip(batch["index"].tolist(), batch["x"].numpy(), strict=True):
                out[i] = row
        return out

    opts = s3_store["options"]
    got = rows(StreamingDataset(s3_store["url"], batch_size=8, storage_options=opts))
    x = s3_store["local"].read("x")
    assert len(got) >= 100
    for i, row in got.items():
        np.testing.assert_array_equal(row, x[i])
    mapped = MapDataset(s3_store["url"], storage_options=opts)
    loader = torch.utils.data.DataLoader(mapped, batch_size=20, num_workers=2)
    seen = np.concatenate([b["x"].numpy() for b in loader])
    np.testing.assert_array_equal(seen, x)


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "shardload", *args],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": SRC, **(env or {})},
    )


def _aws_env(s3: dict[str, Any]) -> dict[str, str]:
    return {
        "AWS_ACCESS_KEY_ID": KEY,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_ENDPOINT_URL": s3["endpoint"],
    }


@pytest.mark.slow
def test_verify_copy_and_stage_from_and_to_s3(s3_store, tmp_path):
    url, opts, local = s3_store["url"], s3_store["options"], s3_store["local"]
    res = _cli("verify", url, env=_aws_env(s3_store))
    assert res.returncode == 0 and "all good" in res.stdout, res.stdout + res.stderr
    # copy: s3 -> local, local -> s3 (another layout), s3 -> s3
    down = shardload.copy(url, tmp_path / "down", storage_options=opts, progress=False)
    _assert_same(down, local)
    up_url = f"s3://{s3_store['bucket']}/up"
    up = shardload.copy(local.url, up_url, dst_storage_options=opts, chunk_rows=5, progress=False)
    assert up.url == up_url and up.manifest.chunk_rows == 5
    _assert_same(shardload.open_store(up_url, storage_options=opts), local)
    res = _cli(
        "copy", up_url, f"s3://{s3_store['bucket']}/again", "--no-progress", env=_aws_env(s3_store)
    )
    assert res.returncode == 0, res.stderr[-3000:]
    _assert_same(
        shardload.open_store(f"s3://{s3_store['bucket']}/again", storage_options=opts), local
    )
    # stage: the store onto a local folder, opened there
    staged = shardload.open_store(url, storage_options=opts, stage_to=tmp_path / "fast")
    assert staged.is_local and str(tmp_path / "fast") in str(staged.root)
    _assert_same(staged, local)


@pytest.mark.parametrize("damage", ["missing", "corrupted"])
def test_a_missing_or_corrupted_object_is_a_chunk_read_error_never_zeros(s3_store, damage):
    url, opts = s3_store["url"], s3_store["options"]
    fs = _fs(opts)
    store = shardload.open_store(url, storage_options=opts)
    chunks = sorted(p for p in fs.find(f"{s3_store['bucket']}/store/x") if not p.endswith(".json"))
    victim = chunks[len(chunks) // 2]
    if damage == "missing":
        fs.rm_file(victim)
    else:
        body = bytearray(fs.cat_file(victim))
        body[len(body) // 2] ^= 0xFF
        fs.pipe_file(victim, bytes(body))
    rel = victim.split("/store/", 1)[1]
    with pytest.raises(ChunkReadError, match=re.escape(rel)):
        store.read("x")
    with pytest.raises(ChunkReadError):
        for _ in shardload.iter_batches(url, storage_options=opts, batch_size=16, shuffle=False):
            pass
    res = _cli("verify", url, env=_aws_env(s3_store))
    assert res.returncode == 1 and "BAD x" in res.stdout, res.stdout + res.stderr


@pytest.mark.slow
def test_two_prepares_started_together_one_store_the_other_refused(s3_env, tmp_path):
    """Two processes, one out: the conditional put lets one lock it; the other exits 2 with the
    lock's URL and holder (or, when it starts after the winner published, 'exists'), no traceback."""
    bucket, opts = s3_env["bucket"], s3_env["options"]
    url = f"s3://{bucket}/store"
    confs = []
    for i, rows in enumerate((10, 6)):
        path = tmp_path / f"conf{i}.yaml"
        path.write_text(
            yaml.safe_dump(_config(tmp_path, url, out_storage_options=opts, chunk_rows=rows))
        )
        confs.append(path)
    env = {**os.environ, "PYTHONPATH": SRC, "SHARDLOAD_THROTTLE_S": "0.05"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "shardload", "prepare", str(c), "--no-progress"],
            env={**env, "SHARDLOAD_HOME": str(tmp_path / f"home{i}")},  # as on two hosts
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, c in enumerate(confs)
    ]
    res = [(p.wait(timeout=300), p.communicate()[1]) for p in procs]
    codes = [rc for rc, _ in res]
    assert sorted(codes) == [0, 2], res
    winner = codes.index(0)
    err = res[1 - winner][1]
    assert "Traceback" not in err, err
    assert (f"lock object {url}.partial.lock" in err and "pid " in err) or "exists" in err, err
    print("the loser was", "locked out" if "lock object" in err else "told the store exists")
    store = shardload.open_store(url, storage_options=opts)
    assert store.manifest.chunk_rows == (10, 6)[winner]
    _assert_same(store, shardload.prepare(_config(tmp_path, str(tmp_path / "l")), progress=False))
    assert not _fs(opts).exists(f"{bucket}/store.partial.lock")


@pytest.mark.slow
def test_an_object_damaged_on_its_way_up_stops_the_publish(s3_env, tmp_path, monkeypatch):
    """Every object is checked after its put (size and MD5): a damaged one is an error naming
    it, no manifest is put, and the next run re-sends it and publishes."""
    import s3fs

    put_file = s3fs.S3FileSystem._put_file

    async def damaging_put(self: Any, lpath: str, rpath: str, **kw: Any) -> None:
        data = Path(lpath).read_bytes()
        if rpath.endswith("x/zarr.json"):
            data = data.replace(b"float", b"fl0at")
        await self._pipe_file(rpath, data)

    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", damaging_put)
    url = f"s3://{s3_env['bucket']}/store"
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    with pytest.raises(StoreError, match=re.escape(f"object {url}/x/zarr.json differs from")):
        shardload.prepare(cfg, progress=False)
    fs = _fs(s3_env["options"])
    assert not fs.exists(f"{s3_env['bucket']}/store/shardload.json")
    with pytest.raises(IncompleteStoreError, match=re.escape(url)):
        shardload.open_store(url, storage_options=s3_env["options"])
    monkeypatch.setattr(s3fs.S3FileSystem, "_put_file", put_file)
    store = shardload.prepare(cfg, progress=False)
    _assert_same(store, shardload.prepare(_config(tmp_path, str(tmp_path / "l")), progress=False))


@pytest.mark.parametrize(
    "layout", [{"format": "npy"}, {"format": "hdf5"}, {"shard_chunks": 4}], ids=str
)
def test_every_format_round_trips_through_s3(s3_env, tmp_path, layout):
    url = f"s3://{s3_env['bucket']}/store"
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"], **layout)
    remote = shardload.prepare(cfg, progress=False)
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "l"), **layout), progress=False)
    assert remote.manifest.format == local.manifest.format
    _assert_same(remote, local)
    assert not _fs(s3_env["options"]).find(f"{s3_env['bucket']}/store/_staged")


@pytest.mark.slow
def test_prepare_reads_an_s3_source_too(s3_env, tmp_path):
    """source and out both in the bucket, each with its own storage options."""
    make_dataset(120, seed=3).to_netcdf(tmp_path / "src.nc")
    fs = _fs(s3_env["options"])
    fs.put_file(str(tmp_path / "src.nc"), f"{s3_env['bucket']}/raw/src.nc")
    url = f"s3://{s3_env['bucket']}/store"
    cfg = _config(tmp_path, url, out_storage_options=s3_env["options"])
    cfg["source"] = {
        "paths": [f"s3://{s3_env['bucket']}/raw/*.nc"],
        "storage_options": s3_env["options"],
    }
    remote = shardload.prepare(cfg, progress=False)
    _assert_same(remote, shardload.prepare(_config(tmp_path, str(tmp_path / "l")), progress=False))
    assert remote.manifest.provenance["files"] == [f"s3://{s3_env['bucket']}/raw/src.nc"]


class _Crash(Exception):
    pass


@pytest.mark.slow
def test_overwrite_killed_after_removing_the_old_manifest_is_no_store(
    s3_env, tmp_path, monkeypatch
):
    """overwrite deletes the old manifest before replacing objects; a crash right after must not
    leave a prefix that opens as data (its root zarr.json read as plain Zarr): it says
    interrupted, naming the URL, and the re-run publishes."""
    import s3fs

    url, opts = f"s3://{s3_env['bucket']}/store", s3_env["options"]
    shardload.prepare(_config(tmp_path, url, out_storage_options=opts), progress=False)
    rm_file = s3fs.S3FileSystem._rm_file

    async def crash_after_manifest(self: Any, path: str, **kw: Any) -> None:
        await rm_file(self, path, **kw)
        if path.endswith("shardload.json"):
            raise _Crash(path)

    monkeypatch.setattr(s3fs.S3FileSystem, "_rm_file", crash_after_manifest)
    cfg = _config(tmp_path, url, out_storage_options=opts, overwrite=True, chunk_rows=6)
    with pytest.raises(_Crash):
        shardload.prepare(cfg, progress=False)
    monkeypatch.setattr(s3fs.S3FileSystem, "_rm_file", rm_file)
    with pytest.raises(IncompleteStoreError, match=re.escape(f"{url} is not complete")):
        shardload.open_store(url, storage_options=opts)
    store = shardload.prepare(cfg, progress=False)
    assert store.manifest.chunk_rows == 6
    _assert_same(store, shardload.prepare(_config(tmp_path, str(tmp_path / "l")), progress=False))


@pytest.mark.parametrize("fmt", ["zarr", "npy"])
def test_an_object_overwritten_after_its_check_is_an_error_at_a_range_read(
    s3_env, tmp_path, monkeypatch, fmt
):
    """A file checked whole, then overwritten in the bucket (same size, other bytes): the next
    range read of it carries ``IfMatch`` with the ETag of the checked version, and S3 refuses
    it: an error naming the object, never its new values (issue 28; before: served)."""
    from shardload.errors import RemoteChangedError
    from shardload.formats.zarr.kept import KEEP_ENV

    monkeypatch.setenv(KEEP_ENV, "0")  # no checked bytes kept: later reads are range requests
    url, opts = f"s3://{s3_env['bucket']}/store", s3_env["options"]
    extra = {"format": fmt, "compression": "none", "chunk_rows": 8}
    if fmt == "zarr":
        extra["shard_chunks"] = 8
    shardload.prepare(_config(tmp_path, url, out_storage_options=opts, **extra), progress=False)
    local = shardload.prepare(_config(tmp_path, str(tmp_path / "local"), **extra), progress=False)
    store = shardload.open_store(url, storage_options=opts)
    row = 70
    assert store.read("x").shape[0] == 120  # every file of x fetched whole and checked
    np.testing.assert_array_equal(store.read("x", row, row + 1), local.read("x", row, row + 1))
    old = np.ascontiguousarray(local.read("x", row, row + 1)).tobytes()
    fs = _fs(opts)
    hits = [p for p in fs.find(f"{s3_env['bucket']}/store/x") if old in fs.cat_file(p)]
    assert len(hits) == 1, hits
    data = fs.cat_file(hits[0])
    fs.pipe_file(hits[0], data.replace(old, bytes(b ^ 0x40 for b in old)))
    with pytest.raises(RemoteChangedError, match=r"changed on the server since"):
        store.read("x", row, row + 1)
