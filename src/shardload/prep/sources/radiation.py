"""Raw MAELSTROM radiation files -> a lazy dataset of the ML view (climetlab's packing).

The MAELSTROM radiation data set ships raw ecRad inputs (``rad4NN_inputs_*.nc``) and 3D
corrections (``3dcorrection_outputs_*.nc``). Its climetlab plugin, with ``raw_inputs=False``,
packs them into a few float32 arrays; :func:`open_radiation` builds the same arrays lazily
(xarray + dask, nothing read until values are asked for), in this order:

- ``sca_inputs`` (column, sca_feature=17): skin_temperature, cos_solar_zenith_angle,
  sw_albedo_0..5, sw_albedo_direct_0..5, lw_emissivity_0..1, solar_irradiance;
- ``col_inputs`` (column, level=137, col_feature=27): q, o3_mmr, co2_vmr, n2o_vmr, ch4_vmr,
  o2_vmr, cfc11_vmr, cfc12_vmr, hcfc22_vmr, ccl4_vmr, cloud_fraction, aerosol_mmr_0..11,
  q_liquid, q_ice, re_liquid, re_ice;
- ``hl_inputs`` (column, half_level=138, hl_feature=2): temperature_hl, pressure_hl;
- ``inter_inputs`` (column, level_interface=136, inter_feature=1): overlap_param;
- ``pressure_hl`` (column, half_level=138, pressure_feature=1): the inputs' pressure_hl;
- ``flux_dn_sw``, ``flux_up_sw``, ``flux_dn_lw``, ``flux_up_lw`` (column, half_level=138);
- ``hr_sw``, ``hr_lw`` (column, level=137): heating rates in K d-1.

Feature dims carry the feature names as a string coordinate.
``solar_irradiance`` (a scalar per file) is broadcast to every column; ``aerosol_mmr`` is
stored (column, aerosol_type, level) and becomes level-major. Heating rates follow
``hr = -(g / cp) * 86400 * diff(flux_dn - flux_up) / diff(pressure_hl)`` along half levels, with
g = 9.80665 m s-2 and cp = 1004 J kg-1 K-1. Dropped: iseed, fractional_std,
inv_cloud_effective_size, lat, lon.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import xarray as xr

from shardload.errors import SourceError

GRAVITY = 9.80665  # m s-2
HEAT_CAPACITY = 1004.0  # J kg-1 K-1, dry air at constant pressure
SECONDS_PER_DAY = 86400.0
#: Columns per dask chunk by default (one chunk is ~70 MB of inputs at 4096 columns).
DEFAULT_CHUNK_COLUMNS = 4096

#: the input variables by shape: per column (with the band dim of each, if any), per level,
#: per half level (the rows of a radiation store are built from these lists)
SURFACE_VARIABLES = [
    ("skin_temperature", None),
    ("cos_solar_zenith_angle", None),
    ("sw_albedo", "sw_albedo_band"),
    ("sw_albedo_direct", "sw_albedo_band"),
    ("lw_emissivity", "lw_emissivity_band"),
    ("solar_irradiance", None),
]
_GASES = ["q", "o3_mmr", "co2_vmr", "n2o_vmr", "ch4_vmr", "o2_vmr", "cfc11_vmr", "cfc12_vmr"]
COLUMN_VARIABLES = [*_GASES, "hcfc22_vmr", "ccl4_vmr", "cloud_fraction", "aerosol_mmr"]
COLUMN_VARIABLES += ["q_liquid", "q_ice", "re_liquid", "re_ice"]
HALF_LEVEL_VARIABLES = ["temperature_hl", "pressure_hl"]
_INTER = ["overlap_param"]
FLUX_VARIABLES = ("flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw")
INPUT_VARIABLES = (
    *(name for name, _ in SURFACE_VARIABLES),
    *COLUMN_VARIABLES,
    *HALF_LEVEL_VARIABLES,
    *_INTER,
)

_LONG_NAMES = {
    "sca_inputs": "Surface and top-of-atmosphere inputs, one value per column",
    "col_inputs": "Inputs on full levels",
    "hl_inputs": "Inputs on half levels",
    "inter_inputs": "Inputs on level interfaces",
}

_STEM = re.compile(r"(\d{10}_\d+c\d+)\.nc$")


def open_radiation(
    inputs: Sequence[str | os.PathLike[str]],
    outputs: Sequence[str | os.PathLike[str]] | None = None,
    *,
    chunks: int | None = DEFAULT_CHUNK_COLUMNS,
) -> xr.Dataset:
    """Open raw MAELSTROM radiation files lazily as the packed ML view.

    Parameters
    ----------
    inputs
        ``rad4NN_inputs_*.nc`` files (or any file in the ecRad input schema); their columns
        are concatenated in the given order.
    outputs
        The matching ``3dcorrection_outputs_*.nc`` files (or ecRad flux outputs), paired with
        ``inputs`` by position; when both are MAELSTROM names, their ``{date}00_{step}c{patch}``
        parts must agree. ``None``: inputs only (no fluxes, no heating rates).
    chunks
        Columns per dask chunk; ``None`` for one chunk per file.

    Returns
    -------
    xarray.Dataset
        Dask-backed float32 arrays, see the module docstring for names and feature order.

    Raises
    ------
    SourceError
        A file cannot be opened, lacks a variable, or an output's column count differs from
        its input's.
    """
    paths = [Path(p) for p in inputs]
    if not paths:
        raise SourceError("open_radiation needs at least one input file")
    pairs: list[tuple[Path, Path | None]]
    if outputs is None:
        pairs = [(p, None) for p in paths]
    else:
        pairs = _pair(paths, [Path(p) for p in outputs])
    parts = [_open_pair(inp, out, chunks) for inp, out in pairs]
    if len(parts) == 1:
        return parts[0]
    return xr.concat(parts, dim="column", coords="minimal", compat="override", join="exact")


def pack_radiation(
    raw: xr.Dataset, fluxes: xr.Dataset | None = None, *, where: str = ""
) -> xr.Dataset:
    """Pack one raw input dataset (and its flux dataset) into the ML view; lazy if they are.

    Parameters
    ----------
    raw
        Variables of the ecRad input schema.
    fluxes
        A dataset with ``flux_dn_sw``, ``flux_up_sw``, ``flux_dn_lw``, ``flux_up_lw`` on
        ``(column, half_level)``, or ``None``.
    where
        Names the source in error messages (e.g. the file path).
    """
    _require(raw, INPUT_VARIABLES, where)
    f32 = {name: raw[name].astype(np.float32) for name in INPUT_VARIABLES}
    f32["solar_irradiance"] = f32["solar_irradiance"].broadcast_like(f32["skin_temperature"])
    sca_parts = [
        _features(f32[name], "sca_feature", band, name) for name, band in SURFACE_VARIABLES
    ]
    col_parts = [
        _features(
            f32[name].transpose("column", "level", "aerosol_type"),
            "col_feature",
            "aerosol_type",
            name,
        )
        if name == "aerosol_mmr"
        else _features(f32[name], "col_feature", None, name)
        for name in COLUMN_VARIABLES
    ]
    out = {
        "sca_inputs": _concat(sca_parts, "sca_feature"),
        "col_inputs": _concat(col_parts, "col_feature"),
        "hl_inputs": _concat(
            [_features(f32[n], "hl_feature", None, n) for n in HALF_LEVEL_VARIABLES], "hl_feature"
        ),
        "inter_inputs": _features(f32["overlap_param"], "inter_feature", None, "overlap_param"),
        "pressure_hl": _features(f32["pressure_hl"], "pressure_feature", None, "pressure_hl"),
    }
    for name, long_name in _LONG_NAMES.items():
        out[name].attrs = {"long_name": long_name}
    out["pressure_hl"].attrs = dict(raw["pressure_hl"].attrs)
    if fluxes is not None:
        _require(fluxes, FLUX_VARIABLES, where)
        for name in FLUX_VARIABLES:
            out[name] = fluxes[name].astype(np.float32).transpose("column", "half_level")
        p = f32["pressure_hl"]
        for band in ("sw", "lw"):
            out[f"hr_{band}"] = heating_rate(
                out[f"flux_dn_{band}"], out[f"flux_up_{band}"], p, band=band
            )
    return xr.Dataset(out)


def heating_rate(
    flux_dn: xr.DataArray, flux_up: xr.DataArray, pressure_hl: xr.DataArray, *, band: str = ""
) -> xr.DataArray:
    """Heating rate (K d-1) on levels from net fluxes and pressures on half levels."""
    net = flux_dn - flux_up
    d_net = net.diff("half_level").rename(half_level="level")
    d_p = pressure_hl.diff("half_level").rename(half_level="level")
    scale = np.float32(-GRAVITY / HEAT_CAPACITY * SECONDS_PER_DAY)
    hr = (scale * d_net / d_p).astype(np.float32)
    hr.attrs = {"long_name": f"{band} heating rate".strip(), "units": "K d-1"}
    return hr


def _features(da: xr.DataArray, dim: str, band: str | None, name: str) -> xr.DataArray:
    """``da`` with a trailing feature dim ``dim`` whose labels are ``name`` or ``name_i``."""
    if band is None:
        out = da.expand_dims(dim, axis=-1)
        labels = [name]
    else:
        out = da.rename({band: dim})
        labels = [f"{name}_{i}" for i in range(out.sizes[dim])]
    return out.drop_vars(list(out.coords)).assign_coords({dim: labels})


def _concat(parts: list[xr.DataArray], dim: str) -> xr.DataArray:
    out = xr.concat(parts, dim=dim, coords="minimal", compat="override")
    # one dask chunk over the features: a read of some columns is one task per column chunk
    return out.chunk({dim: -1}) if out.chunks else out


def _require(ds: xr.Dataset, names: Sequence[str], where: str) -> None:
    missing = [n for n in names if n not in ds.variables]
    if missing:
        raise SourceError(f"{where or 'dataset'}: missing variable(s) {missing}")
    if "column" not in ds.dims:
        raise SourceError(f"{where or 'dataset'}: no 'column' dimension (dims: {list(ds.dims)})")


def _pair(inputs: list[Path], outputs: list[Path]) -> list[tuple[Path, Path | None]]:
    if len(inputs) != len(outputs):
        raise SourceError(
            f"{len(inputs)} input files but {len(outputs)} output files: they pair one to one"
        )
    for inp, out in zip(inputs, outputs, strict=True):
        a, b = _STEM.search(inp.name), _STEM.search(out.name)
        if a and b and a.group(1) != b.group(1):
            raise SourceError(f"input {inp} is paired with output {out} of another date/step/patch")
    return list(zip(inputs, outputs, strict=True))


def _open(path: Path, chunks: int | None) -> xr.Dataset:
    try:
        from shardload.prep.sources.paths import guess_engine

        # engine from the magic bytes: h5netcdf / scipy keep netCDF4-python's libhdf5 out
        return xr.open_dataset(
            path, engine=guess_engine(str(path)), chunks={"column": chunks or -1}, cache=False
        )
    except (OSError, ValueError) as exc:
        raise SourceError(f"cannot open {path}: {exc}") from exc


def _open_pair(inp: Path, out: Path | None, chunks: int | None) -> xr.Dataset:
    raw = _open(inp, chunks)
    fluxes = None
    if out is not None:
        fluxes = _open(out, chunks)
        if fluxes.sizes.get("column") != raw.sizes.get("column"):
            raise SourceError(
                f"{out} has {fluxes.sizes.get('column')} columns but its input {inp} has "
                f"{raw.sizes.get('column')}"
            )
        _require(fluxes, FLUX_VARIABLES, str(out))
    return pack_radiation(raw, fluxes, where=str(inp))


def feature_names(ds: xr.Dataset) -> Mapping[str, tuple[str, ...]]:
    """Feature labels of every packed array that has a feature dim (e.g. for a manifest)."""
    return {
        str(name): tuple(str(v) for v in ds[dim].values)
        for name, da in ds.data_vars.items()
        for dim in da.dims
        if str(dim).endswith("_feature") and dim in ds.coords
    }
