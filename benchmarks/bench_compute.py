"""Block-wise compute vs dask's ``map_overlap(...).to_zarr``: peak RSS and time, same run.

Writes a float32 cube (``--gib``, default 1 GiB: (n, 512, 512), Zarr v3, chunks (64, 512, 512)
unless ``--chunks``), then computes one attribute, a box mean over ``2 depth + 1`` samples on
every axis (``scipy.ndimage.uniform_filter``) with ``depth`` on every axis (default 8),
boundary ``reflect``, with 2 threads:

- ``shardload``: ``shardload.compute`` into a store (Zarr, zstd);
- ``dask``: ``da.map_overlap(func, da.from_zarr(src), depth, boundary, trim=True).to_zarr``
  (zstd via the same Blosc codec), dask's threaded scheduler with the same number of workers.

Each runs in a fresh subprocess; its peak RSS is ``ru_maxrss`` (whole process, imports
included); the results are checked equal. Prints a markdown table.

Usage::

    python benchmarks/bench_compute.py                 # 1 GiB, depth 8, 2 threads
    python benchmarks/bench_compute.py --gib 0.25 --depth 4 --workers 2
    python benchmarks/bench_compute.py --gib 0.0625 --chunks 32 32 32 --map-blocks  # small blocks
    # the headline case (dask issue 3671): a stack of images, small blocks on every axis
    python benchmarks/bench_compute.py --shape 100 100 60 60 --chunks 10 10 30 30 \
        --depth 0 0 1 1 --map-blocks
    # issue 25: the `shardload sample seismic` cube as written ((128, 512, 512), zstd chunks of
    # 64 inlines), blocks 32^3, 64^3 and whole traces (32, 32, 512), against dask in one run
    python benchmarks/bench_compute.py --seismic

With ``--seismic`` the source is written by ``shardload sample seismic`` with its defaults
(``--shape`` to change the cube) and not rechunked: the blocks differ from its chunks. dask reads
it with ``da.from_zarr(...).rechunk(blocks)`` (each source chunk decoded once, then split), and
shardload with ``chunks: {0: B0, 1: B1, 2: B2}``.
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def smooth(x: np.ndarray, *, size: int | list[int] = 17) -> np.ndarray:
    """Box mean over ``size`` samples on every axis, or ``size[k]`` on axis ``k`` (needs a halo
    of ``size // 2``)."""
    from scipy import ndimage

    return ndimage.uniform_filter(x, size=size, mode="reflect")  # type: ignore[no-any-return]


def make_cube(path: Path, shape: tuple[int, ...], chunks: tuple[int, ...]) -> None:
    import zarr

    g = zarr.open_group(store=str(path), mode="w", zarr_format=3)
    arr = g.create_array("amp", shape=shape, chunks=chunks, dtype="float32", compressors=None)
    rng = np.random.default_rng(0)
    for a in range(0, shape[0], chunks[0]):
        b = min(a + chunks[0], shape[0])
        arr[a:b] = rng.standard_normal((b - a, *shape[1:]), dtype=np.float32)


def run_case(
    case: str, src: Path, out: Path, depths: list[int], workers: int, blocks: list[int] | None
) -> dict[str, float]:
    sys.path.insert(0, str(HERE))
    import zarr as _zarr

    ndim = len(_zarr.open_group(str(src), mode="r")["amp"].shape)
    if len(depths) == 1:
        depths = depths * ndim
    depth: dict[int, int] = dict(enumerate(depths))
    size = [2 * d + 1 for d in depths]
    t0 = time.perf_counter()
    if case == "shardload":
        import shardload

        shardload.compute(
            {
                "source": {"paths": [str(src)], "variable": "amp"},
                "attributes": {
                    "smooth": {
                        "function": "bench_compute:smooth",
                        "depth": depth,
                        "boundary": "reflect",
                        "size": size,
                    }
                },
                "out": str(out),
                "execution": {"scheduler": "threads", "num_workers": workers},
            }
            | ({"chunks": dict(enumerate(blocks))} if blocks else {}),
            progress=False,
        )
    else:
        import dask
        import dask.array as da
        import zarr
        from zarr.codecs import BloscCodec

        x = da.from_zarr(str(src), component="amp")
        if blocks:  # decode each source chunk once, split it into the blocks
            x = x.rechunk(tuple(blocks))
        if case == "dask-map-blocks":  # the same function without halo: dask's baseline peak
            y = x.map_blocks(smooth, dtype=x.dtype, size=size)
        else:
            y = da.map_overlap(
                smooth, x, depth=depth, boundary="reflect", trim=True, dtype=x.dtype, size=size
            )
        g = zarr.open_group(store=str(out), mode="w", zarr_format=3)
        arr = g.create_array(
            "smooth",
            shape=y.shape,
            chunks=x.chunksize,
            dtype=y.dtype,
            compressors=BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),
        )
        with dask.config.set(scheduler="threads", num_workers=workers):
            da.to_zarr(y, arr)
    seconds = time.perf_counter() - t0
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "seconds": seconds,
        "peak_rss_bytes": ru.ru_maxrss * 1024,
        "page_faults": ru.ru_minflt + ru.ru_majflt,
    }


def spawn(
    case: str, src: Path, out: Path, depth: list[int], workers: int, blocks: list[int] | None
) -> dict[str, float]:
    """``run_case`` in a fresh interpreter (its own peak RSS)."""
    cmd = [sys.executable, __file__, "--depth", *map(str, depth), "--workers", str(workers)]
    if blocks:
        cmd += ["--blocks", *map(str, blocks)]
    cmd += ["--run-case", case, str(src), str(out)]
    res = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if res.returncode:
        sys.exit(f"{case} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def same_arrays(a_path: Path, b_path: Path, rows: int) -> bool:
    import zarr

    a = zarr.open_group(str(a_path), mode="r")["smooth"]
    b = zarr.open_group(str(b_path), mode="r")["smooth"]
    return all(np.array_equal(a[i : i + rows], b[i : i + rows]) for i in range(0, a.shape[0], rows))


def seismic(args: argparse.Namespace) -> None:
    """The three block sizes of issue 25 on the ``shardload sample seismic`` cube."""
    from shardload.samples.seismic import write_seismic_sample

    shape = tuple(args.shape) if args.shape else (128, 512, 512)
    cases = {"32^3": [32, 32, 32], "64^3": [64, 64, 64], "traces": [32, 32, shape[2]]}
    if args.blocks:
        cases = {"x".join(map(str, args.blocks)): list(args.blocks)}
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        src = Path(tmp) / "cube.zarr"
        t0 = time.perf_counter()
        write_seismic_sample(src, shape)  # `shardload sample seismic --shape ...` defaults
        print(
            f"shardload sample seismic --shape {' '.join(map(str, shape))}: chunks of 64 inlines "
            f"(zstd), {np.prod(shape) * 4 / 2**20:.0f} MiB, written in "
            f"{time.perf_counter() - t0:.1f} s; depth {args.depth}, boundary reflect, "
            f"{args.workers} threads\n"
        )
        print(
            "| blocks | dask time (s) | shardload time (s) | time ratio | dask peak RSS (MiB) "
            "| shardload peak RSS (MiB) | peak ratio | dask page faults | shardload page faults "
            "| equal |\n|---|---|---|---|---|---|---|---|---|---|"
        )
        for name, blocks in cases.items():
            res = {}
            for case in ("dask", "shardload"):
                out = Path(tmp) / f"{case}-{name}.zarr"
                res[case] = spawn(case, src, out, args.depth, args.workers, blocks)
            same = same_arrays(
                Path(tmp) / f"dask-{name}.zarr", Path(tmp) / f"shardload-{name}.zarr", blocks[0]
            )
            for case in ("dask", "shardload"):
                shutil.rmtree(Path(tmp) / f"{case}-{name}.zarr")
            d, s = res["dask"], res["shardload"]
            print(
                f"| {name} {tuple(blocks)} | {d['seconds']:.1f} | {s['seconds']:.1f} | "
                f"{s['seconds'] / d['seconds']:.2f} | {d['peak_rss_bytes'] / 2**20:.0f} | "
                f"{s['peak_rss_bytes'] / 2**20:.0f} | "
                f"{s['peak_rss_bytes'] / d['peak_rss_bytes']:.2f} | {d['page_faults']:,} | "
                f"{s['page_faults']:,} | {same} |",
                flush=True,
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gib", type=float, default=1.0)
    p.add_argument("--depth", type=int, nargs="+", default=[8], help="one, or one per axis")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shape", type=int, nargs="+", default=None, help="instead of --gib")
    p.add_argument("--chunks", type=int, nargs="+", default=None)
    p.add_argument("--dir", default=None)
    p.add_argument(
        "--map-blocks",
        action="store_true",
        help="also run dask's map_blocks (no halo) for its baseline peak",
    )
    p.add_argument("--blocks", type=int, nargs="+", default=None, help="compute blocks")
    p.add_argument(
        "--seismic",
        action="store_true",
        help="the sample seismic cube, blocks 32^3, 64^3 and whole traces (or --blocks)",
    )
    p.add_argument("--run-case", nargs=3, metavar=("CASE", "SRC", "OUT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.run_case:
        case, src, out = args.run_case
        res = run_case(case, Path(src), Path(out), args.depth, args.workers, args.blocks)
        print(json.dumps(res))
        return
    if args.seismic:
        seismic(args)
        return
    n = max(1, round(args.gib * 2**30 / (512 * 512 * 4)))
    shape = tuple(args.shape) if args.shape else (n, 512, 512)
    chunks = tuple(args.chunks) if args.chunks else (64, 512, 512)
    if len(chunks) != len(shape) or len(args.depth) not in (1, len(shape)):
        sys.exit(f"--chunks {chunks} and --depth {args.depth} must match --shape {shape}")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        src = Path(tmp) / "cube.zarr"
        t0 = time.perf_counter()
        make_cube(src, shape, chunks)
        print(
            f"cube {shape} float32 ({np.prod(shape) * 4 / 2**30:.2f} GiB), chunks {chunks}, "
            f"written in {time.perf_counter() - t0:.1f} s"
        )
        results = {}
        cases = ("dask", "shardload") + (("dask-map-blocks",) if args.map_blocks else ())
        for case in cases:
            out = Path(tmp) / f"{case}.zarr"
            results[case] = spawn(case, src, out, args.depth, args.workers, None)
        same = same_arrays(Path(tmp) / "dask.zarr", Path(tmp) / "shardload.zarr", chunks[0])
    d, s = results["dask"], results["shardload"]
    print(
        f"\ndepth {args.depth}, boundary reflect, {args.workers} threads; results equal: {same}\n"
    )
    print("| engine | time (s) | peak RSS (MiB) |\n|---|---|---|")
    rows = [("dask map_overlap(...).to_zarr", d), ("shardload.compute", s)]
    if "dask-map-blocks" in results:
        rows.append(("dask map_blocks(...).to_zarr (no halo)", results["dask-map-blocks"]))
    for name, r in rows:
        print(f"| {name} | {r['seconds']:.1f} | {r['peak_rss_bytes'] / 2**20:.0f} |")
    print(
        f"\nshardload / dask: time {s['seconds'] / d['seconds']:.2f}x, "
        f"peak RSS {s['peak_rss_bytes'] / d['peak_rss_bytes']:.2f}x"
    )
    if "dask-map-blocks" in results:
        mb = results["dask-map-blocks"]["peak_rss_bytes"]
        print(
            f"peak RSS / dask map_blocks peak: dask map_overlap {d['peak_rss_bytes'] / mb:.2f}x, "
            f"shardload {s['peak_rss_bytes'] / mb:.2f}x"
        )


if __name__ == "__main__":
    main()
