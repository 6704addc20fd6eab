"""Attribute functions for the compute tests (importable as ``compute_funcs:NAME``)."""

from __future__ import annotations

import numpy as np


def box(x: np.ndarray) -> np.ndarray:
    """A 3-point moving sum along every axis (depends on neighbours; keeps dtype)."""
    out = x.copy()
    for a in range(x.ndim):
        out = out + np.roll(x, 1, axis=a) + np.roll(x, -1, axis=a)
    return out


def block_position(x: np.ndarray) -> np.ndarray:
    """Depends on the window's shape and position: exposes any difference in the windows."""
    grid = np.indices(x.shape).sum(axis=0).astype(x.dtype)
    return x * 3 + grid + np.float32(x.size % 7)


def shrink(x: np.ndarray) -> np.ndarray:
    return x[1:]


def to_float64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


def inplace(x: np.ndarray) -> np.ndarray:
    x += 1
    return x


def scaled(x: np.ndarray, *, factor: float = 1.0) -> np.ndarray:
    return (x * factor).astype(x.dtype)


CALLS = {"n": 0, "fail_at": -1}


def flaky(x: np.ndarray) -> np.ndarray:
    """``box``, but raises on call number ``CALLS['fail_at']`` (a crash mid-run)."""
    CALLS["n"] += 1
    if CALLS["n"] == CALLS["fail_at"]:
        raise RuntimeError("injected failure")
    return box(x)


def slow_box(x: np.ndarray) -> np.ndarray:
    """``box`` after a pause (lets a test kill the run mid-way)."""
    import time

    CALLS["n"] += 1
    time.sleep(0.3)
    return box(x)
