"""``shardload -q prepare`` with ``scheduler: distributed``: quiet, and a Ctrl-C is one line
(issue #26 row 8: 33 INFO lines; 5-6 tracebacks from the dask workers on Ctrl-C)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import python_env

pytest.importorskip("distributed")
pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.distributed]


def _config(tmp_path: Path) -> Path:
    src = tmp_path / "src.nc"
    values = np.random.default_rng(0).standard_normal((20_000, 8)).astype("f4")
    xr.Dataset({"a": (("sample", "f"), values)}).to_netcdf(src)
    cfg = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a"]},
        "chunk_rows": 1000,
        "format": "npy",
        "compression": "none",
        "out": str(tmp_path / "out"),
        "execution": {"scheduler": "distributed", "num_workers": 2},
    }
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _start(cfg: Path, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "shardload", "-q", "prepare", str(cfg)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**python_env(), "SHARDLOAD_LOG": "off", **env},
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )


@contextlib.contextmanager
def _port_8787_taken() -> Iterator[None]:
    """dask's default dashboard port in use, as when another cluster runs on this machine."""
    with socket.socket() as s:
        with contextlib.suppress(OSError):  # already taken: in use either way
            s.bind(("", 8787))
            s.listen()
        yield


def test_quiet_prints_nothing(tmp_path: Path) -> None:
    with _port_8787_taken():
        proc = _start(_config(tmp_path))
        _out, err = proc.communicate(timeout=240)
    assert proc.returncode == 0, err
    assert err == "", err


@pytest.mark.parametrize("inherited", [None, "warning"])
def test_ctrl_c_is_one_line(tmp_path: Path, inherited: str | None) -> None:
    """``inherited``: a distributed log level already in the environment (a user's, or one an
    earlier in-process CLI call of the same test process left there): ``-q`` still wins."""
    cfg = _config(tmp_path)
    env = {"SHARDLOAD_THROTTLE_S": "0.5"}  # 20 blocks: still running when stopped
    if inherited:
        env["DASK_LOGGING__DISTRIBUTED"] = inherited
    proc = _start(cfg, **env)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "out.partial" / "_progress").glob("block-*")):
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
    _out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert err.splitlines() == ["shardload prepare: interrupted"], err


def test_a_result_for_a_cancelled_task_is_not_logged_as_an_error(caplog) -> None:
    """The race behind a Ctrl-C's extra traceback (seen once in CI): a task finishes just as
    ``run_windowed`` cancels its concurrent future; distributed's ``ClientExecutor`` then sets
    the result on the cancelled future and tornado logs the ``InvalidStateError``. Forced here:
    a finished task's result handed to an already cancelled future on the client's loop."""
    import logging
    import threading
    from concurrent.futures import Future

    from distributed.cfexecutor import _cascade_future

    from shardload.prep.config import ExecutionConfig
    from shardload.prep.executor import open_executor

    class FinishedTask:  # the dask future of a task that finished
        status = "finished"

        async def _result(self, raiseit: bool = False) -> int:
            return 1

    seen = threading.Event()

    class Seen(logging.Filter):  # added first: sees the record before any other filter
        def filter(self, record: logging.LogRecord) -> bool:
            seen.set()
            return True

    tornado_log = logging.getLogger("tornado.application")
    witness = Seen()
    tornado_log.addFilter(witness)
    try:
        with caplog.at_level(logging.ERROR, logger="tornado.application"):
            cfg = ExecutionConfig(scheduler="distributed", num_workers=1)
            with open_executor(cfg) as (ex, _threads):
                cancelled: Future[int] = Future()
                cancelled.cancel()
                ex._client.loop.add_callback(_cascade_future, FinishedTask(), cancelled)
                assert seen.wait(60), "tornado logged nothing: the race was not reproduced"
    finally:
        tornado_log.removeFilter(witness)
    assert [r for r in caplog.records if r.name == "tornado.application"] == []
