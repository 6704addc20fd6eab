"""Errors that must be clear: inspect's JSON, a closed pipe, a corrupt manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import xarray as xr

import shardload
from conftest import python_env
from shardload.errors import StoreError


@pytest.fixture()
def nan_store(tmp_path):
    """A store whose array has 2,000 features, one of them all NaN."""
    x = np.random.default_rng(0).normal(size=(10, 2000)).astype("f4")
    x[:, 3] = np.nan
    src = tmp_path / "nan.nc"
    xr.Dataset({"x": (("sample", "f"), x)}).to_netcdf(src)
    conf = {
        "source": str(src),
        "sample_dims": ["sample"],
        "arrays": {"x": ["x"]},
        "chunk_rows": 5,
        "splits": {},
        "out": str(tmp_path / "s"),
    }
    shardload.prepare(conf, progress=False)
    return tmp_path / "s"


def _run(capsys, *args: str) -> tuple[int, str, str]:
    """``shardload ARGS`` in this process (exit status, stdout, stderr)."""
    from shardload.cli.app import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_json_is_strict_json_with_null_for_nan(nan_store, capsys):
    code, out, err = _run(capsys, "inspect", "--json", str(nan_store))
    assert code == 0, err
    assert "NaN" not in out
    doc = json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    st = doc["stats"]["x"]
    assert st["mean"][3] is None and st["min"][3] is None and st["nan_count"] == 10
    assert isinstance(st["mean"][0], float)
    # text mode too: no All-NaN RuntimeWarning (an error under pytest's settings)
    code, out, err = _run(capsys, "inspect", "--stats", str(nan_store))
    assert code == 0 and "NaN 10" in out


def test_inspect_into_a_closed_pipe_exits_quietly(nan_store):
    p = subprocess.Popen(
        [sys.executable, "-m", "shardload", "inspect", "--json", str(nan_store)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=python_env(),
    )
    assert p.stdout is not None and p.stderr is not None
    p.stdout.readline()  # like `| head -1`: read a line, then go away
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 141
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_manifest_of_random_bytes_is_a_clear_error(tmp_path, capsys):
    store = tmp_path / "s"
    store.mkdir()
    (store / "shardload.json").write_bytes(os.urandom(4096) + b"\xff\xfe")
    with pytest.raises(StoreError, match=r"shardload\.json") as info:
        shardload.open_store(store)
    assert "manifest" in str(info.value)
    (store / "shardload.json").write_text("[1, 2]")
    with pytest.raises(StoreError, match="not an object"):
        shardload.open_store(store)
    code, _, err = _run(capsys, "inspect", str(store))
    assert code == 2 and "shardload.json" in err


def test_scheduler_choices_are_the_configs():
    """`--scheduler` of prepare and copy offers exactly the config's schedulers."""
    from shardload.cli.prepare import SCHEDULER_CHOICES
    from shardload.prep.config_models.fields import SCHEDULERS

    assert SCHEDULER_CHOICES == SCHEDULERS
