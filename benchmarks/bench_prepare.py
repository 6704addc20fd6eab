"""Prepare throughput: shardload vs plain xarray + dask (``rechunk(...).to_zarr(...)``), same run.

Generates a MAELSTROM-style radiation sample (default ~1 GB of prepared flat arrays), then
measures, on the same machine and files:
  1. disk write bandwidth (numpy ``tofile`` of 1 GiB + fsync),
  2. shardload prepare (flat view, Zarr v3, threads; every chunk fsynced before it counts),
  3. the xarray + dask baseline: the same lazy ML view, ``.chunk({column: rows}).to_zarr()``,
     then the same plus an fsync of its files (the durability shardload gives).
Prints MB/s and ratios. Usage: python benchmarks/bench_prepare.py [--columns-per-file N] [--files K]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np


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


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--columns-per-file", type=int, default=13568)
    ap.add_argument(
        "--files", type=int, default=4, help="patch files (default 4 -> ~1.07 GB prepared)"
    )
    ap.add_argument("--compression", default="none", choices=["none", "lz4", "zstd"])
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None, help="write results here")
    args = ap.parse_args()

    import dask
    import xarray as xr
    import zarr

    import shardload
    from shardload.formats.base import FormatOptions
    from shardload.formats.zarr import compressors
    from shardload.pipeline import fsync_tree
    from shardload.samples.radiation import write_radiation_sample
    from shardload.sources.radiation import open_radiation

    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-prepare-"))
    raw = work / "raw"
    if not raw.exists():
        t = time.perf_counter()
        write_radiation_sample(
            raw,
            columns=args.columns_per_file,
            timesteps=(0,),
            patches=tuple(range(args.files)),
            seed=0,
        )
        print(
            f"sample data: {sum(p.stat().st_size for p in raw.iterdir()) / 1e6:.0f} MB raw in {time.perf_counter() - t:.1f} s"
        )
    inputs = sorted(str(p) for p in raw.glob("rad4NN_inputs_*.nc"))
    outputs = sorted(str(p) for p in raw.glob("3dcorrection_outputs_*.nc"))
    xvars = ["sca_inputs", "col_inputs", "hl_inputs", "inter_inputs"]
    yvars = ["flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw", "hr_sw", "hr_lw"]
    conf = {
        "source": {"kind": "radiation", "paths": inputs, "outputs": outputs},
        "sample_dims": ["column"], "view": "flat", "arrays": {"x": xvars, "y": yvars}, "dtype": "float32",
        "format": "zarr", "compression": args.compression, "out": str(work / "shardload-store"), "overwrite": True,
    }  # fmt: skip
    results: dict[str, float] = {}
    # warm-up, untimed: imports (xarray backends, dask, zarr) and file metadata for both paths
    _ = open_radiation(inputs[:1], outputs[:1])["hr_sw"].isel(column=slice(0, 4)).values
    results["disk_write_MBps"] = disk_write_bandwidth(work)
    print(f"disk write bandwidth (1 GiB tofile + fsync): {results['disk_write_MBps']:.0f} MB/s")

    t = time.perf_counter()
    store = shardload.prepare(conf, progress=False)
    dt = time.perf_counter() - t
    nbytes = sum(store.manifest.arrays[k].row_bytes for k in store.arrays) * len(store)
    rows = store.manifest.chunk_rows
    results.update(
        bytes=nbytes, rows_per_chunk=rows, shardload_s=dt, shardload_MBps=nbytes / dt / 1e6
    )
    print(
        f"shardload prepare: {nbytes / 1e6:.0f} MB in {dt:.1f} s = {results['shardload_MBps']:.0f} MB/s"
    )

    # baseline: the same lazy view with plain xarray + dask, rechunk along samples, to_zarr
    shutil.rmtree(work / "xarray-store", ignore_errors=True)
    t = time.perf_counter()
    ds = open_radiation(inputs, outputs)

    def flat(names):
        parts = [ds[v].data.reshape(ds.sizes["column"], -1) for v in names]
        return dask.array.concatenate(parts, axis=1).astype("float32")

    out = xr.Dataset({"x": (("column", "xf"), flat(xvars)), "y": (("column", "yf"), flat(yvars))})
    out = out.chunk({"column": rows, "xf": -1, "yf": -1})
    enc = {k: {"compressors": compressors(FormatOptions(args.compression))} for k in ("x", "y")}
    with dask.config.set(scheduler="threads"):
        out.to_zarr(
            work / "xarray-store", mode="w", zarr_format=3, encoding=enc, consolidated=False
        )
    dt = time.perf_counter() - t
    results.update(xarray_s=dt, xarray_MBps=nbytes / dt / 1e6)
    print(
        f"xarray+dask rechunk().to_zarr(): {nbytes / 1e6:.0f} MB in {dt:.1f} s = {results['xarray_MBps']:.0f} MB/s"
        " (left in the page cache)"
    )
    # shardload makes every chunk durable (fsync) before it records it as done; the same
    # guarantee for the baseline costs an fsync of its files after to_zarr
    t = time.perf_counter()
    fsync_tree(work / "xarray-store")
    dt_sync = dt + time.perf_counter() - t
    results.update(xarray_fsync_s=dt_sync, xarray_fsync_MBps=nbytes / dt_sync / 1e6)
    print(
        f"xarray+dask to_zarr() + fsync of its files: {dt_sync:.1f} s = "
        f"{results['xarray_fsync_MBps']:.0f} MB/s"
    )
    z = zarr.open_group(work / "xarray-store", mode="r")
    i = len(store) // 2
    assert np.array_equal(z["x"][i : i + 5], store.read("x", i, i + 5)), (
        "baseline and shardload differ"
    )
    results["speedup_vs_xarray"] = results["shardload_MBps"] / results["xarray_MBps"]
    results["speedup_vs_xarray_fsync"] = results["shardload_MBps"] / results["xarray_fsync_MBps"]
    results["fraction_of_disk_write"] = results["shardload_MBps"] / results["disk_write_MBps"]
    print(f"ratio shardload / xarray+dask: {results['speedup_vs_xarray']:.2f}x "
          f"({results['speedup_vs_xarray_fsync']:.2f}x against xarray+dask with fsync); "
          f"shardload / disk write bandwidth: {results['fraction_of_disk_write']:.2f}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
