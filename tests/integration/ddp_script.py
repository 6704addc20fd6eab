"""Run under torchrun: each rank streams a split and writes the indices of its batches.

usage: ddp_script.py STORE OUT_DIR MODE [--stop-after K] [--resume STATE_JSON]
       ddp_script.py STORE OUT_DIR MODE --contexts

``--contexts``: the dataset is built before ``init_process_group``; plain DataLoaders with 2
workers started by forkserver (before the process group exists: torchrun's RANK/WORLD_SIZE),
then by fork (two passes) and spawn (after it); each pass's rows and ``len(ds)``.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import DataLoader

from shardload.torch import StreamingDataLoader, StreamingDataset


def contexts(args: argparse.Namespace) -> None:
    # the forkserver imports these once; its workers fork from it (else each imports torch)
    multiprocessing.set_forkserver_preload(["torch", "shardload.torch"])
    ds = StreamingDataset(args.store, batch_size=16, split="train", mode=args.mode, seed=7)
    runs = []

    def run(name: str, context: str) -> None:
        loader = DataLoader(ds, batch_size=None, num_workers=2, multiprocessing_context=context)
        batches = [b["index"].tolist() for b in loader]
        runs.append({"name": name, "len": len(ds), "batches": batches})

    run("forkserver-env", "forkserver")
    dist.init_process_group("gloo")
    run("fork", "fork")
    run("fork-again", "fork")
    run("spawn", "spawn")
    rank = dist.get_rank()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"runs": runs}))
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("store")
    p.add_argument("out")
    p.add_argument("mode")
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--resume", default=None)
    p.add_argument("--contexts", action="store_true")
    args = p.parse_args()
    if args.contexts:
        return contexts(args)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = StreamingDataset(args.store, batch_size=16, split="train", mode=args.mode, seed=7)
    loader = StreamingDataLoader(ds, num_workers=2, persistent_workers=False)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    batches = []
    for step, batch in enumerate(loader):
        batches.append(batch["index"].tolist())
        dist.barrier()  # lockstep, as a training step's all-reduce would be
        if args.stop_after is not None and step + 1 == args.stop_after:
            break
    state = loader.state_dict()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps({"batches": batches, "state": state}))
    dist.destroy_process_group()
    os._exit(0)  # do not wait on the DataLoader's workers of the abandoned iteration


if __name__ == "__main__":
    main()
    # the interpreter's last collection at exit skips what is left (torch's modules: seconds of
    # a loaded CI machine, in each rank); what the test reads is written
    gc.freeze()
