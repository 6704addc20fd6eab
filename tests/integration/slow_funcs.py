"""Compute functions for the job-queue tests (imported by batch-job workers via PYTHONPATH)."""

from __future__ import annotations

import time

import numpy as np


def slow_double(x: np.ndarray, seconds: float = 1.0) -> np.ndarray:
    """``2 * x`` after a pause, so that a test can act while blocks are in flight."""
    time.sleep(seconds)
    return x * 2
