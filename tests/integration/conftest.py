"""Fixtures of the integration tests: a real single-node SLURM (tests/integration/slurm_cluster.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from .slurm_cluster import SlurmCluster, missing_reason

TESTS = Path(__file__).resolve().parents[1]
SRC = TESTS.parent / "src"


@pytest.fixture()
def slurm(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmCluster]:
    """A fresh SLURM (munged, slurmctld, slurmd as this test's children), stopped afterwards
    whatever the test did; no job is left (checked while the daemons still run, when they do).

    Client commands, and the batch jobs (sbatch exports the environment), find it through
    ``SLURM_CONF``; the jobs import this checkout's shardload and the test helper modules."""
    reason = missing_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster().start()
    monkeypatch.setenv("SLURM_CONF", str(cluster.conf))
    path = os.pathsep.join([str(SRC), str(TESTS), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path.rstrip(os.pathsep))
    try:
        yield cluster
    finally:
        cluster.stop()
