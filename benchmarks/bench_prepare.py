"""Prepare throughput: shardload vs plain xarray + dask, same run, on three sources.

Cases (``--cases``, default all; with ``--repeats N`` every case runs N times, shardload and
its baseline alternating, and the ratios of each round are printed):
  radiation  MAELSTROM-style radiation sample (default ~1 GB of prepared flat arrays), flat view;
             baseline: the same lazy ML view, ``.chunk({column: rows}).to_zarr()``.
  rows       a plain netCDF-4 file of float32 rows (default 262,144 x (1,536 + 16), two
             variables, chunks of 4,096 rows), flat view with 4,096-row chunks; baseline:
             ``xr.open_dataset(path, chunks={row: 4096}).to_zarr()``.
  grid       an HDF5 grid with the sample axis last in storage (default (2160, 4320, 12) uint8,
             gzip chunks (135, 270, 2)), prepared along its last axis; baseline: xarray's own
             read of the variable, ``xr.open_dataset(path)[var].values`` (goal: within 3x).
             Also timed: the read path alone (the view's ``read`` of every block) and the view's
             build (opening the source, 9.3 M feature names).
Every store shardload writes is fsynced chunk by chunk before it counts as done; the to_zarr
baselines are given as is and plus an fsync pass over their files (the same durability). Also
measured once: disk write bandwidth (numpy ``tofile`` of 1 GiB + fsync).
Usage: python benchmarks/bench_prepare.py [--cases rows,grid] [--repeats 2] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

GRID_VAR = "lc"


def disk_write_bandwidth(folder: Path, nbytes: int = 2**30) -> float:
    path = folder / "ddtest.bin"
    buf = np.random.default_rng(0).integers(0, 255, size=nbytes, dtype=np.uint8)
    t = time.perf_counter()
    with open(path, "wb") as f:
        buf.tofile(f)
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t
    path.unlink()
    return nbytes / dt / 1e6


# -- sources ---------------------------------------------------------------------------------
def write_rows_file(
    path: Path, *, rows: int = 262144, features: tuple[int, int] = (1536, 16), chunk: int = 4096
) -> None:
    """float32 rows, variables ``x`` (row, xf) and ``y`` (row, yf), chunks of ``chunk`` rows."""
    import h5netcdf

    rng = np.random.default_rng(0)
    tmp = path.with_name(path.name + ".tmp")
    with h5netcdf.File(tmp, "w") as f:
        f.dimensions = {"row": rows, "xf": features[0], "yf": features[1]}
        vs = {
            name: f.create_variable(name, ("row", dim), "float32", chunks=(chunk, width))
            for name, dim, width in zip(("x", "y"), ("xf", "yf"), features, strict=True)
        }
        for a in range(0, rows, chunk):
            b = min(rows, a + chunk)
            for name, width in zip(("x", "y"), features, strict=True):
                vs[name][a:b] = rng.standard_normal((b - a, width), dtype=np.float32)
    os.replace(tmp, path)


def write_grid_file(
    path: Path,
    *,
    shape: tuple[int, int, int] = (2160, 4320, 12),
    chunks: tuple[int, int, int] = (135, 270, 2),
) -> None:
    """A uint8 grid like a monthly land-cover climatology: smooth classes plus noise, gzip
    chunks, no dimension scales (xarray names the dims phony_dim_0..2)."""
    import h5py

    rng = np.random.default_rng(0)
    tmp = path.with_name(path.name + ".tmp")
    with h5py.File(tmp, "w") as f:
        d = f.create_dataset(
            GRID_VAR, shape=shape, dtype="uint8", chunks=chunks, compression="gzip"
        )
        x = np.arange(shape[1])[None, :, None]
        m = np.arange(shape[2])[None, None, :]
        for a in range(0, shape[0], chunks[0]):
            y = np.arange(a, min(shape[0], a + chunks[0]))[:, None, None]
            v = ((y // 17 + x // 23 + 3 * m) % 40).astype(np.uint8)
            d[a : a + len(y)] = v + rng.integers(0, 3, v.shape, dtype=np.uint8)
    os.replace(tmp, path)


# -- measurements ----------------------------------------------------------------------------
def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t = time.perf_counter()
    res = fn()
    return res, time.perf_counter() - t


def shardload_prepare(conf: dict[str, Any]) -> tuple[Any, float, int]:
    import shardload

    shutil.rmtree(conf["out"], ignore_errors=True)  # both sides start without an old store
    store, dt = timed(lambda: shardload.prepare(conf, progress=False))
    nbytes = sum(store.manifest.arrays[k].row_bytes for k in store.arrays) * len(store)
    return store, dt, nbytes


def baseline_to_zarr(ds: Any, out: Path, compression: str) -> tuple[float, float]:
    """``ds.to_zarr(out)`` (threaded dask), then an fsync pass: (seconds, seconds with fsync)."""
    import dask

    from shardload.formats.base import FormatOptions
    from shardload.formats.zarr.write import compressors
    from shardload.util.durable import fsync_tree

    shutil.rmtree(out, ignore_errors=True)
    enc = {k: {"compressors": compressors(FormatOptions(compression))} for k in ds.data_vars}
    t = time.perf_counter()
    with dask.config.set(scheduler="threads"):
        ds.to_zarr(out, mode="w", zarr_format=3, encoding=enc, consolidated=False)
    dt = time.perf_counter() - t
    fsync_tree(out)
    return dt, time.perf_counter() - t


def radiation_case(work: Path, args: argparse.Namespace) -> Callable[[], dict[str, float]]:
    import dask
    import xarray as xr

    from shardload.prep.sources.radiation import open_radiation
    from shardload.samples.radiation import write_radiation_sample

    raw = work / "raw"
    if not raw.exists():
        write_radiation_sample(
            raw,
            columns=args.columns_per_file,
            timesteps=(0,),
            patches=tuple(range(args.files)),
            seed=0,
        )
    inputs = sorted(str(p) for p in raw.glob("rad4NN_inputs_*.nc"))
    outputs = sorted(str(p) for p in raw.glob("3dcorrection_outputs_*.nc"))
    xvars = ["sca_inputs", "col_inputs", "hl_inputs", "inter_inputs"]
    yvars = ["flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw", "hr_sw", "hr_lw"]
    conf = {
        "source": {"kind": "radiation", "paths": inputs, "outputs": outputs},
        "sample_dims": ["column"],
        "view": "flat",
        "arrays": {"x": xvars, "y": yvars},
        "dtype": "float32",
        "format": "zarr",
        "compression": args.compression,
        "out": str(work / "radiation-store"),
        "overwrite": True,
    }
    # warm-up, untimed: imports (xarray backends, dask, zarr) and file metadata for both paths
    _ = open_radiation(inputs[:1], outputs[:1])["hr_sw"].isel(column=slice(0, 4)).values

    def run() -> dict[str, float]:
        store, dt, nbytes = shardload_prepare(conf)
        rows = store.manifest.chunk_rows
        t = time.perf_counter()
        ds = open_radiation(inputs, outputs)

        def flat(names: list[str]) -> Any:
            parts = [ds[v].data.reshape(ds.sizes["column"], -1) for v in names]
            return dask.array.concatenate(parts, axis=1).astype("float32")

        out = xr.Dataset(
            {"x": (("column", "xf"), flat(xvars)), "y": (("column", "yf"), flat(yvars))}
        ).chunk({"column": rows, "xf": -1, "yf": -1})
        open_s = time.perf_counter() - t
        xs, xs_sync = baseline_to_zarr(out, work / "radiation-xarray", args.compression)
        check_equal(work / "radiation-xarray", store, "x")
        return {
            "bytes": nbytes,
            "shardload_s": dt,
            "xarray_s": xs + open_s,
            "xarray_fsync_s": xs_sync + open_s,
        }

    return run


def rows_case(work: Path, args: argparse.Namespace) -> Callable[[], dict[str, float]]:
    import xarray as xr

    src = work / f"rows-{args.rows}.nc"
    if not src.exists():
        write_rows_file(src, rows=args.rows)
    conf = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["row"],
        "view": "flat",
        "arrays": {"x": ["x"], "y": ["y"]},
        "chunk_rows": 4096,
        "format": "zarr",
        "compression": args.compression,
        "out": str(work / "rows-store"),
        "overwrite": True,
    }

    def run() -> dict[str, float]:
        store, dt, nbytes = shardload_prepare(conf)
        t = time.perf_counter()
        ds = xr.open_dataset(src, engine="h5netcdf", chunks={"row": 4096})
        open_s = time.perf_counter() - t
        xs, xs_sync = baseline_to_zarr(ds, work / "rows-xarray", args.compression)
        check_equal(work / "rows-xarray", store, "x")
        return {
            "bytes": nbytes,
            "shardload_s": dt,
            "xarray_s": xs + open_s,
            "xarray_fsync_s": xs_sync + open_s,
        }

    return run


def grid_case(work: Path, args: argparse.Namespace) -> Callable[[], dict[str, float]]:
    import xarray as xr

    from shardload.prep.config import load_config
    from shardload.prep.tasks import build

    src = work / "grid.h5"
    if not src.exists():
        write_grid_file(src)
    conf = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["phony_dim_2"],
        "view": "flat",
        "arrays": {"x": [GRID_VAR]},
        "format": "zarr",
        "compression": args.compression,
        "out": str(work / "grid-store"),
        "overwrite": True,
    }

    def run() -> dict[str, float]:
        def xr_read() -> np.ndarray:
            with xr.open_dataset(src, engine="h5netcdf", phony_dims="sort") as ds:
                return np.asarray(ds[GRID_VAR].values)

        values, xr_s = timed(xr_read)

        view, build_s = timed(lambda: build(load_config(conf)))  # open, names of 9.3M features
        nbytes, read_s = timed(
            lambda: sum(int(view.read(i, i + 1)["x"].nbytes) for i in range(view.length))
        )
        res = {
            "bytes": nbytes,
            "xarray_read_s": xr_s,
            "shardload_read_s": read_s,
            "shardload_build_s": build_s,
        }
        if not args.grid_read_only:
            store, dt, _ = shardload_prepare(conf)
            k = values.shape[-1] // 2
            assert np.array_equal(store.read("x", k, k + 1)[0], values[..., k].reshape(-1))
            res["shardload_s"] = dt
        return res

    return run


def check_equal(baseline: Path, store: Any, name: str) -> None:
    import zarr

    z = zarr.open_group(baseline, mode="r")
    i = len(store) // 2
    assert np.array_equal(z[name][i : i + 5], store.read(name, i, i + 5)), "baseline differs"


def report(case: str, r: dict[str, float]) -> dict[str, float]:
    mb = r["bytes"] / 1e6
    if case == "grid":
        r["read_ratio"] = r["shardload_read_s"] / r["xarray_read_s"]
        line = (
            f"grid: {mb:.0f} MB; xarray read of the variable {r['xarray_read_s']:.2f} s; "
            f"shardload read of every block {r['shardload_read_s']:.2f} s ({r['read_ratio']:.2f}x), "
            f"view build (open, feature names) {r['shardload_build_s']:.2f} s"
        )
        if "shardload_s" in r:
            r["prepare_ratio"] = r["shardload_s"] / r["xarray_read_s"]
            line += f"; shardload prepare {r['shardload_s']:.2f} s ({r['prepare_ratio']:.2f}x)"
        print(line, flush=True)
        return r
    for k in ("shardload", "xarray", "xarray_fsync"):
        r[f"{k}_MBps"] = r["bytes"] / r[f"{k}_s"] / 1e6
    r["ratio"] = r["shardload_MBps"] / r["xarray_MBps"]
    r["ratio_fsync"] = r["shardload_MBps"] / r["xarray_fsync_MBps"]
    print(
        f"{case}: {mb:.0f} MB; shardload {r['shardload_MBps']:.0f} MB/s; xarray+dask to_zarr "
        f"{r['xarray_MBps']:.0f} MB/s, +fsync {r['xarray_fsync_MBps']:.0f} MB/s; ratio "
        f"{r['ratio']:.2f}x ({r['ratio_fsync']:.2f}x at equal durability)",
        flush=True,
    )
    return r


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--cases", default="radiation,rows,grid")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--columns-per-file", type=int, default=13568)
    ap.add_argument(
        "--files", type=int, default=4, help="radiation patch files (4 -> ~1.07 GB prepared)"
    )
    ap.add_argument("--rows", type=int, default=262144, help="rows of the rows case")
    ap.add_argument(
        "--grid-read-only",
        action="store_true",
        help="grid: time the read path only, not the whole prepare",
    )
    ap.add_argument("--compression", default="none", choices=["none", "lz4", "zstd"])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-prepare-"))
    work.mkdir(parents=True, exist_ok=True)
    makers = {"radiation": radiation_case, "rows": rows_case, "grid": grid_case}
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(makers)
    if unknown:
        raise SystemExit(f"unknown case(s) {sorted(unknown)}; choose from {sorted(makers)}")
    runs = {}
    for c in cases:
        runs[c], dt = timed(lambda c=c: makers[c](work, args))
        print(f"{c}: source ready in {dt:.1f} s", flush=True)
    results: dict[str, Any] = {"disk_write_MBps": disk_write_bandwidth(work)}
    print(f"disk write bandwidth (1 GiB tofile + fsync): {results['disk_write_MBps']:.0f} MB/s")
    for _ in range(args.repeats):
        for c in cases:
            results.setdefault(c, []).append(report(c, runs[c]()))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
