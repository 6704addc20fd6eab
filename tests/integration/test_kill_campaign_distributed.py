"""The kill campaign (test_kill_campaign.py) with the distributed scheduler: prepare killed at every
kill point for every format, then resumed to a store equal to a clean run's."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_kill_campaign import FORMATS, run_campaign

pytestmark = pytest.mark.integration


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["distributed"])
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_kill_campaign(tmp_path, fmt, scheduler):
    run_campaign(tmp_path, fmt, scheduler)
