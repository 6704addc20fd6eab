"""Global states with learnable dynamics, for the forecast example (``shardload sample states``).

Three fields on a regular global latitude/longitude grid, 6-hourly, written as one netCDF
(``time, latitude, longitude``) that ``configs/era5-states.yaml`` prepares into a dated store:

- ``t`` (K): advected eastward by a zonal wind that depends on latitude only
  (:func:`zonal_shift_cells`: 1 to 3 grid cells per step), diffused, relaxed towards a
  zonal climate and driven by a spatially smooth random forcing;
- ``q`` (g/kg): advected by the same wind, relaxed towards a value set by ``t``'s anomaly;
- ``z`` (m): a smoothed, scaled copy of ``t``'s anomaly (a diagnostic field).

With ``levels=L > 1`` each field comes on L levels as its own 2-D variable (``t_1`` ..
``t_L``, ``q_1`` .., ``z_1`` ..; 3 L channels): level k is the surface field shifted or scaled
(:func:`level_fields`), the same dynamics on every level, not a physical column. It gives
states as wide as an operational model's (``--lat 440 --lon 1232 --levels 20``: 542,080 cells,
as many as the N320 reduced Gaussian grid has, on a regular grid, x 60 channels, 130 MB a
state) for loader benchmarks.

The next state is a fixed function of the current one (shift, diffusion, relaxation) plus
the new forcing, which is unpredictable: persistence misses the motion, a model that learns
the wind is left with the forcing only. Pure numpy but for the netCDF writer (xarray).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from shardload.errors import ConfigError
from shardload.samples.era5 import write_netcdf
from shardload.samples.stamp import reusable, sample_stamp

FILE_NAME = "states-6h.nc"
VARIABLES = ("t", "q", "z")
#: relaxation per step towards the climate, diffusion coefficient (cells^2 per step)
RELAX, DIFFUSION = 0.02, 0.03
#: the random forcing's standard deviation per step (K) and its smoothing length (cells)
FORCING_K, FORCING_CELLS = 0.6, 3.0
SPIN_UP_STEPS = 200


def zonal_shift_cells(lat_deg: np.ndarray) -> np.ndarray:
    """Eastward displacement per 6-hour step in grid cells at each latitude: a jet of 3 cells
    at 45 degrees north and south, 1 at the equator and the poles."""
    return 1.0 + 2.0 * np.sin(np.deg2rad(2 * np.abs(lat_deg))) ** 2


def _shift(f: np.ndarray, cells: np.ndarray) -> np.ndarray:
    """Each row of ``f`` (lat, lon) moved east by ``cells[row]`` (fractional, periodic: FFT)."""
    k = np.fft.rfftfreq(f.shape[1]) * f.shape[1]
    phase = np.exp(-2j * np.pi * k[None, :] * cells[:, None] / f.shape[1])
    return np.fft.irfft(np.fft.rfft(f, axis=1) * phase, n=f.shape[1], axis=1)


def _laplacian(f: np.ndarray) -> np.ndarray:
    """5-point Laplacian, periodic in longitude, zero flux at the poles."""
    padded = np.pad(f, ((1, 1), (0, 0)), mode="edge")
    return padded[:-2] + padded[2:] + np.roll(f, 1, axis=1) + np.roll(f, -1, axis=1) - 4 * f


def _smooth_noise(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """Unit-variance Gaussian noise smoothed over about FORCING_CELLS cells (spectral)."""
    white = rng.standard_normal(shape)
    ky = np.fft.fftfreq(shape[0])[:, None]
    kx = np.fft.rfftfreq(shape[1])[None, :]
    gain = np.exp(-((ky**2 + kx**2) * (np.pi * FORCING_CELLS) ** 2))
    out = np.fft.irfft2(np.fft.rfft2(white) * gain, s=shape)
    return out / out.std()


def states_fields(*, dates: int, lat: int, lon: int, seed: int) -> dict[str, np.ndarray]:
    """``t``, ``q``, ``z`` as float32 (dates, lat, lon) and the coordinates ``latitude``,
    ``longitude`` (degrees, cell centres), reproducible from ``seed`` (pure numpy)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 27]))
    lats = 90.0 - (np.arange(lat) + 0.5) * 180.0 / lat
    lons = np.arange(lon) * 360.0 / lon
    cells = zonal_shift_cells(lats)
    phi = np.deg2rad(lats)[:, None]
    climate = np.broadcast_to(300.0 - 45.0 * np.sin(phi) ** 2, (lat, lon))
    anomaly = np.zeros((lat, lon))
    q = np.zeros((lat, lon))
    out = {v: np.empty((dates, lat, lon), dtype=np.float32) for v in VARIABLES}
    for step in range(-SPIN_UP_STEPS, dates):
        anomaly = _shift(anomaly, cells)
        anomaly += DIFFUSION * _laplacian(anomaly) - RELAX * anomaly
        anomaly += FORCING_K * _smooth_noise(rng, (lat, lon))
        q = _shift(q, cells)
        q += DIFFUSION * _laplacian(q) + 0.1 * (0.4 * anomaly - q)
        if step >= 0:
            out["t"][step] = climate + anomaly
            out["q"][step] = 8.0 * np.cos(phi) ** 2 + q
            smooth = anomaly + 0.25 * _laplacian(anomaly)
            out["z"][step] = 5500.0 + 12.0 * smooth
    return {**out, "latitude": lats, "longitude": lons}


def level_names(levels: int) -> list[str]:
    """The variables of a sample with ``levels`` levels: ``t, q, z`` for 1, else ``t_1`` ..
    ``t_L``, ``q_1`` .., ``z_1`` .. (field-major).

    >>> level_names(2)
    ['t_1', 't_2', 'q_1', 'q_2', 'z_1', 'z_2']
    """
    if levels == 1:
        return list(VARIABLES)
    return [f"{v}_{k}" for v in VARIABLES for k in range(1, levels + 1)]


def level_fields(f: dict[str, np.ndarray], levels: int) -> dict[str, np.ndarray]:
    """Each of ``t, q, z`` on ``levels`` levels (float32): level k (1 the lowest) is ``t``
    6.5 K colder per level, ``q`` times ``exp(-(k - 1) / 4)``, ``z`` 1,500 m higher per level."""
    if levels == 1:
        return {v: f[v] for v in VARIABLES}
    out = {}
    for k in range(levels):
        out[f"t_{k + 1}"] = f["t"] - np.float32(6.5 * k)
        out[f"q_{k + 1}"] = f["q"] * np.float32(np.exp(-k / 4))
        out[f"z_{k + 1}"] = f["z"] + np.float32(1500.0 * k)
    return {name: out[name] for name in level_names(levels)}


def write_states_sample(
    out_dir: str | os.PathLike[str],
    *,
    dates: int = 2920,
    lat: int = 32,
    lon: int = 64,
    seed: int = 0,
    start: str = "2020-01-01T00:00",
    reuse: bool = False,
    levels: int = 1,
) -> Path:
    """Write ``out_dir/states-6h.nc`` (renamed into place when complete); with ``levels > 1``
    the variables of :func:`level_names`. ``reuse``: keep the file already there when it
    carries this generator's stamp for these options (:mod:`~shardload.samples.stamp`); else
    write it again, logging why."""
    import xarray as xr

    if dates < 2 or lat < 4 or lon < 8 or levels < 1:
        raise ConfigError(
            f"need dates >= 2, lat >= 4, lon >= 8, levels >= 1; got {dates}, {lat}, {lon}, {levels}"
        )
    options = {"dates": dates, "lat": lat, "lon": lon, "seed": seed, "start": start}
    if levels != 1:
        options["levels"] = levels
    if reuse and reusable(Path(out_dir) / FILE_NAME, "states", options):
        return Path(out_dir) / FILE_NAME
    f = states_fields(dates=dates, lat=lat, lon=lon, seed=seed)
    fields = level_fields(f, levels)
    time = np.datetime64(start, "ns") + np.arange(dates) * np.timedelta64(6, "h")
    dims = ("time", "latitude", "longitude")
    units = {"t": "K", "q": "g kg**-1", "z": "m"}
    ds = xr.Dataset(
        {v: (dims, a, {"units": units[v[0]]}) for v, a in fields.items()},
        coords={
            "time": time,
            "latitude": ("latitude", f["latitude"], {"units": "degrees_north"}),
            "longitude": ("longitude", f["longitude"], {"units": "degrees_east"}),
        },
        attrs={
            "comment": "synthetic 6-hourly states written by 'shardload sample states' "
            f"(seed {seed}): advection by a zonal wind of 1 to 3 cells per step, diffusion, "
            "relaxation and a smooth random forcing; not ERA5 data",
            **sample_stamp("states", options),
        },
    )
    return write_netcdf(ds, out_dir, FILE_NAME)
