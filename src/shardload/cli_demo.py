"""``shardload demo``: the main job on the embedded default, end to end.

sample radiation data -> prepare (Zarr, threads) -> inspect -> stream into a small MLP.
Everything lives under ``$SHARDLOAD_HOME`` (default ``~/.shardload``).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from importlib import resources
from typing import Any

from .home import ensure_home

log = logging.getLogger("shardload.demo")


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="run the whole pipeline on generated MAELSTROM-style radiation data",
        description="Generate sample radiation files, prepare a Zarr store, inspect it and stream it "
        "into a small MLP, all under $SHARDLOAD_HOME (default ~/.shardload).",
    )
    p.add_argument("--columns", type=int, default=4096, help="columns per raw file (default 4096)")
    p.add_argument("--patches", type=int, default=4, help="number of patch files (default 4)")
    p.add_argument(
        "--steps", type=int, default=300, help="training steps (default 300; 0 skips training)"
    )
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--workers", type=int, default=2, help="DataLoader workers (default 2)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args: argparse.Namespace) -> int:
    from .cli_prepare import summary
    from .pipeline import prepare
    from .samples.radiation import write_radiation_sample

    home = ensure_home()
    raw = home / "data" / "raw" / "radiation"
    config = home / "config.yaml"
    if not config.exists():
        config.write_text(
            resources.files("shardload.configs").joinpath("radiation-flat.yaml").read_text()
        )
        print(f"wrote the default config {config}")
    t0 = time.perf_counter()
    if raw.exists():
        shutil.rmtree(raw)
    files = write_radiation_sample(
        raw, columns=args.columns, timesteps=(0,), patches=tuple(range(args.patches)), seed=0
    )
    print(f"[1/4] sample: {len(files)} raw files in {raw} ({time.perf_counter() - t0:.1f} s)")
    t1 = time.perf_counter()
    store = prepare(config, overrides=["overwrite=true"])
    print(f"[2/4] prepare: {store.url} ({time.perf_counter() - t1:.1f} s)")
    s = summary(store)
    shapes = ", ".join(f"{k}{tuple(a['shape'])}" for k, a in s["arrays"].items())
    splits = ", ".join(f"{k}={v['rows']}" for k, v in s["splits"].items())
    print(f"[3/4] inspect: {s['length']} samples, {s['num_chunks']} chunks of {s['chunk_rows']} rows, "
          f"arrays {shapes}, splits {splits}")  # fmt: skip
    if args.steps > 0:
        from .train_demo import train_mlp

        res = train_mlp(
            store, steps=args.steps, batch_size=args.batch_size, num_workers=args.workers
        )
        print(f"[4/4] train: {res['steps']} steps of a {res['params']:,}-parameter MLP, loss {res['first_loss']:.4f} -> "
              f"{res['last_loss']:.4f}, {res['samples_per_s']:,.0f} samples/s ({res['mb_per_s']:.1f} MB/s) "
              f"with {args.workers} DataLoader worker(s)")  # fmt: skip
    print(f"done in {time.perf_counter() - t0:.1f} s; workspace {home}")
    return 0
