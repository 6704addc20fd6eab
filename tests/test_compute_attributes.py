"""Built-in attributes against direct numpy/scipy computations on a whole small array, both
called directly and through the block-wise engine (halo as documented per attribute)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import shardload
from shardload.blockwise import attributes as A

signal = pytest.importorskip("scipy.signal")
zarr = pytest.importorskip("zarr")

SHAPE = (9, 7, 24)


@pytest.fixture(scope="module")
def cube() -> np.ndarray:
    rng = np.random.default_rng(1)
    t = np.arange(SHAPE[2])
    base = np.sin(2 * np.pi * t / 6.0)[None, None, :] * rng.uniform(0.5, 2, SHAPE[:2])[..., None]
    return (base + 0.1 * rng.standard_normal(SHAPE)).astype(np.float32)


def moving_mean(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Truncated centred mean by brute force: NaN-padded windows, nanmean."""
    h = size // 2
    pad = [(0, 0)] * x.ndim
    pad[axis] = (h, h)
    xp = np.pad(x.astype(np.float64), pad, constant_values=np.nan)
    win = np.lib.stride_tricks.sliding_window_view(xp, size, axis=axis)
    return np.nanmean(win, axis=-1)


def semblance_loops(x: np.ndarray, traces: int, samples: int) -> np.ndarray:
    ht, hs = traces // 2, samples // 2
    out = np.zeros(x.shape)
    n0, n1, n2 = x.shape
    xd = x.astype(np.float64)
    for i in range(n0):
        for j in range(n1):
            for k in range(n2):
                w = xd[
                    max(i - ht, 0) : i + ht + 1,
                    max(j - ht, 0) : j + ht + 1,
                    max(k - hs, 0) : k + hs + 1,
                ]
                w = w.reshape(-1, w.shape[-1])
                den = w.shape[0] * np.sum(w * w)
                out[i, j, k] = np.sum(w.sum(axis=0) ** 2) / den if den > 0 else 0.0
    return out


def references(x: np.ndarray) -> dict[str, np.ndarray]:
    analytic = signal.hilbert(x.astype(np.float64), axis=-1)
    phase = np.angle(analytic)
    g = np.gradient(x.astype(np.float64))
    return {
        "envelope": np.abs(analytic),
        "instantaneous_phase": phase,
        "instantaneous_frequency": np.gradient(np.unwrap(phase, axis=-1), 0.5, axis=-1)
        / (2 * np.pi),
        "rms_amplitude": np.sqrt(moving_mean(x.astype(np.float64) ** 2, 5, -1)),
        "gradient_magnitude": np.sqrt(sum(gi * gi for gi in g)),
        "rolling_mean": moving_mean(x, 3, 0),
        "anomaly": x - moving_mean(x, 3, 0),
        "semblance": semblance_loops(x, 3, 5),
    }


# name -> (kwargs, depth, chunks) for the engine run
ENGINE: dict[str, tuple[dict[str, Any], dict[int, int], dict[int, int]]] = {
    "envelope": ({"axis": -1}, {}, {0: 4, 1: 3, 2: -1}),
    "instantaneous_phase": ({"axis": -1}, {}, {0: 4, 1: 3, 2: -1}),
    "instantaneous_frequency": ({"axis": -1, "dt": 0.5}, {}, {0: 4, 1: 3, 2: -1}),
    "rms_amplitude": ({"axis": -1, "window": 5}, {2: 2}, {0: 4, 1: 3, 2: 7}),
    "gradient_magnitude": ({}, {0: 1, 1: 1, 2: 1}, {0: 4, 1: 3, 2: 7}),
    "rolling_mean": ({"axis": 0, "window": 3}, {0: 1}, {0: 4, 1: 3, 2: 7}),
    "anomaly": ({"axis": 0, "window": 3}, {0: 1}, {0: 4, 1: 3, 2: 7}),
    "semblance": ({"traces": 3, "samples": 5}, {0: 1, 1: 1, 2: 2}, {0: 4, 1: 3, 2: 7}),
}


@pytest.fixture(scope="module")
def refs(cube: np.ndarray) -> dict[str, np.ndarray]:
    return references(cube)


@pytest.mark.parametrize("name", sorted(ENGINE))
def test_attribute_direct(cube: np.ndarray, refs: dict[str, np.ndarray], name: str) -> None:
    kwargs = ENGINE[name][0]
    got = getattr(A, name)(cube, **kwargs)
    assert got.shape == cube.shape and got.dtype == cube.dtype
    np.testing.assert_allclose(got, refs[name], rtol=2e-5, atol=2e-5)


def test_attributes_through_the_engine(
    tmp_path: Path, cube: np.ndarray, refs: dict[str, np.ndarray]
) -> None:
    """Blocks with the documented halo and boundary 'none' give the whole array's values."""
    src = tmp_path / "cube.zarr"
    g = zarr.open_group(store=str(src), mode="w", zarr_format=3)
    g.create_array("amp", shape=cube.shape, chunks=(4, 7, 24), dtype=cube.dtype)[...] = cube
    for name, (kwargs, depth, chunks) in ENGINE.items():
        out = tmp_path / name
        shardload.compute(
            {
                "source": {"paths": [str(src)], "variable": "amp"},
                "attributes": {
                    name: {
                        "function": f"shardload.attributes:{name}",
                        "depth": depth,
                        "boundary": "none",
                        **kwargs,
                    }
                },
                "chunks": chunks,
                "out": str(out),
                "execution": {"scheduler": "sync"},
            }
        )
        got = shardload.open_store(str(out)).read(name, 0, SHAPE[0])
        np.testing.assert_allclose(got, refs[name], rtol=2e-5, atol=2e-5, err_msg=name)


def test_bad_windows() -> None:
    with pytest.raises(shardload.errors.ConfigError, match=r"rms_amplitude window.*even"):
        A.rms_amplitude(np.zeros((3, 4)), window=4)
    with pytest.raises(shardload.errors.ConfigError, match="semblance needs a 3-D"):
        A.semblance(np.zeros((3, 4)))
