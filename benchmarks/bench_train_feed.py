"""Is the loader the bottleneck? MLP training step time on CPU fed by shardload against fed
from an in-memory tensor.

Both feeds give the same model the same work: batches of ``--batch-size`` rows of the store's
``train`` split in a shuffled order, standardised with the manifest's statistics. The
in-memory feed holds the whole split as one tensor (already standardised) and gathers each
batch by a random index; the shardload feed is a :class:`~shardload.torch.StreamingDataLoader`
with ``--num-workers`` workers that normalise in the workers
(:class:`~shardload.train.transforms.Normalize`). Steps are timed after ``--warmup`` steps;
reported: mean step time of each and their ratio (goal: shardload / memory <= 1.05).

Usage::

    python benchmarks/bench_train_feed.py --store DIR            # a flat store (x, y) with splits
    python benchmarks/bench_train_feed.py --workdir /tmp/feed    # writes a radiation flat store
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch


def make_store(workdir: Path, columns: int) -> str:
    from shardload.prep.driver import prepare
    from shardload.samples.radiation import write_radiation_sample

    out = workdir / "radiation-flat"
    if (out / "shardload.json").exists():
        return str(out)
    raw = workdir / "raw"
    write_radiation_sample(raw, columns=columns, patches=(0, 1), seed=0)
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
            "format": "zarr",
            "compression": "lz4",
            "target_chunk_bytes": "4MiB",
            "splits": {"train": 0.9, "val": 0.1},
            "out": str(out),
        }
    ).url


def timed_steps(batches, model, opt, steps: int, warmup: int) -> float:
    """Mean seconds per step (next batch + forward + backward + optimizer step)."""
    it = iter(batches)
    t0 = 0.0
    for i in range(warmup + steps):
        if i == warmup:
            t0 = time.perf_counter()
        b = next(it)
        loss = torch.nn.functional.mse_loss(model(b["x"]), b["y"])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return (time.perf_counter() - t0) / steps


def forever(loader, ds):
    epoch = 0
    while True:
        ds.set_epoch(epoch)
        yield from loader
        epoch += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=None)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/shardload-feed"))
    ap.add_argument("--columns", type=int, default=2048, help="columns per raw file (2 files)")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--num-workers", type=int, default=1)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads of the training process")
    ap.add_argument("--hidden", type=int, default=256)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from shardload.store.core import open_store
    from shardload.torch import StreamingDataLoader, StreamingDataset
    from shardload.train.models import MLP
    from shardload.train.transforms import Normalize

    store = open_store(args.store or make_store(args.workdir, args.columns))
    m = store.manifest
    norm = Normalize(m, ["x", "y"])
    n_in, n_out = m.arrays["x"].shape[1], m.arrays["y"].shape[1]

    # in memory: the whole train split, standardised once
    ds = StreamingDataset(store, batch_size=args.batch_size, split="train", shuffle=False)
    parts = [dict(b) for b in StreamingDataLoader(ds, num_workers=0)]
    mem = {k: torch.cat([p[k] for p in parts]) for k in ("x", "y")}
    norm(mem)
    rows = len(mem["x"])
    gen = torch.Generator().manual_seed(0)

    def memory_batches():
        while True:
            perm = torch.randperm(rows, generator=gen)
            for i in range(0, rows - args.batch_size + 1, args.batch_size):
                idx = perm[i : i + args.batch_size]
                yield {"x": mem["x"][idx], "y": mem["y"][idx]}

    def fresh():
        torch.manual_seed(0)
        model = MLP(n_in, n_out, hidden=args.hidden)
        return model, torch.optim.Adam(model.parameters(), lr=1e-3)

    sds = StreamingDataset(store, batch_size=args.batch_size, split="train", seed=0)
    loader = StreamingDataLoader(
        sds,
        num_workers=args.num_workers,
        collate_fn=norm,
        persistent_workers=args.num_workers > 0,
    )
    results = {}
    for name, feed in (
        ("memory", memory_batches()),
        ("shardload", forever(loader, sds)),
        ("memory (again)", memory_batches()),
    ):
        model, opt = fresh()
        results[name] = timed_steps(feed, model, opt, args.steps, args.warmup)
        print(f"{name:15s}: {results[name] * 1e3:8.2f} ms/step")
    base = min(results["memory"], results["memory (again)"])
    print(
        f"store {store.url}: {rows} train rows, batch {args.batch_size}, MLP {n_in}->{n_out} "
        f"hidden {args.hidden}, {args.num_workers} workers, {args.threads} training threads"
    )
    print(f"shardload / memory step time: {results['shardload'] / base:.3f} (goal <= 1.05)")


if __name__ == "__main__":
    main()
