"""Physically plausible synthetic columns in the MAELSTROM radiation schema (pure numpy).

The schema (names, dims, dtypes, units, long names) is that of the raw MAELSTROM
``rad4NN_inputs_*`` files, identical to ecRad's ``ecrad_meridian.nc`` test input, and of the
``3dcorrection_outputs_*`` files (flux differences, SPARTACUS minus Tripleclouds).

The fields are cheap caricatures of the atmosphere, not physics: pressure follows a fixed
L137-like profile scaled by a surface pressure, temperature a lapse rate / tropopause /
stratosphere profile, clouds a few random layers, and the 3D flux corrections are a
deterministic function of the profiles (as ecRad's are): the cumulated broken-cloud amount
``cf * (1 - cf)`` times a column factor from the sun, the albedo and the temperatures. Every value stays inside
the per-feature maxima that the MAELSTROM normalisation uses.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

NUM_LEVELS = 137
NUM_HALF_LEVELS = NUM_LEVELS + 1
NUM_INTERFACES = NUM_LEVELS - 1
NUM_SW_BANDS = 6
NUM_LW_BANDS = 2
NUM_AEROSOLS = 12

DIMS = {
    "column": None,  # the sample dim; its size is the file's column count
    "sw_albedo_band": NUM_SW_BANDS,
    "lw_emissivity_band": NUM_LW_BANDS,
    "half_level": NUM_HALF_LEVELS,
    "level": NUM_LEVELS,
    "level_interface": NUM_INTERFACES,
    "aerosol_type": NUM_AEROSOLS,
}
OUTPUT_DIMS = {"column": None, "half_level": NUM_HALF_LEVELS}


class VarSpec(NamedTuple):
    """One variable of a raw file: dims, dtype and CF attributes."""

    name: str
    dims: tuple[str, ...]
    dtype: str
    long_name: str
    units: str


_C, _L, _H = ("column",), ("column", "level"), ("column", "half_level")

#: Input variables in the order of ``ecrad_meridian.nc``.
INPUT_VARIABLES: tuple[VarSpec, ...] = (
    VarSpec("solar_irradiance", (), "f4", "Solar irradiance at Earth's orbit", "W m-2"),
    VarSpec("lat", _C, "f4", "Latitude", "degrees_north"),
    VarSpec("lon", _C, "f4", "Longitude", "degrees_east"),
    VarSpec("skin_temperature", _C, "f4", "Skin_temperature", "K"),
    VarSpec("cos_solar_zenith_angle", _C, "f4", "Cosine of the solar zenith angle", "1"),
    VarSpec(
        "sw_albedo",
        ("column", "sw_albedo_band"),
        "f4",
        "Shortwave surface albedo to diffuse radiation",
        "1",
    ),
    VarSpec(
        "sw_albedo_direct",
        ("column", "sw_albedo_band"),
        "f4",
        "Shortwave surface albedo to direct radiation",
        "1",
    ),
    VarSpec(
        "lw_emissivity", ("column", "lw_emissivity_band"), "f4", "Longwave surface emissivity", "1"
    ),
    VarSpec("iseed", _C, "f8", "Seed for random-number generator", "1"),
    VarSpec("pressure_hl", _H, "f4", "Pressure", "Pa"),
    VarSpec("temperature_hl", _H, "f4", "Temperature", "K"),
    VarSpec("q", _L, "f4", "Specific humidity", "1"),
    VarSpec("o3_mmr", _L, "f4", "Ozone mass mixing ratio", "1"),
    VarSpec("co2_vmr", _L, "f4", "CO2 volume mixing ratio", "1"),
    VarSpec("n2o_vmr", _L, "f4", "N2O volume mixing ratio", "1"),
    VarSpec("ch4_vmr", _L, "f4", "CH4 volume mixing ratio", "1"),
    VarSpec("o2_vmr", _L, "f4", "O2 volume mixing ratio", "1"),
    VarSpec("cfc11_vmr", _L, "f4", "CFC11 volume mixing ratio", "1"),
    VarSpec("cfc12_vmr", _L, "f4", "CFC12 volume mixing ratio", "1"),
    VarSpec("hcfc22_vmr", _L, "f4", "HCFC22 volume mixing ratio", "1"),
    VarSpec("ccl4_vmr", _L, "f4", "CCl4 volume mixing ratio", "1"),
    VarSpec("cloud_fraction", _L, "f4", "Cloud fraction", "1"),
    VarSpec("q_liquid", _L, "f4", "Gridbox-mean liquid water mixing ratio", "1"),
    VarSpec("q_ice", _L, "f4", "Gridbox-mean ice water mixing ratio", "1"),
    # "Ice effective radius" for re_liquid is what the real files say (an ecRad quirk); kept.
    VarSpec("re_liquid", _L, "f4", "Ice effective radius", "m"),
    VarSpec("re_ice", _L, "f4", "Ice effective radius", "m"),
    VarSpec("overlap_param", ("column", "level_interface"), "f4", "Cloud overlap parameter", "1"),
    VarSpec(
        "fractional_std", _L, "f4", "Fractional standard deviation of cloud optical depth", "1"
    ),
    VarSpec(
        "inv_cloud_effective_size", _L, "f4", "Inverse of cloud effective horizontal size", "m-1"
    ),
    VarSpec(
        "aerosol_mmr",
        ("column", "aerosol_type", "level"),
        "f4",
        "Aerosol mass mixing ratio",
        "kg kg-1",
    ),
)

#: Output variables of the 3dcorrection files (fluxes are SPARTACUS minus Tripleclouds).
OUTPUT_VARIABLES: tuple[VarSpec, ...] = (
    VarSpec("pressure_hl", _H, "f4", "Pressure", "Pa"),
    VarSpec("flux_up_lw", _H, "f4", "Upwelling longwave flux", "W m-2"),
    VarSpec("flux_dn_lw", _H, "f4", "Downwelling longwave flux", "W m-2"),
    VarSpec("flux_up_sw", _H, "f4", "Upwelling shortwave flux", "W m-2"),
    VarSpec("flux_dn_sw", _H, "f4", "Downwelling shortwave flux", "W m-2"),
)

# Mean ratio pressure_hl / surface pressure of an IFS L137 column at these half-level
# fractions (a coarse description of the L137 grid; interpolated in log space).
_ETA_KNOTS = np.array([1, 8, 16, 24, 32, 48, 64, 80, 96, 112, 120, 128, 137]) / 137
_RATIO_KNOTS = np.array(
    [2e-5, 2.6e-4, 1.67e-3, 5.9e-3, 1.5e-2, 5.4e-2, 0.19, 0.38, 0.52, 0.82, 0.915, 0.969, 1.0]
)
_PRESSURE_RATIO = np.concatenate(
    [[0.0], np.exp(np.interp(np.arange(1, 138) / 137, _ETA_KNOTS, np.log(_RATIO_KNOTS)))]
)

#: Upper bounds used by MAELSTROM for normalisation; generated values never exceed them.
MAX_SW_ALBEDO = np.array([1, 1, 1, 0.90557, 0.85934, 0.86475])
MAX_SW_ALBEDO_DIRECT = np.array([1, 1, 1, 0.90622, 0.90156, 0.90156])
MAX_SKIN_TEMPERATURE = 344.121
MAX_COS_SZA = 0.9976
MAX_SOLAR_IRRADIANCE = 1407.193
MAX_TEMPERATURE_HL = 330.898
MAX_PRESSURE_HL = 107193.5
MAX_OVERLAP = 0.993204

# Typical surface mass mixing ratios of the 12 IFS aerosol types (kg/kg).
_AEROSOL_SURFACE = np.array(
    [4e-9, 1.2e-7, 1.5e-7, 1.5e-8, 5e-8, 7e-8, 2e-9, 2e-9, 6e-10, 5e-10, 2e-9, 4e-10]
)
_SURFACE_GASES = {  # name: (surface volume mixing ratio, stratospheric decay exponent)
    "co2_vmr": (3.95e-4, 0.02),
    "n2o_vmr": (3.2e-7, 1.0),
    "ch4_vmr": (1.8e-6, 0.6),
    "cfc11_vmr": (2.4e-10, 3.0),
    "cfc12_vmr": (5.2e-10, 2.0),
    "hcfc22_vmr": (1.7e-10, 1.5),
    "ccl4_vmr": (8.8e-11, 3.0),
}


def day_of_year(date: str) -> int:
    """Days since 1 January of ``date`` (``YYYYMMDD``); 0 on 1 January."""
    start = np.datetime64(f"{date[:4]}-01-01", "D")
    delta = np.datetime64(f"{date[:4]}-{date[4:6]}-{date[6:8]}", "D") - start
    return int(delta.astype(np.int64))


def solar_irradiance(date: str) -> float:
    """Total solar irradiance on ``date`` (``YYYYMMDD``), with the Earth-Sun distance cycle."""
    value = 1361.0 * (1.0 + 0.0334 * np.cos(2 * np.pi * (day_of_year(date) - 3) / 365.25))
    return float(min(value, MAX_SOLAR_IRRADIANCE))


def generate_inputs(
    rng: np.random.Generator, num_columns: int, *, date: str, timestep: int, patch: int
) -> dict[str, np.ndarray]:
    """Input fields of ``num_columns`` columns, keyed by variable name, in the schema's dtypes.

    Patch ``p`` of 16 holds the latitude band ``p`` (equal areas, south to north); the
    timestep sets the UTC hour of the solar geometry (3 h per 125 steps).
    """
    n = num_columns
    day = day_of_year(date)
    band = patch % 16
    sin_lat = -1 + (band + rng.random(n)) / 8
    lat = np.arcsin(np.clip(sin_lat, -1, 1))
    lon = rng.random(n) * 2 * np.pi
    hour = (timestep / 125 * 3) % 24
    decl = np.deg2rad(-23.44) * np.cos(2 * np.pi * (day + 10) / 365.25)
    hour_angle = lon + (hour - 12) / 24 * 2 * np.pi
    mu = np.sin(lat) * np.sin(decl) + np.cos(lat) * np.cos(decl) * np.cos(hour_angle)
    mu = np.clip(mu, 0.0, MAX_COS_SZA)  # night: exactly 0, as the raw files store it

    surface_pressure = np.clip(
        rng.normal(100_500, 1500, n) - rng.exponential(4000, n), 55_000, 106_000
    )
    p_hl = _PRESSURE_RATIO[None, :] * surface_pressure[:, None]
    p_full = 0.5 * (p_hl[:, 1:] + p_hl[:, :-1])

    t_surface = 302 - 50 * np.sin(lat) ** 2 + 6 * mu + rng.normal(0, 4, n)
    t_surface = np.clip(t_surface, 215, 318)
    t_hl = _temperature(p_hl, surface_pressure, t_surface, lat)
    t_full = 0.5 * (t_hl[:, 1:] + t_hl[:, :-1])
    skin = np.clip(t_surface + 8 * mu + rng.normal(0, 2, n), 205, MAX_SKIN_TEMPERATURE)

    sigma = p_full / surface_pressure[:, None]
    out: dict[str, np.ndarray] = {
        "solar_irradiance": np.asarray(solar_irradiance(date), np.float32),
        "lat": np.rad2deg(lat),
        "lon": np.rad2deg(lon),
        "skin_temperature": skin,
        "cos_solar_zenith_angle": mu,
        "iseed": rng.integers(250_000_000, 260_000_000, n).astype(np.float64),
        "pressure_hl": p_hl,
        "temperature_hl": t_hl,
    }
    out.update(_surface(rng, lat, mu))
    out.update(_gases(rng, p_full, sigma, t_surface, surface_pressure))
    out.update(_clouds(rng, t_full, p_full, sigma))
    # interface i sits on half level i + 1, between levels i and i + 1 (hypsometric thickness)
    dz = 29.3 * t_hl[:, 1:-1] * np.log(p_full[:, 1:] / p_full[:, :-1])
    out["overlap_param"] = np.clip(np.exp(-dz / 2000.0), 0.0, MAX_OVERLAP)
    aerosol_scale = _AEROSOL_SURFACE[None, :] * rng.uniform(0.05, 1.0, (n, NUM_AEROSOLS))
    out["aerosol_mmr"] = aerosol_scale[:, :, None] * (sigma**6)[:, None, :]
    return {name: _cast(name, value) for name, value in out.items()}


#: levels over which the broken-cloud amount is spread (either side) before it is cumulated
SPREAD_LEVELS = 6


def generate_outputs(
    rng: np.random.Generator, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """3D-correction outputs (SPARTACUS minus Tripleclouds fluxes) for these input columns.

    A function of the input profiles alone (as the real outputs are; ``rng`` draws nothing):
    differences grow with the broken-cloud amount ``cf * (1 - cf)``, spread over a few levels,
    cumulated from the top (down fluxes) or from the surface (up fluxes). Their size follows
    the column: the shortwave ones scale with the incoming sunlight ``S * mu``, more at low sun
    (cloud sides catch it), the upward one with the surface albedo; the longwave ones with the
    cloud-weighted temperature (down) and the skin temperature (up). Clear columns have no 3D effect (exact zeros), and
    night columns no shortwave one.
    """
    del rng  # kept in the signature: the streams of the inputs stay those of earlier versions
    cf = inputs["cloud_fraction"].astype(np.float64)
    n = cf.shape[0]
    # light scattered off cloud sides reaches a few levels around a cloud: the broken-cloud
    # amount is spread over SPREAD_LEVELS levels before it is cumulated (smooth profiles)
    edges = np.cumsum(np.pad(4 * cf * (1 - cf), ((0, 0), (SPREAD_LEVELS, SPREAD_LEVELS))), axis=1)
    spread = (edges[:, 2 * SPREAD_LEVELS :] - edges[:, : -2 * SPREAD_LEVELS]) / (2 * SPREAD_LEVELS)
    broken = np.concatenate([np.zeros((n, 1)), np.cumsum(spread, axis=1)], axis=1)
    from_top = np.tanh(broken)
    from_bottom = np.tanh(broken[:, -1:] - broken)
    mu = inputs["cos_solar_zenith_angle"].astype(np.float64)[:, None]
    sw_in = float(inputs["solar_irradiance"]) * mu
    albedo = inputs["sw_albedo"].astype(np.float64).mean(axis=1)[:, None]
    t_hl = inputs["temperature_hl"].astype(np.float64)
    t_full = 0.5 * (t_hl[:, 1:] + t_hl[:, :-1])
    weight = cf.sum(axis=1, keepdims=True)
    t_cloud = (cf * t_full).sum(axis=1, keepdims=True) / np.maximum(weight, 1e-12)
    skin = inputs["skin_temperature"].astype(np.float64)[:, None]
    fluxes = {
        "flux_dn_sw": sw_in * 0.02 * (1.2 - mu) * from_top,
        "flux_up_sw": -sw_in * 0.02 * (0.2 + albedo) * from_bottom,
        "flux_dn_lw": 0.02 * (t_cloud - 180.0) * from_top,
        "flux_up_lw": -0.02 * (skin - 180.0) * from_bottom,
    }
    out = {"pressure_hl": inputs["pressure_hl"], **fluxes}
    return {name: np.asarray(value, dtype=np.float32) for name, value in out.items()}


def _temperature(p_hl, surface_pressure, t_surface, lat):
    z_km = 7.0 * np.log(surface_pressure[:, None] / np.maximum(p_hl, 1.0))
    t_tropopause = (215 - 20 * np.cos(lat) ** 2)[:, None]
    t = np.maximum(t_surface[:, None] - 6.5 * z_km, t_tropopause)
    t = t + 1.6 * np.clip(z_km - 20, 0, 28) - 2.6 * np.clip(z_km - 50, 0, None)
    return np.clip(t, 180.0, MAX_TEMPERATURE_HL)


def _surface(rng, lat, mu):
    n = lat.size
    kind = rng.random(n)
    polar = np.abs(lat) > np.deg2rad(60)
    snow = (kind < 0.5) & polar
    land = (kind > 0.7) & ~snow
    base = np.where(
        snow,
        rng.uniform(0.55, 0.8, n),
        np.where(land, rng.uniform(0.1, 0.3, n), rng.uniform(0.04, 0.08, n)),
    )
    # snow is bright in the visible and darker in the near infrared; land the reverse
    shape = np.where(
        snow[:, None],
        [1.05, 1.05, 1.0, 0.8, 0.5, 0.2],
        np.where(land[:, None], [0.6, 0.8, 1.0, 1.2, 1.3, 1.1], 1.0),
    )
    diffuse = base[:, None] * shape * rng.uniform(0.95, 1.05, (n, 1))
    direct = diffuse * (1 + 0.15 * (1 - mu))[:, None]
    emissivity = np.stack([rng.uniform(0.93, 0.99, n), rng.uniform(0.95, 0.99, n)], axis=1)
    return {
        "sw_albedo": np.clip(diffuse, 0.02, np.minimum(MAX_SW_ALBEDO, 0.85)),
        "sw_albedo_direct": np.clip(direct, 0.02, np.minimum(MAX_SW_ALBEDO_DIRECT, 0.85)),
        "lw_emissivity": emissivity,
    }


def _gases(rng, p_full, sigma, t_surface, surface_pressure):
    n = p_full.shape[0]
    es = 611.2 * np.exp(17.67 * (t_surface - 273.15) / (t_surface - 29.65))
    q_surface = np.minimum(0.8 * 0.622 * es / surface_pressure, 0.025) * rng.uniform(0.5, 1.0, n)
    stratosphere = np.minimum(p_full / 20_000.0, 1.0)  # 1 in the troposphere, smaller above
    out = {
        "q": np.maximum(q_surface[:, None] * sigma**3, 2.5e-6),
        "o3_mmr": 3e-8 + 1.2e-5 * np.exp(-0.5 * np.log(np.maximum(p_full, 1.0) / 1000.0) ** 2),
        "o2_vmr": np.full_like(p_full, 0.20944),
    }
    for name, (surface, decay) in _SURFACE_GASES.items():
        jitter = rng.uniform(0.99, 1.01, (n, 1))
        out[name] = surface * jitter * stratosphere**decay
    return out


def _clouds(rng, t_full, p_full, sigma):
    n, nlev = t_full.shape
    levels = np.arange(nlev)
    active = rng.random((n, 3)) < np.array([0.35, 0.25, 0.15])
    centre = rng.integers(60, nlev, (n, 3))
    half_depth = rng.integers(0, 6, (n, 3))
    amount = np.where(active, rng.uniform(0.05, 1.0, (n, 3)), 0.0)
    inside = np.abs(levels[None, None, :] - centre[:, :, None]) <= half_depth[:, :, None]
    cf = np.max(np.where(inside, amount[:, :, None], 0.0), axis=1)
    water = cf * rng.uniform(1e-5, 2e-4, (n, 1)) * sigma
    liquid_share = np.clip((t_full - 250.0) / 23.0, 0.0, 1.0)
    re_liquid = rng.uniform(6e-6, 1.4e-5, (n, 1)) * (1 + 0.2 * sigma)
    re_ice = 1.5e-5 + 8.5e-5 * np.clip((t_full - 190.0) / 80.0, 0.0, 1.0)
    inv_size = np.where(sigma > 0.97, 1e-3, 1e-4) * np.ones_like(p_full)
    return {
        "cloud_fraction": cf,
        # the raw files floor cloud water at 1e-24 / 2e-24 instead of storing zeros
        "q_liquid": np.maximum(water * liquid_share, 1e-24),
        "q_ice": np.maximum(water * (1 - liquid_share), 2e-24),
        "re_liquid": np.clip(re_liquid, 4e-6, 2.1e-5),
        "re_ice": re_ice,
        "fractional_std": np.ones_like(p_full),
        "inv_cloud_effective_size": inv_size,
    }


_DTYPES = {v.name: np.dtype(v.dtype) for v in INPUT_VARIABLES}


def _cast(name: str, value) -> np.ndarray:
    out = np.asarray(value, dtype=_DTYPES[name])
    if out.ndim and out.dtype == np.float32:
        # flush float32 subnormals (e.g. aerosol high up) to zero: they slow down training math
        out[np.abs(out) < np.finfo(np.float32).tiny] = 0.0
    return out
