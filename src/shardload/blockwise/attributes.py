"""Built-in attributes for ``shardload compute`` (``function: "shardload.attributes:NAME"``).

Every function takes a block with its halo (a numpy array) and keyword options, returns an array
of the same shape and dtype (float dtypes; integers come back as float64, and the engine
writes float64 for them without a ``dtype:`` option), and is vectorised over the whole block. The halo each needs for results
identical to a computation on the whole array is given per function; use ``boundary: none`` to
get the whole array's own edge handling at the array's edges.

``work_bytes_per_element`` on each function is the working memory it allocates per window
element; the engine's memory bound counts it.

Seismic: :func:`envelope`, :func:`instantaneous_phase`, :func:`instantaneous_frequency`
(Hilbert transform along one axis: give that axis as one block, ``chunks: {2: -1}``),
:func:`rms_amplitude`, :func:`gradient_magnitude`, :func:`semblance`.
Climate: :func:`rolling_mean`, :func:`anomaly` (along time).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from shardload.errors import ConfigError

__all__ = [
    "anomaly",
    "envelope",
    "gradient_magnitude",
    "instantaneous_frequency",
    "instantaneous_phase",
    "rms_amplitude",
    "rolling_mean",
    "semblance",
]

F = TypeVar("F", bound=Callable[..., Any])


def _work(nbytes: int) -> Callable[[F], F]:
    def deco(func: F) -> F:
        func.work_bytes_per_element = nbytes  # type: ignore[attr-defined]
        # what it returns for integer input (the engine's default dtype for it, docs/compute.md)
        func.integer_output_dtype = "float64"  # type: ignore[attr-defined]
        return func

    return deco


def _float(x: np.ndarray) -> np.dtype[Any]:
    return x.dtype if x.dtype.kind == "f" else np.dtype(np.float64)


def _analytic(x: np.ndarray, axis: int) -> np.ndarray:
    from scipy import signal  # a base dependency

    return signal.hilbert(np.asarray(x, dtype=np.float64), axis=axis)  # type: ignore[no-any-return]


def _window(size: int, name: str) -> int:
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ConfigError(f"{name}: {size!r}; give a positive odd number of samples")
    if size % 2 == 0:
        raise ConfigError(f"{name}: {size} is even; give an odd window (centred on each sample)")
    return size


@_work(48)
def envelope(x: np.ndarray, *, axis: int = -1) -> np.ndarray:
    """Amplitude envelope ``|x + i H(x)|`` (Hilbert transform along ``axis``).

    The Hilbert transform is global along its axis: keep that axis whole (``chunks: {axis: -1}``,
    depth 0 along it) for values equal to the whole array's.
    """
    return np.abs(_analytic(x, axis)).astype(_float(x))


@_work(48)
def instantaneous_phase(x: np.ndarray, *, axis: int = -1) -> np.ndarray:
    """Instantaneous phase in radians, ``angle(x + i H(x))`` in ``(-pi, pi]``."""
    return np.angle(_analytic(x, axis)).astype(_float(x))


@_work(64)
def instantaneous_frequency(x: np.ndarray, *, axis: int = -1, dt: float = 1.0) -> np.ndarray:
    """Instantaneous frequency in cycles per unit of ``dt``: the derivative (``np.gradient``) of
    the unwrapped instantaneous phase along ``axis``, divided by ``2 pi``."""
    phase = np.unwrap(np.angle(_analytic(x, axis)), axis=axis)
    return (np.gradient(phase, dt, axis=axis) / (2 * np.pi)).astype(_float(x))


def _box_mean(x: np.ndarray, size: int, axis: int) -> np.ndarray:
    """Centred moving mean over ``size`` samples along ``axis``; the window is truncated at the
    array's edges (mean of the samples present), by a cumulative sum in float64."""
    axis = axis % x.ndim
    n = x.shape[axis]
    h = size // 2
    c = np.cumsum(np.asarray(x, dtype=np.float64), axis=axis)
    c = np.concatenate([np.zeros_like(np.take(c, [0], axis=axis)), c], axis=axis)
    i = np.arange(n)
    lo, hi = np.clip(i - h, 0, n), np.clip(i + h + 1, 0, n)
    shape = [1] * x.ndim
    shape[axis] = n
    counts = (hi - lo).reshape(shape)
    return (np.take(c, hi, axis=axis) - np.take(c, lo, axis=axis)) / counts  # type: ignore[no-any-return]


@_work(32)
def rms_amplitude(x: np.ndarray, *, axis: int = -1, window: int = 9) -> np.ndarray:
    """Root mean square of ``x`` over a centred window of ``window`` samples along ``axis``
    (truncated at the array's edges). Halo: ``window // 2`` along ``axis``."""
    w = _window(window, "rms_amplitude window")
    return np.sqrt(_box_mean(np.square(x, dtype=np.float64), w, axis)).astype(_float(x))


@_work(32)
def gradient_magnitude(x: np.ndarray, *, spacing: float = 1.0) -> np.ndarray:
    """``sqrt(sum_axes (dx/d axis)^2)`` with ``np.gradient`` (central differences inside,
    one-sided at the edges). Halo: 1 on every axis (with ``boundary: none``: equal to the whole
    array's ``np.gradient``, edges included)."""
    total = np.zeros(x.shape, dtype=np.float64)
    for a in range(x.ndim):
        if x.shape[a] < 2:
            continue
        g = np.gradient(np.asarray(x, dtype=np.float64), spacing, axis=a)
        total += g * g
    return np.sqrt(total).astype(_float(x))


@_work(24)
def rolling_mean(x: np.ndarray, *, axis: int = 0, window: int = 5) -> np.ndarray:
    """Centred rolling mean over ``window`` steps along ``axis`` (time; truncated at the edges).
    Halo: ``window // 2`` along ``axis``."""
    return _box_mean(x, _window(window, "rolling_mean window"), axis).astype(_float(x))


@_work(24)
def anomaly(x: np.ndarray, *, axis: int = 0, window: int = 5) -> np.ndarray:
    """``x`` minus its centred rolling mean along ``axis`` (departure from the local climate).
    Halo: ``window // 2`` along ``axis``."""
    mean = _box_mean(x, _window(window, "anomaly window"), axis)
    return (np.asarray(x, dtype=np.float64) - mean).astype(_float(x))


@_work(40)
def semblance(x: np.ndarray, *, traces: int = 3, samples: int = 5, axis: int = -1) -> np.ndarray:
    """Local semblance (coherence in ``[0, 1]``) of a 3-D cube: for each sample, over the
    ``traces x traces`` neighbouring traces and ``samples`` samples along ``axis`` (time),
    ``sum_t (sum_traces x)^2 / (N sum_t sum_traces x^2)``. Windows are truncated at the array's
    edges; 0 where the window is all zero. Halo: ``traces // 2`` on the two trace axes and
    ``samples // 2`` along ``axis``."""
    if x.ndim != 3:
        raise ConfigError(f"semblance needs a 3-D cube, got {x.ndim} axes")
    t = _window(traces, "semblance traces")
    s = _window(samples, "semblance samples")
    axis = axis % 3
    trace_axes = [a for a in range(3) if a != axis]
    stack = np.asarray(x, dtype=np.float64)
    energy = np.square(stack)
    for a in trace_axes:  # mean over the traces present
        stack = _box_mean(stack, t, a)
        energy = _box_mean(energy, t, a)
    num = _box_mean(np.square(stack), s, axis)
    den = _box_mean(energy, s, axis)
    out = np.divide(num, den, out=np.zeros_like(num), where=den > 0)
    return out.astype(_float(x))


__all__ = [
    "anomaly",
    "envelope",
    "gradient_magnitude",
    "instantaneous_frequency",
    "instantaneous_phase",
    "rms_amplitude",
    "rolling_mean",
    "semblance",
]
