"""Shared fixtures: the real data in ../shared/data (skipped with a reason where absent)."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
ECRAD = SHARED_DATA / "ecrad"


@pytest.fixture(scope="session")
def ecrad_inputs() -> Path:
    """The real ecRad input file (MAELSTROM input schema)."""
    path = ECRAD / "ecrad_meridian.nc"
    if not path.exists():
        pytest.skip(f"real data absent: {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def ecrad_outputs() -> Path:
    """ecRad's Tripleclouds flux output for the real input file."""
    path = ECRAD / "ecrad_meridian_tripleclouds_out.nc"
    if not path.exists():
        pytest.skip(f"real data absent: {path} (see ../shared/data/README.md)")
    return path


@pytest.fixture(scope="session")
def radiation_sample(tmp_path_factory) -> list[Path]:
    """Two timesteps x two patches of small generated MAELSTROM files."""
    from shardload.samples.radiation import write_radiation_sample

    out = tmp_path_factory.mktemp("radiation_sample")
    return write_radiation_sample(
        out, columns=300, timesteps=(0, 125), patches=(0, 7), seed=3, block_columns=256
    )
