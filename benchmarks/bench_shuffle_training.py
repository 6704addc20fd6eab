"""The shuffle's effect on training: steps for the radiation MLP to reach a fixed validation loss
with each read order.

Orders (same store, same model, same seeds): ``default`` (``shuffle=True``: small pieces drawn
from every chunk), ``uniform`` (``shuffle="uniform"``, an exact permutation), ``legacy``
(``shuffle_chunks=4``: the earlier default, each batch from 4 chunks) and ``none``
(``shuffle=False``, chunks in order: the control). Each run trains the example MLP
(``shardload.train.models.MLP``, Adam 1e-3, batch ``--batch-size``, inputs and targets
standardised with the manifest's statistics) reading the ``train`` split with
``iter_batches`` in this process, and evaluates the MSE on the whole ``val`` split every
``--eval-every`` steps. Reported: for each order and seed, the first evaluated step at which the
validation loss is <= ``--target`` (None: not reached in ``--steps``), and the best loss.
Without ``--target``, the target is the worst of the orders' best validation losses (shuffled
orders only), times 1.05: every shuffled order reaches it, and the steps say how fast.

The store: MAELSTROM-style radiation sample files (``shardload sample radiation``), prepared
flat, npy, uncompressed, with ``--chunk-kib`` KiB chunks (small chunks: many chunks, as in a
big store; neighbouring columns of a patch are alike, as in the real data).

Usage::

    python benchmarks/bench_shuffle_training.py --workdir /tmp/shufftrain --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

ORDERS = {
    "default": {"shuffle": True},
    "uniform": {"shuffle": "uniform"},
    "legacy": {"shuffle": True, "shuffle_chunks": 4},
    "none": {"shuffle": False},
}


def make_store(workdir: Path, columns: int, patches: int, chunk_kib: int) -> str:
    from shardload.prep.driver import prepare
    from shardload.samples.radiation import write_radiation_sample

    out = workdir / f"radiation-{columns}x{patches}-{chunk_kib}k"
    if (out / "shardload.json").exists():
        return str(out)
    raw = workdir / f"raw-{columns}x{patches}"
    if not raw.exists():
        write_radiation_sample(raw, columns=columns, patches=tuple(range(patches)), seed=0)
    return prepare(
        {
            "source": {
                "kind": "radiation",
                "paths": [str(raw / "rad4NN_inputs_*.nc")],
                "outputs": [str(raw / "3dcorrection_outputs_*.nc")],
            },
            "sample_dims": ["column"],
            "view": "flat",
            "arrays": {
                "x": ["sca_inputs", "col_inputs", "hl_inputs", "inter_inputs"],
                "y": ["flux_dn_sw", "flux_up_sw", "flux_dn_lw", "flux_up_lw"],
            },
            "format": "npy",
            "compression": "none",
            "target_chunk_bytes": chunk_kib * 1024,
            "splits": {"train": 0.8, "val": 0.2},
            "split_seed": 1,
            "out": str(out),
        }
    ).url


def batches(store, order: dict, seed: int, batch_size: int):
    """Train batches forever, epoch after epoch, as float32 tensors."""
    import shardload

    epoch = 0
    while True:
        for b in shardload.iter_batches(
            store,
            batch_size=batch_size,
            split="train",
            seed=seed,
            epoch=epoch,
            drop_last=True,
            arrays=["x", "y"],
            **order,
        ):
            yield {"x": torch.from_numpy(np.array(b["x"])), "y": torch.from_numpy(np.array(b["y"]))}
        epoch += 1


def train(store, val: dict, norm, order: dict, seed: int, args) -> dict:
    from shardload.train.models import MLP

    torch.manual_seed(seed)
    m = store.manifest
    model = MLP(m.arrays["x"].shape[1], m.arrays["y"].shape[1], hidden=args.hidden)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    curve = []
    reached = None
    it = batches(store, order, seed, args.batch_size)
    for step in range(1, args.steps + 1):
        b = norm(next(it))
        loss = torch.nn.functional.mse_loss(model(b["x"]), b["y"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % args.eval_every == 0:
            with torch.no_grad():
                v = float(torch.nn.functional.mse_loss(model(val["x"]), val["y"]))
            curve.append((step, v))
            if args.target is not None and reached is None and v <= args.target:
                reached = step
                if args.stop_at_target:
                    break
    it.close()
    return {"curve": curve, "best": min(v for _, v in curve), "reached": reached}


def steps_to(curve: list, target: float) -> int | None:
    return next((s for s, v in curve if v <= target), None)


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--workdir", type=Path, required=True)
    p.add_argument("--columns", type=int, default=4096, help="columns per raw file")
    p.add_argument("--patches", type=int, default=4)
    p.add_argument("--chunk-kib", type=int, default=512)
    p.add_argument("--orders", nargs="+", default=list(ORDERS), choices=list(ORDERS))
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--eval-every", type=int, default=25)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--target", type=float, default=None)
    p.add_argument("--stop-at-target", action="store_true")
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.workdir.mkdir(parents=True, exist_ok=True)
    from shardload.store.core import open_store
    from shardload.train.transforms import Normalize

    store = open_store(make_store(args.workdir, args.columns, args.patches, args.chunk_kib))
    m = store.manifest
    norm = Normalize(m, ["x", "y"])
    val = {
        k: torch.from_numpy(np.array(store.read(k, *m.split_rows["val"])))
        if "val" in m.split_rows
        else None
        for k in ("x", "y")
    }
    if val["x"] is None:
        ids = m.splits["val"]
        val = {
            k: torch.from_numpy(np.concatenate([store.read_chunk(k, i) for i in ids]))
            for k in ("x", "y")
        }
    val = norm(val)
    print(
        f"store {store.url}: {m.split_num_rows('train')} train rows in {m.num_chunks} chunks "
        f"of {m.chunk_rows}, {len(val['x'])} val rows; batch {args.batch_size}"
    )
    runs: dict[str, dict[int, dict]] = {o: {} for o in args.orders}
    for seed in args.seeds:
        for o in args.orders:
            t0 = time.perf_counter()
            runs[o][seed] = r = train(store, val, norm, ORDERS[o], seed, args)
            print(
                f"seed {seed} {o:8s}: best val loss {r['best']:.4f}, "
                f"{time.perf_counter() - t0:.0f} s",
                flush=True,
            )
    target = args.target
    if target is None:
        shuffled = [r["best"] for o in args.orders if o != "none" for r in runs[o].values()]
        target = 1.05 * max(shuffled)
    print(f"\nsteps to validation loss <= {target:.4f} (evaluated every {args.eval_every} steps):")
    table = {}
    for o in args.orders:
        got = [steps_to(runs[o][s]["curve"], target) for s in args.seeds]
        table[o] = got
        ok = [g for g in got if g is not None]
        mean = f"mean {np.mean(ok):.0f}" if len(ok) == len(got) else f"{len(ok)}/{len(got)} reached"
        best = ", ".join(f"{runs[o][s]['best']:.4f}" for s in args.seeds)
        print(f"  {o:8s}: {got} ({mean}); best loss per seed {best}")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "target": target,
                    "steps": table,
                    "runs": runs,
                    "args": {k: str(v) for k, v in vars(args).items()},
                }
            )
        )


if __name__ == "__main__":
    main()
