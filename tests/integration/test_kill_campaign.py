"""Kill campaign: prepare killed (SIGKILL / SIGTERM) at many moments, for every format and
scheduler, then resumed: the store published at the end equals a clean run value for value.

The campaign is slow-marked (5 formats x 3 schedulers x 8 kill points); the smoke test (HDF5,
the format whose blocks used to be lost, 2 kill points) runs by default. The threads scheduler's
cases are here, the processes' and distributed's in test_kill_campaign_{processes,distributed}.py
(one file each, so that `make test`'s two processes share the campaign).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from killing import campaign

from conftest import make_dataset

pytestmark = pytest.mark.integration

FORMATS = {
    "npy": {"format": "npy", "compression": "none"},
    "zarr": {"format": "zarr", "compression": "lz4"},
    "zarr-sharded": {"format": "zarr", "compression": "zstd", "shard_chunks": 2},
    "hdf5": {"format": "hdf5", "compression": "lz4"},
    "parquet": {"format": "parquet", "compression": "zstd"},
}
SCHEDULERS = {
    "threads": {"scheduler": "threads", "num_workers": 2},
    "processes": {"scheduler": "processes", "num_workers": 2},
    "distributed": {"scheduler": "distributed", "num_workers": 1, "threads_per_worker": 2},
}
#: 8 kill points, each (signal, trigger) once: right after creation, after a few more records
#: (SIGKILL and SIGTERM, in the first run and in resumed ones), at a time after launch (anywhere:
#: start-up, writing), and once every block is recorded (merge, manifest, publish). Each point
#: costs a process start (most of a point's time); the list once held ("KILL", 1) and
#: ("KILL", 2) twice more, in the same phase (writing, resumed), so they added time, not cases.
KILL_POINTS: list[tuple[str, object]] = [
    ("KILL", "job"),
    ("KILL", 1),
    ("TERM", 2),
    ("KILL", 3),
    ("TERM", 1),
    ("KILL", 2),
    ("KILL", 1.5),
    ("KILL", "all"),
]


def config(tmp_path: Path, fmt: str, execution: dict, n: int = 300) -> dict:
    src = tmp_path / "src.nc"
    if not src.exists():
        make_dataset(n, seed=11).to_netcdf(src)
    return {
        "source": {"paths": [str(src)]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a", "b", "c"], "y": ["b"]},
        "chunk_rows": 10,
        "out": f"store-{fmt}",
        "execution": execution,
        **FORMATS[fmt],
    }


def test_kill_smoke_hdf5_resumes_to_the_clean_store(tmp_path):
    conf = config(tmp_path, "hdf5", SCHEDULERS["threads"], n=140)
    log = campaign(tmp_path, conf, [("KILL", 4), ("TERM", 3)], throttle_s=0.05)
    assert all("finished" not in line for line in log), log


def run_campaign(tmp_path: Path, fmt: str, scheduler: str) -> None:
    """Every kill point against a prepare of ``fmt`` on ``scheduler``; the store resumed equals
    a clean run's (``campaign`` checks), and nearly every point did stop the run."""
    if scheduler == "distributed":
        pytest.importorskip("distributed")
    conf = config(tmp_path, fmt, SCHEDULERS[scheduler], n=600)  # blocks enough for every point
    log = campaign(tmp_path, conf, KILL_POINTS, throttle_s=0.04)
    assert sum("finished" not in line for line in log) >= len(KILL_POINTS) - 1, log


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["threads"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_kill_campaign(tmp_path, fmt, scheduler):
    run_campaign(tmp_path, fmt, scheduler)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["npy", "zarr", "zarr-sharded", "hdf5"])
def test_kill_campaign_ragged(tmp_path, fmt, monkeypatch):
    """A variable-length array (user function view) beside a fixed one: killed at every
    point, including while the offsets and values are written after the last record."""
    tests = str(Path(__file__).resolve().parents[1])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]))
    conf = config(tmp_path, fmt, SCHEDULERS["threads"], n=400)
    conf.pop("arrays")
    conf["view"] = "userfuncs:ragged_from_b"
    log = campaign(tmp_path, conf, KILL_POINTS, throttle_s=0.04)
    assert sum("finished" not in line for line in log) >= len(KILL_POINTS) - 2, log
