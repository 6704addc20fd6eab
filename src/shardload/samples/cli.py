"""``shardload sample ...``: write sample raw data sets to try shardload on."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from shardload.samples.radiation_sizes import (
    DEFAULT_BLOCK_COLUMNS,
    DEFAULT_COLUMNS,
    REAL_COLUMNS_PER_PATCH,
)

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the ``sample`` command and its ``radiation`` subcommand to ``subparsers``."""
    sample = subparsers.add_parser(
        "sample",
        help="write sample raw data sets (synthetic, in real schemas)",
        description="Write synthetic raw files in the schema of a real data set, to try "
        "'shardload prepare' on without downloading anything. Each file records the generator's "
        "version and options (attributes shardload_sample_*): a file already there that this "
        "generator would write the same is kept; any other of that name is written again "
        "(seismic: refused without --overwrite), and the log says why.",
    )
    kinds = sample.add_subparsers(dest="kind", metavar="KIND")
    kinds.required = True
    rad = kinds.add_parser(
        "radiation",
        help="MAELSTROM radiation files (ecRad inputs + 3D-correction outputs)",
        description="Write raw files exactly as the MAELSTROM radiation data set ships them: "
        "rad4NN_inputs_{DATE}00_{TIMESTEP}c{PATCH}.nc (ecRad input profiles: 137 levels, "
        "138 half levels, surface and gas fields) and "
        "3dcorrection_outputs_{DATE}00_{TIMESTEP}c{PATCH}.nc (SPARTACUS minus Tripleclouds "
        "fluxes in W m-2, and pressure_hl), one pair per timestep and patch. Values are "
        "physically plausible but synthetic, reproducible from --seed. Files are streamed in "
        "blocks of columns and renamed into place when complete.",
        epilog="Sizes: about 20 kB per column for a pair, i.e. ~40 MB per pair at the default "
        f"{DEFAULT_COLUMNS} columns and ~350 MB at the real {REAL_COLUMNS_PER_PATCH} columns. "
        "Example: shardload sample radiation --out data/raw --timesteps 0 125 --patches 0 1 2 3",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    rad.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="DIR",
        default=argparse.SUPPRESS,
        help="output folder (created if missing)",
    )
    rad.add_argument(
        "--columns",
        type=int,
        default=DEFAULT_COLUMNS,
        metavar="N",
        help=f"columns per file (the real data set has {REAL_COLUMNS_PER_PATCH})",
    )
    rad.add_argument(
        "--timesteps",
        type=int,
        nargs="+",
        default=[0],
        metavar="T",
        help="timesteps to write, from 0..3500 in steps of 125",
    )
    rad.add_argument(
        "--patches", type=int, nargs="+", default=[0], metavar="P", help="patches 0..15"
    )
    rad.add_argument("--date", default="20200101", metavar="YYYYMMDD", help="date of the files")
    rad.add_argument("--seed", type=int, default=0, metavar="S", help="random seed")
    rad.add_argument(
        "--block-columns",
        type=int,
        default=DEFAULT_BLOCK_COLUMNS,
        metavar="N",
        help="columns generated and written at a time (memory; does not change the data)",
    )
    rad.set_defaults(func=run_radiation)
    add_seismic_parser(kinds)
    add_era5_parser(kinds)
    add_states_parser(kinds)


def run_radiation(args: argparse.Namespace) -> int:
    """Run ``shardload sample radiation`` with parsed ``args``; return the exit status."""
    from shardload.samples.radiation import write_radiation_sample

    files = write_radiation_sample(
        args.out,
        columns=args.columns,
        timesteps=args.timesteps,
        patches=args.patches,
        date=args.date,
        seed=args.seed,
        block_columns=args.block_columns,
        reuse=True,
    )
    size_mb = sum(f.stat().st_size for f in files) / 1e6
    log.info("%d files (%.1f MB) in %s", len(files), size_mb, args.out)
    return 0


def add_seismic_parser(kinds) -> None:
    """``shardload sample seismic --out cube.zarr --shape I J K``."""
    p = kinds.add_parser(
        "seismic",
        help="a synthetic seismic cube (Zarr): layers, faults, Ricker wavelet, noise",
        description="Write a float32 cube (inline, crossline, time), variable 'amp', streamed "
        "to Zarr block by block (memory: one block of inlines), for 'shardload compute'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument(
        "--out",
        required=True,
        type=Path,
        metavar="PATH",
        help="output Zarr folder, or a .sgy/.segy file (SEG-Y through segyio, extra segy)",
    )
    p.add_argument("--shape", required=True, type=int, nargs=3, metavar=("I", "J", "K"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--faults", type=int, default=3)
    p.add_argument("--noise", type=float, default=0.05, help="noise standard deviation")
    p.add_argument("--chunk-inlines", type=int, default=64, help="inlines per Zarr chunk")
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=run_seismic)


def run_seismic(args: argparse.Namespace) -> int:
    from shardload.samples.seismic import write_seismic_sample, write_seismic_segy

    segy = args.out.suffix.lower() in (".sgy", ".segy")
    before = _mtime_ns(args.out)
    out = (write_seismic_segy if segy else write_seismic_sample)(
        args.out,
        args.shape,
        seed=args.seed,
        faults=args.faults,
        noise=args.noise,
        chunk_inlines=args.chunk_inlines,
        overwrite=args.overwrite,
    )
    var = "data" if segy else "amp"
    print(f"{_verb(out, before)} {out} (variable {var!r}, shape {tuple(args.shape)}, float32)")
    return 0


def add_era5_parser(kinds) -> None:
    """``shardload sample era5 --out DIR``: a longer ERA5-like series for window stores."""
    p = kinds.add_parser(
        "era5",
        help="an ERA5-like series (t, z on 2 pressure levels) for look-back windows (LSTM)",
        description="Write DIR/era5-levels-members.nc in the schema of cfgrib's ERA5 sample "
        "(z, t on number, time, isobaricInhPa, latitude, longitude) with more 12-hourly time "
        "steps: a zonal climate plus travelling planetary waves and noise, reproducible from "
        "--seed. configs/era5-window.yaml cuts it into look-back windows.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.add_argument("--members", type=int, default=2, metavar="N", help="ensemble members")
    p.add_argument("--times", type=int, default=32, metavar="T", help="12-hourly time steps")
    p.add_argument("--grid-deg", type=float, default=3.0, metavar="D", help="grid spacing")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_era5)


def run_era5(args: argparse.Namespace) -> int:
    from shardload.samples.era5 import FILE_NAME, write_era5_sample

    before = _mtime_ns(args.out / FILE_NAME)
    out = write_era5_sample(
        args.out,
        members=args.members,
        times=args.times,
        seed=args.seed,
        grid_deg=args.grid_deg,
        reuse=True,
    )
    print(f"{_verb(out, before)} {out} (z, t: {args.members} members x {args.times} times)")
    return 0


def add_states_parser(kinds) -> None:
    """``shardload sample states --out DIR``: global states with learnable dynamics."""
    p = kinds.add_parser(
        "states",
        help="global 6-hourly states (t, q, z) advected by a zonal wind, for forecasting",
        description="Write DIR/states-6h.nc: t, q, z on (time, latitude, longitude), 6-hourly, "
        "advected eastward by a zonal wind of 1 to 3 grid cells per step (by latitude), "
        "diffused, relaxed and driven by a smooth random forcing, reproducible from --seed. "
        "configs/era5-states.yaml prepares it into a dated store for 'shardload train forecast'.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--out", required=True, type=Path, metavar="DIR", help="output folder")
    p.add_argument("--dates", type=int, default=2920, metavar="N", help="6-hourly dates")
    p.add_argument("--lat", type=int, default=32, metavar="N", help="latitudes")
    p.add_argument("--lon", type=int, default=64, metavar="N", help="longitudes")
    p.add_argument(
        "--levels",
        type=int,
        default=1,
        metavar="L",
        help="each field on L levels as 2-D variables t_1..t_L, q_1.., z_1.. (3 L channels; "
        "--lat 440 --lon 1232 --levels 20 makes N320-sized states: 542,080 cells x 60 "
        "channels, 130 MB each)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run_states)


def run_states(args: argparse.Namespace) -> int:
    from shardload.samples.states import FILE_NAME, write_states_sample

    before = _mtime_ns(args.out / FILE_NAME)
    out = write_states_sample(
        args.out,
        dates=args.dates,
        lat=args.lat,
        lon=args.lon,
        seed=args.seed,
        reuse=True,
        levels=args.levels,
    )
    what = "t, q, z" if args.levels == 1 else f"t, q, z on {args.levels} levels"
    print(f"{_verb(out, before)} {out} ({what}: {args.dates} dates on {args.lat} x {args.lon})")
    return 0


def _mtime_ns(path: Path) -> int | None:
    return path.stat().st_mtime_ns if path.exists() else None


def _verb(path: Path, mtime_before: int | None) -> str:
    """``wrote``, or ``kept (up to date)`` for a sample file the command reused."""
    return "kept (up to date)" if _mtime_ns(path) == mtime_before else "wrote"
