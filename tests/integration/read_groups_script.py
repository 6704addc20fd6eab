"""Run under torchrun: read groups of 2 ranks stream a store; each rank writes what it got.

usage: read_groups_script.py STORE OUT_DIR [--stop-after K] [--resume STATE_JSON]

Each rank writes ``rank{R}.npz`` (its batches' ``index`` and ``a`` values, batch by batch) and
``rank{R}.json`` (its batch sizes, its read slices and the loader's state).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
import torch.distributed as dist

from shardload.torch import StreamingDataLoader, StreamingDataset


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("out")
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", default=None)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = StreamingDataset(args.store, batch_size=4, seed=7, read_group_size=2)
    loader = StreamingDataLoader(ds, num_workers=1, persistent_workers=False)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    index, values, sizes = [], [], []
    for step, batch in enumerate(loader):
        index.append(batch["index"].numpy().copy())
        values.append(batch["a"].numpy().copy())
        sizes.append(len(batch["index"]))
        dist.barrier()  # lockstep, as a training step's collectives would be
        if args.stop_after is not None and step + 1 == args.stop_after:
            break
    state = loader.state_dict()
    out = Path(args.out)
    empty = np.zeros((0,), np.int64)
    np.savez(
        out / f"rank{rank}.npz",
        index=np.concatenate(index) if index else empty,
        a=np.concatenate(values) if values else np.zeros((0, 0, 0), np.float32),
    )
    info = {"sizes": sizes, "slices": ds.read_slices(), "state": state, "len": len(ds)}
    (out / f"rank{rank}.json").write_text(json.dumps(info))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # do not wait on the DataLoader's worker of an abandoned iteration


if __name__ == "__main__":
    main()
