"""Write raw files exactly as the MAELSTROM radiation dataset ships them, streaming and seeded.

For every (timestep, patch) two netCDF files are written::

    rad4NN_inputs_{YYYYMMDD}00_{timestep}c{patch}.nc          ecRad inputs (ecrad_meridian.nc schema)
    3dcorrection_outputs_{YYYYMMDD}00_{timestep}c{patch}.nc   SPARTACUS minus Tripleclouds fluxes

Files are written block by block of columns (memory is one block, whatever the file size),
under a temporary name in the same folder that is renamed once the file is complete, so a
killed run never leaves a half-written file under its final name.

Reproducibility: columns are generated in units of :data:`UNIT_COLUMNS`, each from its own
random stream seeded by ``(seed, date, timestep, patch, unit)``. The same arguments give
byte-identical files, whatever ``block_columns`` is; another timestep or patch gives other data.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np

from shardload.errors import ConfigError
from shardload.samples.radiation_fields import (
    DIMS,
    INPUT_VARIABLES,
    OUTPUT_DIMS,
    OUTPUT_VARIABLES,
    VarSpec,
    generate_inputs,
    generate_outputs,
)
from shardload.samples.radiation_sizes import (
    DEFAULT_BLOCK_COLUMNS,
    DEFAULT_COLUMNS,
    UNIT_COLUMNS,
)
from shardload.samples.radiation_sizes import (
    REAL_COLUMNS_PER_PATCH as REAL_COLUMNS_PER_PATCH,  # re-exported: public before
)
from shardload.samples.stamp import sample_stamp, why_outdated
from shardload.version import __version__

log = logging.getLogger(__name__)

TIMESTEPS = tuple(range(0, 3501, 125))
PATCHES = tuple(range(16))
#: netCDF flavour: the classic data model of ecrad_meridian.nc, stored in HDF5 so variables can
#: be defined without netCDF-3's rewrite-per-definition cost. Column is a fixed dim (contiguous
#: storage). No timestamps are stored, so the bytes depend only on the data.
FILE_FORMAT: Final = "NETCDF4_CLASSIC"


def radiation_file_names(date: str, timestep: int, patch: int) -> tuple[str, str]:
    """Names of the input and output file of one (date, timestep, patch).

    >>> radiation_file_names("20200101", 125, 3)
    ('rad4NN_inputs_2020010100_125c3.nc', '3dcorrection_outputs_2020010100_125c3.nc')
    """
    stem = f"{date}00_{timestep}c{patch}.nc"
    return f"rad4NN_inputs_{stem}", f"3dcorrection_outputs_{stem}"


def write_radiation_sample(
    out_dir: str | os.PathLike[str],
    *,
    columns: int = DEFAULT_COLUMNS,
    timesteps: Iterable[int] = (0,),
    patches: Iterable[int] = (0,),
    date: str = "20200101",
    seed: int = 0,
    block_columns: int = DEFAULT_BLOCK_COLUMNS,
    progress: bool | None = None,
    reuse: bool = False,
) -> list[Path]:
    """Write MAELSTROM-style raw radiation files for every (timestep, patch).

    Parameters
    ----------
    out_dir
        Folder to write into (created if missing). Existing files of the same name are replaced.
    columns
        Columns per file (the real dataset has 16,960).
    timesteps, patches
        Which files to write: timesteps from 0..3500 in steps of 125, patches 0..15.
    date
        ``YYYYMMDD``; sets the solar irradiance and geometry and enters the file names.
    seed
        Base seed; the data of each file derives from ``(seed, date, timestep, patch)``.
    block_columns
        Columns generated and written at a time (rounded up to a multiple of
        :data:`UNIT_COLUMNS`); bounds memory, does not change the data.
    progress
        Show a tqdm bar over blocks; ``None`` shows it only on a terminal.
    reuse
        Keep a pair of files already there when both carry the stamp this generator writes for
        them (:mod:`~shardload.samples.stamp`: its version and the pair's options); any other
        pair of that name is written again, with a log line saying why.

    Returns
    -------
    list of Path
        The files written, inputs then outputs for each (timestep, patch) in order.
    """
    steps, patch_ids = _check_args(columns, list(timesteps), list(patches), date, block_columns)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    units_per_block = -(-block_columns // UNIT_COLUMNS)
    num_blocks = -(-columns // (units_per_block * UNIT_COLUMNS))
    from tqdm.auto import tqdm

    written: list[Path] = []
    total = num_blocks * len(steps) * len(patch_ids)
    with tqdm(
        total=total,
        desc="radiation sample",
        unit="block",
        disable=None if progress is None else not progress,
    ) as bar:
        for timestep in steps:
            for patch in patch_ids:
                names = [out / n for n in radiation_file_names(date, timestep, patch)]
                if reuse and _current(names, columns, date, timestep, patch, seed):
                    written += names
                    bar.update(num_blocks)
                    continue
                written += _write_pair(
                    out, columns, date, timestep, patch, seed, units_per_block, bar
                )
    return written


def pair_options(columns: int, date: str, timestep: int, patch: int, seed: int) -> dict[str, Any]:
    """What the values of one (timestep, patch) pair follow from (its stamp's options)."""
    return {"columns": columns, "date": date, "timestep": timestep, "patch": patch, "seed": seed}


def _current(names: list[Path], columns, date, timestep, patch, seed) -> bool:
    """Whether both files of a pair are this generator's for these options; logs why not
    where a file is there but outdated."""
    options = pair_options(columns, date, timestep, patch, seed)
    for f in names:
        why = why_outdated(f, "radiation", options)
        if why is not None:
            if any(n.exists() for n in names):  # a pair that was there: say why it is not kept
                log.info("regenerating %s: %s", f.name, why)
            return False
    log.info("reusing %s and %s: up to date", names[0].name, names[1].name)
    return True


def _write_pair(out, columns, date, timestep, patch, seed, units_per_block, bar) -> list[Path]:
    import netCDF4

    names = radiation_file_names(date, timestep, patch)
    finals = [out / name for name in names]
    temps = [f.with_name(f".{f.name}.partial") for f in finals]
    context = f"--date {date} --timestep {timestep} --patch {patch} --seed {seed}"
    stamp = sample_stamp("radiation", pair_options(columns, date, timestep, patch, seed))
    try:
        with (
            netCDF4.Dataset(temps[0], "w", format=FILE_FORMAT) as fin,
            netCDF4.Dataset(temps[1], "w", format=FILE_FORMAT) as fout,
        ):
            _define(fin, DIMS, INPUT_VARIABLES, columns, {**_input_attrs(context), **stamp})
            _define(
                fout,
                OUTPUT_DIMS,
                OUTPUT_VARIABLES,
                columns,
                {**_output_attrs(context), **stamp},
                {"pressure_hl": {"standard_name": "air_pressure"}},
            )
            num_units = -(-columns // UNIT_COLUMNS)
            for first in range(0, num_units, units_per_block):
                units = range(first, min(first + units_per_block, num_units))
                inputs, outputs = _generate_units(units, columns, date, timestep, patch, seed)
                start = first * UNIT_COLUMNS
                _write_block(fin, inputs, start)
                _write_block(fout, outputs, start)
                bar.update(1)
        for temp, final in zip(temps, finals, strict=True):
            os.replace(temp, final)
    finally:
        for temp in temps:
            temp.unlink(missing_ok=True)
    return finals


def _generate_units(units, columns, date, timestep, patch, seed):
    inputs_parts, outputs_parts = [], []
    for unit in units:
        n = min(UNIT_COLUMNS, columns - unit * UNIT_COLUMNS)
        rng = np.random.default_rng(
            np.random.SeedSequence([seed, int(date), timestep, patch, unit])
        )
        inputs = generate_inputs(rng, n, date=date, timestep=timestep, patch=patch)
        inputs_parts.append(inputs)
        outputs_parts.append(generate_outputs(rng, inputs))
    return _concat(inputs_parts), _concat(outputs_parts)


def _concat(parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {
        name: value if value.ndim == 0 else np.concatenate([p[name] for p in parts])
        for name, value in parts[0].items()
    }


def _define(ds, dims, variables: Sequence[VarSpec], columns: int, attrs, extra_attrs=None) -> None:
    extra_attrs = extra_attrs or {}
    ds.set_fill_off()  # netCDF-3 would otherwise pre-fill every variable as it is defined
    ds.setncatts(attrs)
    for name, size in dims.items():
        ds.createDimension(name, columns if size is None else size)
    for spec in variables:
        # fill_value=False: no pre-fill pass; every value is written below
        var = ds.createVariable(spec.name, spec.dtype, spec.dims, fill_value=False)
        var.setncatts({"long_name": spec.long_name, "units": spec.units})
        var.setncatts(extra_attrs.get(spec.name, {}))
    ds.set_auto_maskandscale(False)


def _write_block(ds, values: dict[str, np.ndarray], start: int) -> None:
    for name, value in values.items():
        var = ds.variables[name]
        if value.ndim == 0:
            var.assignValue(value)
        else:
            var[start : start + value.shape[0]] = value


def _input_attrs(context: str) -> dict[str, str]:
    return {
        "title": "Input profiles to radiation scheme",
        "history": f"shardload {__version__}: shardload sample radiation {context}",
        "comment": "Synthetic atmospheric columns in the schema of the MAELSTROM radiation "
        "dataset (rad4NN_inputs files, as ecRad's ecrad_meridian.nc); values are "
        "plausible caricatures, not IFS data.",
    }


def _output_attrs(context: str) -> dict[str, str]:
    return {
        "title": "Radiative flux differences from the ecRad offline radiation model: "
        "SPARTACUS minus Tripleclouds (3D radiative effects)",
        "source": "shardload synthetic sample, not ecRad output",
        "history": f"shardload {__version__}: shardload sample radiation {context}",
        "references": "Hogan, R. J., and A. Bozzo, 2018: A flexible and efficient radiation "
        "scheme for the ECMWF model. J. Adv. Modeling Earth Sys., 10, 1990–2008",
        "comment": "flux_* variables are SPARTACUS minus Tripleclouds differences (W m-2); "
        "pressure_hl is the input pressure.",
    }


def _check_args(columns, timesteps, patches, date, block_columns) -> tuple[list[int], list[int]]:
    if not isinstance(columns, (int, np.integer)) or columns <= 0:
        raise ConfigError(f"columns must be a positive integer, got {columns!r}")
    if block_columns <= 0:
        raise ConfigError(f"block_columns must be positive, got {block_columns!r}")
    bad = [t for t in timesteps if t not in TIMESTEPS]
    if bad or not timesteps:
        raise ConfigError(f"timesteps must be in 0..3500 in steps of 125, got {timesteps}")
    bad = [p for p in patches if p not in PATCHES]
    if bad or not patches:
        raise ConfigError(f"patches must be in 0..15, got {patches}")
    try:
        if len(date) != 8 or not date.isdigit():
            raise ValueError(date)
        np.datetime64(f"{date[:4]}-{date[4:6]}-{date[6:8]}", "D")
    except (TypeError, ValueError):
        raise ConfigError(f"date must be YYYYMMDD, got {date!r}") from None
    return [int(t) for t in timesteps], [int(p) for p in patches]
