"""``prepare`` against xarray's own read, on real files and on two generated real-world layouts.

Goal (issue #29): ``prepare`` of any real file of >= 10 MB decoded, default settings, warm
cache, takes at most 3x xarray's own full read of the same variables (``ds[vars].load()``).

Cases (``--cases``, default all):
  grib        a generated GRIB2 file of 21 messages (``t`` on 21 pressure levels) on an
              octahedral reduced Gaussian grid of 4,498,560 points (O1056), 16-bit simple
              packing; flat view with the grid points as samples (``sample_dims: [values]``).
  nc4         a generated netCDF-4 file: one (2160, 4320) field in 64x64 gzip chunks, int16
              with scale_factor and _FillValue (as OISST); flat view with the grid points as
              samples (``sample_dims: [lat, lon]``).
  nc4-plain   the same field as plain float32 (no CF encoding).
  era5-nc, era5-grib
              the ERA5 sample files of the cfgrib sdist that the real-data tests use
              (``z`` and ``t``, samples ``[number, time]``; fetched by the tests into
              ``~/.cache/shardload-tests/era5``; skipped when absent).
  window      a generated netCDF-4 series (as ``bench_window_default.py``): three float32
              variables on (time 720, lat 32, lon 64, lev 4), 67.5 MiB, contiguous; the
              window view (``lookback: 12, horizon: 1``, target ``v0``; the series stored
              once, windows cut at load: the default), samples ``[lat, lon]``.
  window-written
              the same series and view with every window written (``at_load: false``, the
              option): the store holds lookback x the series (x) and the targets.
  window-large, flat-large (not in the default list: ask for them)
              a series 4x as long, (2880, 32, 64, 4) x 3 float32 = 283 MB, contiguous (over
              the 64 MiB per variable kept as whole rows): the window view as ``window``, and
              the flat view (samples ``[lat, lon]``, each a row of 2880 x 4 values per
              variable); the per-byte cost of a prepare, apart from its fixed cost.
  ecrad       the real ecRad input file of ../shared/data (``col_inputs`` of the radiation view
              is not a plain variable: the flat view over ``q``, ``temperature_hl``, samples
              ``[column]``; skipped when absent).

Each timing runs in a fresh Python process that has already imported what it needs (import
time is not the measure here: see ``--imports``), after one untimed run that warms the page
cache: xarray opens the file (``xr.open_dataset(path)``, its default engine and no dask) and
times ``ds[vars].load()`` (and the open, shown apart); shardload times ``shardload.prepare``
with default settings (format, compression, chunking, scheduler) into an OUT the untimed
step before each run removed (``overwrite: true`` as well).
Each is the best of ``--repeats`` runs (prepare: its wall time and, apart, its process CPU
time, all threads). ``--imports`` also prints ``python -X importtime``'s
cumulative import time of ``shardload.prep.driver`` and what prepare imports before any work.

Usage: python benchmarks/bench_real_prepare.py [--cases grib,nc4] [--repeats 3] [--workdir DIR]
(``SHARDLOAD_BENCH_SRC=OTHER/src`` times another checkout's prepare; ``SHARDLOAD_SHARED_DATA``:
where ../shared/data is, for a worktree elsewhere)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("SHARDLOAD_TEST_CACHE", Path.home() / ".cache" / "shardload-tests"))
SHARED = Path(os.environ.get("SHARDLOAD_SHARED_DATA", REPO.parent / "shared" / "data"))


# -- generated layouts -------------------------------------------------------------------------
def write_grib_levels(path: Path, *, n: int = 1056, levels: int = 21, seed: int = 0) -> int:
    """``levels`` GRIB2 messages of ``t`` on pressure levels, on the octahedral reduced
    Gaussian grid O``n`` (``4 n^2 + 36 n`` points; cfgrib gives it a ``values`` dim), 16-bit
    simple packing. Returns the number of grid points."""
    import eccodes

    half = 20 + 4 * np.arange(n)
    pl = np.concatenate([half, half[::-1]])
    points = int(pl.sum())
    rng = np.random.default_rng(seed)
    base = 250 + 40 * np.cos(np.linspace(0, np.pi, points))
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        for k in range(levels):
            h = eccodes.codes_grib_new_from_samples("reduced_gg_pl_640_grib2")
            try:
                eccodes.codes_set(h, "N", n)
                eccodes.codes_set(h, "Nj", 2 * n)
                eccodes.codes_set_long_array(h, "pl", pl.tolist())
                eccodes.codes_set(h, "typeOfLevel", "isobaricInhPa")
                eccodes.codes_set(h, "level", 1000 - 45 * k)
                eccodes.codes_set(h, "shortName", "t")
                eccodes.codes_set(h, "bitsPerValue", 16)
                eccodes.codes_set_values(h, base - 2.5 * k + rng.standard_normal(points))
                eccodes.codes_write(h, f)
            finally:
                eccodes.codes_release(h)
    tmp.replace(path)
    return points


def write_series(path: Path, *, shape: tuple[int, ...] = (720, 32, 64, 4), seed: int = 0) -> None:
    """Three float32 variables ``v0``-``v2`` on (time, lat, lon, lev), netCDF-4 as xarray
    writes it (contiguous), the series of ``bench_window_default.py``."""
    import xarray as xr

    rng = np.random.default_rng(seed)
    dims = ("time", "lat", "lon", "lev")
    data = {f"v{i}": (dims, rng.normal(size=shape).astype("f4")) for i in range(3)}
    tmp = path.with_name(path.name + ".tmp")
    xr.Dataset(data).to_netcdf(tmp)
    tmp.replace(path)


def write_nc4_small_chunks(
    path: Path,
    *,
    shape: tuple[int, int] = (2160, 4320),
    chunk: int = 64,
    seed: int = 0,
    packed: bool = True,
) -> None:
    """One field ``sst`` on (lat, lon) in ``chunk x chunk`` gzip chunks (netCDF-4). ``packed``
    (as OISST and most CF files): int16 with ``scale_factor`` 0.01 and ``_FillValue`` -999
    over a fifth of the grid ("land"), which xarray decodes to float32 with NaN; else plain
    float32 (which shardload reads with h5py directly)."""
    import h5netcdf

    ny, nx = shape
    rng = np.random.default_rng(seed)
    lat = np.linspace(-90, 90, ny, dtype="f4")
    lon = np.linspace(0, 360, nx, endpoint=False, dtype="f4")
    field = (
        15 + 15 * np.cos(np.deg2rad(lat))[:, None] * np.sin(np.deg2rad(lon))[None, :]
    ) + rng.standard_normal(shape).astype("f4") * 0.1
    tmp = path.with_name(path.name + ".tmp")
    with h5netcdf.File(tmp, "w") as f:
        f.dimensions = {"lat": ny, "lon": nx}
        f.create_variable("lat", ("lat",), data=lat)
        f.create_variable("lon", ("lon",), data=lon)
        if not packed:
            v = f.create_variable(
                "sst", ("lat", "lon"), dtype="f4", chunks=(chunk, chunk), compression="gzip"
            )
            v[...] = field.astype("f4")
        else:
            land = (np.sin(np.deg2rad(lat * 3))[:, None] * np.cos(np.deg2rad(lon * 2))) > 0.4
            v = f.create_variable(
                "sst",
                ("lat", "lon"),
                dtype="i2",
                chunks=(chunk, chunk),
                compression="gzip",
                fillvalue=np.int16(-999),
            )
            v.attrs["scale_factor"] = np.float32(0.01)
            v[...] = np.where(land, -999, np.round(field / 0.01)).astype("i2")
    tmp.replace(path)


# -- cases ---------------------------------------------------------------------------------
#: the series of ``window-large`` and ``flat-large`` (283 MB; ``window``'s is 720 steps)
LARGE_SERIES = (2880, 32, 64, 4)


def cases(work: Path) -> dict[str, dict[str, Any]]:
    """name -> {path, variables, sample_dims, engine (xarray's), make (or None)}."""
    era5 = CACHE / "era5"
    return {
        "grib": {
            "path": work / "levels21.grib2",
            "variables": ["t"],
            "sample_dims": ["values"],
            "make": lambda p: write_grib_levels(p),
            "label": "GRIB2, 21 messages, O1056 reduced Gaussian (4.5 M points), samples [values]",
        },
        "nc4": {
            "path": work / "sst_packed_64chunks.nc",
            "variables": ["sst"],
            "sample_dims": ["lat", "lon"],
            "make": lambda p: write_nc4_small_chunks(p),
            "label": "netCDF-4 (2160, 4320) int16 + scale_factor/_FillValue, 64x64 gzip "
            "chunks, samples [lat, lon]",
        },
        "nc4-plain": {
            "path": work / "sst_64chunks.nc",
            "variables": ["sst"],
            "sample_dims": ["lat", "lon"],
            "make": lambda p: write_nc4_small_chunks(p, packed=False),
            "label": "netCDF-4 (2160, 4320) float32, 64x64 gzip chunks, samples [lat, lon]",
        },
        "window": {
            "path": work / "series.nc",
            "variables": ["v0", "v1", "v2"],
            "sample_dims": ["lat", "lon"],
            "view": {"name": "window", "lookback": 12, "horizon": 1, "targets": {"y": ["v0"]}},
            "make": lambda p: write_series(p),
            "label": "netCDF-4 series (720, 32, 64, 4) x 3 float32, window view (lookback 12, "
            "horizon 1), samples [lat, lon]",
        },
        "window-written": {
            "path": work / "series.nc",
            "variables": ["v0", "v1", "v2"],
            "sample_dims": ["lat", "lon"],
            "view": {
                "name": "window",
                "lookback": 12,
                "horizon": 1,
                "targets": {"y": ["v0"]},
                "at_load": False,
            },
            "make": lambda p: write_series(p),
            "label": "the same series, written windows (at_load: false; lookback 12, horizon 1)",
        },
        "window-large": {
            "path": work / "series_large.nc",
            "variables": ["v0", "v1", "v2"],
            "sample_dims": ["lat", "lon"],
            "view": {"name": "window", "lookback": 12, "horizon": 1, "targets": {"y": ["v0"]}},
            "make": lambda p: write_series(p, shape=LARGE_SERIES),
            "label": "netCDF-4 series (2880, 32, 64, 4) x 3 float32, window view (lookback 12, "
            "horizon 1), samples [lat, lon]",
        },
        "flat-large": {
            "path": work / "series_large.nc",
            "variables": ["v0", "v1", "v2"],
            "sample_dims": ["lat", "lon"],
            "make": lambda p: write_series(p, shape=LARGE_SERIES),
            "label": "the same (2880, 32, 64, 4) x 3 series, flat view, samples [lat, lon]",
        },
        "era5-nc": {
            "path": era5 / "era5-levels-members.nc",
            "variables": ["z", "t"],
            "sample_dims": ["number", "time"],
            "make": None,
            "label": "ERA5 levels/members netCDF (cfgrib sdist), samples [number, time]",
        },
        "era5-grib": {
            "path": era5 / "era5-levels-members.grib",
            "variables": ["z", "t"],
            "sample_dims": ["number", "time"],
            "make": None,
            "label": "ERA5 levels/members GRIB1 (cfgrib sdist), samples [number, time]",
        },
        "ecrad": {
            "path": SHARED / "ecrad" / "ecrad_meridian.nc",
            "variables": ["q", "temperature_hl"],
            "sample_dims": ["column"],
            "make": None,
            "label": "ecRad input netCDF-3 (../shared/data), samples [column]",
        },
    }


XARRAY_CHILD = """
import json, sys, time
import xarray as xr
path, variables, repeats = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
kw = {"backend_kwargs": {"indexpath": ""}} if path.endswith((".grib", ".grib2")) else {}
best_open = best_load = float("inf")
for _ in range(repeats + 1):  # the first run warms the cache
    t0 = time.perf_counter()
    ds = xr.open_dataset(path, **kw)
    t1 = time.perf_counter()
    loaded = ds[variables].load()
    t2 = time.perf_counter()
    nbytes = int(sum(loaded[v].nbytes for v in variables))
    ds.close()
    best_open, best_load = min(best_open, t1 - t0), min(best_load, t2 - t1)
print(json.dumps({"open_s": best_open, "load_s": best_load, "bytes": nbytes}))
"""

SHARDLOAD_CHILD = """
import json, shutil, sys, time
import shardload
from shardload.prep import driver
from shardload.prep.sources import open as source_open
cfg, repeats = json.loads(sys.argv[1]), int(sys.argv[2])
best = best_cpu = float("inf")
for _ in range(repeats + 1):  # the first run warms the cache
    source_open._GRIB.clear()  # each run scans its GRIB file, as xarray's open does
    shutil.rmtree(cfg["out"], ignore_errors=True)  # a fresh OUT: deleting the last is not timed
    t0, c0 = time.perf_counter(), time.process_time()
    store = shardload.prepare(cfg)
    best = min(best, time.perf_counter() - t0)
    best_cpu = min(best_cpu, time.process_time() - c0)  # every thread of this process
print(json.dumps({"prepare_s": best, "prepare_cpu_s": best_cpu, "length": len(store)}))
"""


#: the shardload sources the children import (another checkout's ``src`` to compare)
SRC = os.environ.get("SHARDLOAD_BENCH_SRC", str(REPO / "src"))


def _child(code: str, *args: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": SRC}
    res = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=1800
    )
    if res.returncode:
        raise RuntimeError(res.stderr[-3000:])
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_case(name: str, case: dict[str, Any], work: Path, repeats: int) -> dict[str, Any] | None:
    path = Path(case["path"])
    if not path.exists():
        if case["make"] is None:
            print(f"{name}: skipped, {path} is absent", file=sys.stderr)
            return None
        case["make"](path)
    xr_t = _child(XARRAY_CHILD, str(path), json.dumps(case["variables"]), str(repeats))
    cfg = {
        "source": {"paths": [str(path)], "variables": case["variables"]},
        "sample_dims": case["sample_dims"],
        "arrays": {"x": case["variables"]},
        "out": str(work / f"{name}.store"),
        "overwrite": True,
    }
    if "view" in case:
        cfg["view"] = case["view"]
    sl = _child(SHARDLOAD_CHILD, json.dumps(cfg), str(repeats))
    return {
        "case": name,
        "label": case["label"],
        "decoded_mb": xr_t["bytes"] / 1e6,
        "xarray_open_s": xr_t["open_s"],
        "xarray_load_s": xr_t["load_s"],
        "prepare_s": sl["prepare_s"],
        "prepare_cpu_s": sl["prepare_cpu_s"],
        "ratio": sl["prepare_s"] / xr_t["load_s"],
        "ratio_open_load": sl["prepare_s"] / (xr_t["open_s"] + xr_t["load_s"]),
    }


def import_times() -> dict[str, float]:
    """Cumulative import time (s) of the modules a fresh ``prepare`` imports before any work,
    from ``python -X importtime`` (best of 3 fresh processes)."""
    code = "import shardload; from shardload.prep import driver"
    best: dict[str, float] = {}
    for _ in range(3):
        res = subprocess.run(
            [sys.executable, "-X", "importtime", "-c", code],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        )
        for line in res.stderr.splitlines():
            parts = [p.strip() for p in line.split("|")]
            if len(parts) == 3 and parts[1].isdigit() and not parts[2].startswith(" "):
                mod = parts[2]
                if mod in ("shardload", "shardload.prep.driver", "xarray", "dask", "pandas"):
                    best[mod] = min(best.get(mod, 1e9), int(parts[1]) / 1e6)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument(
        "--cases", default="grib,nc4,nc4-plain,window,window-written,era5-nc,era5-grib,ecrad"
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--imports", action="store_true", help="also print import times")
    args = ap.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-real-"))
    work.mkdir(parents=True, exist_ok=True)
    table = cases(work)
    rows = []
    for name in args.cases.split(","):
        r = run_case(name, table[name], work, args.repeats)
        if r is not None:
            rows.append(r)
            print(json.dumps(r), file=sys.stderr)
    print("| case | decoded MB | xarray open s | xarray load s | prepare s | prepare / load |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['label']} | {r['decoded_mb']:.1f} | {r['xarray_open_s']:.2f} | "
            f"{r['xarray_load_s']:.2f} | {r['prepare_s']:.2f} | {r['ratio']:.1f}x |"
        )
    if args.imports:
        print(json.dumps({"import_s": import_times()}))


if __name__ == "__main__":
    main()
