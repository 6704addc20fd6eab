"""A local store is opened and loaded without importing fsspec (issue 25: fsspec's import was
0.27 s of a process's first epoch of the default load); where something asks the filesystem
for more, it is fsspec's local one."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.formats import base

prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
SRC = Path(shardload.__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def default_store(tmp_path_factory) -> Path:
    """A store prepared with no layout key (Zarr v3 shards of small lz4 inner chunks), with a
    last shard shorter than the others."""
    out = tmp_path_factory.mktemp("localfs") / "s"
    x = np.arange(3000 * 40, dtype=np.float32).reshape(3000, 40)
    ds = xr.Dataset({"a": (("sample", "feat"), x)})
    config = {
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a"]},
        "out": str(out),
        "splits": {},
    }
    prepare(config, dataset=ds)
    return out


def test_loading_a_local_store_imports_no_fsspec(default_store: Path) -> None:
    code = (
        "import sys, numpy as np, shardload\n"
        f"st = shardload.open_store({str(default_store)!r})\n"
        "got = [b['x'][:, 0].copy() for b in shardload.iter_batches(st, batch_size=64)]\n"
        "assert sorted(np.concatenate(got).tolist()) == [40.0 * i for i in range(3000)]\n"
        "print('fsspec' in sys.modules)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]),
    }
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )


def test_an_epoch_from_a_path_imports_no_fsspec(default_store: Path) -> None:
    """``iter_batches(path)`` opens the store and closes it when the epoch ends: closing
    imports nothing, and a program that takes one batch and exits (the store closed at the
    interpreter's teardown) says nothing on stderr."""
    out = _run(
        "import sys, shardload\n"
        f"n = sum(len(b['x']) for b in shardload.iter_batches({str(default_store)!r}, "
        "batch_size=64))\n"
        "print(n, 'fsspec' in sys.modules)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3000", "False"]
    out = _run(
        "import shardload\n"
        f"it = iter(shardload.iter_batches({str(default_store)!r}, batch_size=64))\n"
        "print(len(next(it)['x']))\n"
    )
    assert out.returncode == 0 and out.stdout.split() == ["64"]
    assert out.stderr == ""


def test_local_fs_is_fsspec_local_on_first_use(tmp_path: Path) -> None:
    fs = base.LocalFS()
    assert base.is_local(fs) and fs.plan_cache is None and fs.node_cache is None
    (tmp_path / "f").write_bytes(b"abc")
    assert fs.exists(str(tmp_path / "f")) and not fs.exists(str(tmp_path / "g"))
    with fs.open(str(tmp_path / "f"), "rb") as f:
        assert f.read() == b"abc"
    from fsspec.implementations.local import LocalFileSystem

    assert isinstance(fs._fs, LocalFileSystem)
    again = pickle.loads(pickle.dumps(fs))  # to DataLoader workers: a fresh one, no fsspec
    assert isinstance(again, base.LocalFS) and "_fs" not in again.__dict__
    assert fs.unstrip_protocol("/x") == "file:///x"
    with pytest.raises(AttributeError):
        fs.__no_such_dunder__  # noqa: B018


def test_zarr_python_reads_through_local_fs(default_store: Path) -> None:
    """What goes through zarr-python (``ZarrReader.array``: the store's fsspec filesystem,
    wrapped for zarr) gets fsspec's local filesystem behind ``LocalFS``."""
    st = shardload.open_store(default_store)
    assert isinstance(st.fs, base.LocalFS)
    got = np.asarray(st.reader.array("x")[:5])
    np.testing.assert_array_equal(got, np.arange(200, dtype=np.float32).reshape(5, 40))
