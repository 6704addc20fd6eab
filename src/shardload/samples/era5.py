"""A synthetic ERA5 series in the schema of cfgrib's ``era5-levels-members.nc``, longer in time.

The real sample (cfgrib's test data: ``z`` and ``t`` on ``(number 10, time 4, isobaricInhPa 2,
latitude 61, longitude 120)``) has 4 time steps, too few to cut look-back windows into train and
validation time ranges. This writes the same variables, dims, coordinates, units and dtypes with
as many 12-hourly steps as asked, so ``configs/era5-window.yaml`` has windows to split.

The fields are a caricature with real structure: a zonal-mean climate (warm equator, cold
poles, 850 hPa warmer and lower than 500 hPa) plus a few planetary waves travelling east at
their own speeds, per member with its own phases, and a little noise. The next step of each
point is therefore a smooth function of its recent past (the waves' motion), which an LSTM can
learn; the noise is the part it cannot.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from shardload.errors import ConfigError
from shardload.samples.stamp import reusable, sample_stamp

LEVELS_HPA = (850.0, 500.0)
#: zonal wave numbers, their eastward speed (degrees of longitude per day) and amplitude (K)
WAVES = ((1, 4.0, 3.0), (3, 9.0, 4.0), (5, 14.0, 2.5))
FILE_NAME = "era5-levels-members.nc"


def era5_fields(
    *, members: int, times: int, seed: int, grid_deg: float = 3.0
) -> dict[str, np.ndarray]:
    """``t`` (K) and ``z`` (m2 s-2) as float32 (number, time, level, latitude, longitude),
    with the coordinates ``latitude``, ``longitude`` (degrees) and ``hours`` (pure numpy)."""
    rng = np.random.default_rng(np.random.SeedSequence([seed, 5]))
    lat = np.linspace(90.0, -90.0, round(180 / grid_deg) + 1)
    lon = np.arange(0.0, 360.0, grid_deg)
    hours = np.arange(times) * 12.0
    phi, lam = np.deg2rad(lat)[:, None], np.deg2rad(lon)[None, :]
    envelope = np.cos(phi) ** 2 * np.sin(2 * phi) ** 2 + 0.3 * np.cos(phi) ** 2
    shape = (members, times, len(LEVELS_HPA), lat.size, lon.size)
    t = np.empty(shape, dtype=np.float32)
    z = np.empty(shape, dtype=np.float32)
    phases = rng.uniform(0, 2 * np.pi, (members, len(WAVES)))
    for m in range(members):
        for i, h in enumerate(hours):
            wave = np.zeros((lat.size, lon.size))
            for (k, speed, amp), ph in zip(WAVES, phases[m], strict=True):
                wave += amp * np.cos(k * (lam - np.deg2rad(speed * h / 24.0)) + ph)
            wave *= envelope
            for j, (base_t, base_z, dz) in enumerate(
                ((288.0, 14_000.0, 90.0), (262.0, 55_000.0, 180.0))
            ):
                climate = base_t - 40.0 * np.sin(phi) ** 2
                noise = rng.normal(0.0, 0.3, (lat.size, lon.size))
                t[m, i, j] = climate + (1.0 + 0.4 * j) * wave + noise
                z[m, i, j] = base_z + dz * (climate - base_t) + 900.0 * (1 + j) * wave + 30 * noise
    return {"t": t, "z": z, "latitude": lat, "longitude": lon, "hours": hours}


def write_era5_sample(
    out_dir: str | os.PathLike[str],
    *,
    members: int = 2,
    times: int = 32,
    seed: int = 0,
    grid_deg: float = 3.0,
    reuse: bool = False,
) -> Path:
    """Write ``out_dir/era5-levels-members.nc`` (renamed into place when complete).
    ``reuse``: keep the file already there when it carries this generator's stamp for these
    options (:mod:`~shardload.samples.stamp`); else write it again, logging why."""
    import xarray as xr

    if members < 1 or times < 1:
        raise ConfigError(f"members and times must be >= 1, got {members}, {times}")
    if not 0 < grid_deg <= 90 or (180 / grid_deg) % 1 or (360 / grid_deg) % 1:
        raise ConfigError(f"grid_deg must divide 180 and 360, got {grid_deg}")
    options = {"members": members, "times": times, "seed": seed, "grid_deg": float(grid_deg)}
    if reuse and reusable(Path(out_dir) / FILE_NAME, "era5", options):
        return Path(out_dir) / FILE_NAME
    f = era5_fields(members=members, times=times, seed=seed, grid_deg=grid_deg)
    time = np.datetime64("2017-01-01T00:00", "ns") + (f["hours"] * 3600e9).astype("timedelta64[ns]")
    dims = ("number", "time", "isobaricInhPa", "latitude", "longitude")
    ds = xr.Dataset(
        {
            "z": (dims, f["z"], {"units": "m**2 s**-2", "long_name": "Geopotential"}),
            "t": (dims, f["t"], {"units": "K", "long_name": "Temperature"}),
        },
        coords={
            "number": np.arange(members),
            "time": time,
            "step": np.timedelta64(0, "ns"),
            "isobaricInhPa": ("isobaricInhPa", np.array(LEVELS_HPA), {"units": "hPa"}),
            "latitude": ("latitude", f["latitude"], {"units": "degrees_north"}),
            "longitude": ("longitude", f["longitude"], {"units": "degrees_east"}),
            "valid_time": ("time", time),
        },
        attrs={
            "Conventions": "CF-1.7",
            "comment": "synthetic ERA5-like series written by 'shardload sample era5' "
            f"(seed {seed}); the schema of cfgrib's era5-levels-members.nc, not ERA5 data",
            **sample_stamp("era5", options),
        },
    )
    return write_netcdf(ds, out_dir, FILE_NAME)


def write_netcdf(ds: Any, out_dir: str | os.PathLike[str], name: str) -> Path:
    """Write ``ds`` to ``out_dir/name`` whole or not at all (a hidden ``.partial`` file renamed
    into place): an interrupted sample command leaves no file a prepare would take."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    final = out / name
    tmp = out / f".{name}.partial"
    try:
        ds.to_netcdf(tmp)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final
