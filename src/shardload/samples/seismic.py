"""A synthetic seismic cube, streamed to Zarr block by block (``shardload sample seismic``).

Layered reflectivity (gently dipping, folded horizons with random reflection coefficients),
displaced by a few vertical normal faults, convolved with a Ricker wavelet along time, plus
Gaussian noise. Axes ``(inline, crossline, time)``, float32. Every inline is computed on its own
(noise seeded per inline), so the cube does not depend on the block size used to write it.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from shardload.errors import ConfigError
from shardload.layout import PARTIAL_SUFFIX
from shardload.samples.stamp import sample_stamp, why_outdated

log = logging.getLogger(__name__)

DIMS = ("inline", "crossline", "time")


@dataclass(frozen=True)
class SeismicModel:
    """The geology, drawn once from the seed: horizons, coefficients, faults."""

    shape: tuple[int, int, int]
    depths: np.ndarray  # (L,) mean time sample of each horizon
    coefs: np.ndarray  # (L,) reflection coefficients
    dips: np.ndarray  # (L, 2) samples per inline / crossline
    folds: np.ndarray  # (L, 3) amplitude (samples), wavelength inline, wavelength crossline
    faults: np.ndarray  # (F, 4) normal (cos, sin), offset, throw (samples)


def draw_model(shape: Sequence[int], *, seed: int = 0, faults: int = 3) -> SeismicModel:
    ni, nj, nk = (int(s) for s in shape)
    rng = np.random.default_rng(seed)
    layers = max(2, nk // 12)
    depths = np.sort(rng.uniform(0.05 * nk, 0.95 * nk, layers))
    coefs = rng.uniform(-1, 1, layers) * rng.choice([0.3, 1.0], layers)
    dips = rng.uniform(-0.08, 0.08, (layers, 2)) * nk / max(ni, nj, 1)
    folds = np.column_stack(
        [
            rng.uniform(0, 0.03 * nk, layers),
            rng.uniform(0.5, 2, layers) * ni,
            rng.uniform(0.5, 2, layers) * nj,
        ]
    )
    theta = rng.uniform(0, np.pi, faults)
    centre = rng.uniform(0.2, 0.8, (faults, 2)) * [ni, nj]
    offset = centre[:, 0] * np.cos(theta) + centre[:, 1] * np.sin(theta)
    throw = rng.uniform(0.02, 0.08, faults) * nk
    fault_arr = np.column_stack([np.cos(theta), np.sin(theta), offset, throw])
    return SeismicModel((ni, nj, nk), depths, coefs, dips, folds, fault_arr)


def ricker(freq: float, dt: float, *, half_samples: int | None = None) -> np.ndarray:
    """Ricker wavelet of peak frequency ``freq`` (Hz) sampled every ``dt`` (s)."""
    h = half_samples if half_samples is not None else int(np.ceil(1.5 / (freq * dt)))
    t = np.arange(-h, h + 1) * dt
    a = (np.pi * freq * t) ** 2
    return ((1 - 2 * a) * np.exp(-a)).astype(np.float64)


def seismic_inlines(
    model: SeismicModel,
    start: int,
    stop: int,
    *,
    seed: int = 0,
    noise: float = 0.05,
    freq: float = 25.0,
    dt: float = 0.004,
) -> np.ndarray:
    """Inlines ``[start, stop)`` of the cube, float32 ``(stop - start, nj, nk)``."""
    _, nj, nk = model.shape
    i = np.arange(start, stop, dtype=np.float64)[:, None]
    j = np.arange(nj, dtype=np.float64)[None, :]
    shift = np.zeros((stop - start, nj))
    for cos, sin, off, throw in model.faults:
        shift += np.where(i * cos + j * sin > off, throw, 0.0)  # hanging wall down
    refl = np.zeros((stop - start, nj, nk))
    rows, cols = np.indices((stop - start, nj))
    for d, c, (di, dj), (amp, li, lj) in zip(
        model.depths, model.coefs, model.dips, model.folds, strict=True
    ):
        z = d + di * i + dj * j + amp * np.sin(2 * np.pi * i / li) * np.cos(2 * np.pi * j / lj)
        z = np.rint(z + shift).astype(np.int64)
        ok = (z >= 0) & (z < nk)
        refl[rows[ok], cols[ok], z[ok]] += c
    w = ricker(freq, dt)
    n = nk + len(w) - 1
    h = len(w) // 2
    trace = np.fft.irfft(np.fft.rfft(refl, n, axis=-1) * np.fft.rfft(w, n), n, axis=-1)
    out = trace[..., h : h + nk]
    for r, il in enumerate(range(start, stop)):  # per inline: independent of the block size
        out[r] += noise * np.random.default_rng([seed, il]).standard_normal((nj, nk))
    return out.astype(np.float32)


def _checked_output(
    out: str | os.PathLike[str], shape: Sequence[int], chunk_inlines: int, overwrite: bool
) -> Path:
    """The output path of a sample cube, after checking the options (before any I/O)."""
    if len(shape) != 3 or any(int(s) < 1 for s in shape):
        raise ConfigError(f"--shape: {tuple(shape)}; give three positive sizes I J K")
    if chunk_inlines < 1:
        raise ConfigError(f"--chunk-inlines: {chunk_inlines}; give a positive number")
    path = Path(out)
    if path.exists() and not overwrite:
        raise ConfigError(f"{path} exists; pass --overwrite to replace it")
    return path


def write_seismic_sample(
    out: str | os.PathLike[str],
    shape: Sequence[int],
    *,
    seed: int = 0,
    faults: int = 3,
    noise: float = 0.05,
    chunk_inlines: int = 64,
    overwrite: bool = False,
) -> Path:
    """Write the cube to a Zarr v3 folder (variable ``amp``, chunks of ``chunk_inlines``
    inlines), block by block (memory: one block), renamed into place when complete. Without
    ``overwrite`` an existing ``out`` is kept when it is this generator's cube for these
    options (its stamp, :mod:`~shardload.samples.stamp`), and refused otherwise."""
    import zarr

    path = _checked_output(out, shape, chunk_inlines, overwrite=True)
    options = {
        "shape": [int(n) for n in shape],
        "seed": seed,
        "faults": faults,
        "noise": float(noise),
        "chunk_inlines": chunk_inlines,
    }
    if path.exists() and not overwrite:
        why = why_outdated(path, "seismic", options)
        if why is None:
            log.info("reusing %s: up to date", path)
            return path
        raise ConfigError(f"{path} exists and is not this sample cube ({why}); pass --overwrite")
    out = path
    tmp = out.with_name(out.name + PARTIAL_SUFFIX)
    shutil.rmtree(tmp, ignore_errors=True)
    model = draw_model(shape, seed=seed, faults=faults)
    ni, nj, nk = model.shape
    g = zarr.open_group(store=str(tmp), mode="w", zarr_format=3)
    g.attrs.update(sample_stamp("seismic", options))
    arr = g.create_array(
        "amp",
        shape=model.shape,
        chunks=(min(chunk_inlines, ni), nj, nk),
        dtype="float32",
        dimension_names=DIMS,
        attributes={"long_name": "synthetic seismic amplitude", "seed": seed},
    )
    for a in range(0, ni, chunk_inlines):
        b = min(a + chunk_inlines, ni)
        arr[a:b] = seismic_inlines(model, a, b, seed=seed, noise=noise)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return out


def write_seismic_segy(
    out: str | os.PathLike[str],
    shape: Sequence[int],
    *,
    seed: int = 0,
    faults: int = 3,
    noise: float = 0.05,
    chunk_inlines: int = 64,
    overwrite: bool = False,
) -> Path:
    """The same cube as :func:`write_seismic_sample`, as an inline-sorted SEG-Y file written by
    segyio (extra ``segy``): IEEE float32 samples (format 5, bit-exact), inline numbers from 1,
    crossline numbers from 1, 4 ms; block by block (memory: one block of inlines), renamed into
    place when complete. ``shardload compute`` and ``prepare`` read it (variable ``data``)."""
    from shardload.errors import require

    segyio = require("segyio", "segy")
    out = _checked_output(out, shape, chunk_inlines, overwrite)
    tmp = out.with_name(out.name + PARTIAL_SUFFIX)
    model = draw_model(shape, seed=seed, faults=faults)
    ni, nj, nk = model.shape
    spec = segyio.spec()
    spec.format, spec.sorting = 5, 2  # IEEE float, inline sorted
    spec.samples = list(range(0, 4 * nk, 4))
    spec.ilines, spec.xlines = list(range(1, ni + 1)), list(range(1, nj + 1))
    with segyio.create(str(tmp), spec) as f:
        f.bin.update(hdt=4000, hns=nk, tsort=2)
        for a in range(0, ni, chunk_inlines):
            b = min(a + chunk_inlines, ni)
            block = seismic_inlines(model, a, b, seed=seed, noise=noise)
            for i in range(a, b):
                for j in range(nj):
                    t = i * nj + j
                    f.header[t] = {
                        segyio.TraceField.INLINE_3D: i + 1,
                        segyio.TraceField.CROSSLINE_3D: j + 1,
                        segyio.TraceField.TRACE_SAMPLE_INTERVAL: 4000,
                        segyio.TraceField.TRACE_SAMPLE_COUNT: nk,
                    }
                    f.trace[t] = np.ascontiguousarray(block[i - a, j], dtype=np.float32)
    os.replace(tmp, out)
    return out
