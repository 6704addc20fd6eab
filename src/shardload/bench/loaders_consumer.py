"""One emulated accelerator of ``shardload bench loaders`` (run as its own process).

It builds its loader over its rank's disjoint shard of the store, says ``ready`` on stdout,
waits for ``go`` on stdin (so every accelerator starts together), then takes batches and
"computes" each by sleeping ``compute_s`` (for ``epochs`` epochs, at most ``max_batches``
batches); at the end it prints one JSON line of timings.

Timings: ``first_batch_s`` from ``go`` to the first batch (loader and worker start-up);
``wall_s`` from the first batch to the end of the last batch's compute; ``busy_s`` the time
spent in the emulated compute, measured (on a loaded machine a sleep overshoots; counting the
nominal time instead would charge the scheduler's delay to the loader); the accelerator
utilisation is ``busy_s / wall_s`` (MLPerf Storage's AU, measured after start-up);
``cpu_s`` the CPU seconds of the loader from ``go`` to its end, its DataLoader workers
included (start-up too): on a machine whose cores other jobs share, the AU says what this
node fed today, ``cpu_s`` per batch what feeding one batch costs.
"""

from __future__ import annotations

import gc
import json
import resource
import sys
import time
from collections.abc import Iterable
from typing import Any

import numpy as np


def build(spec: dict[str, Any]) -> tuple[Iterable[Any], str]:
    """The loader of one accelerator: an iterable of batches, and a note on what it is."""
    kind, rank, world = spec["loader"], spec["rank"], spec["world"]
    if kind == "shardload":
        from shardload.torch import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(
            spec["store"],
            batch_size=spec["batch_size"],
            split=spec["split"],
            seed=spec["seed"],
            rank=rank,
            world_size=world,
            window=spec.get("window"),
        )
        return StreamingDataLoader(ds, num_workers=spec["workers"]), "StreamingDataLoader"
    if kind == "zarr-torch-dataset":
        import zarr
        from zarrdataset import ZarrDataLoader, ZarrIterableDataset

        z = zarr.open_array(spec["array"], mode="r")  # the store's first array, local path
        mine = np.arange(rank, z.nchunks, world)  # this rank's chunks: a disjoint shard
        ds = ZarrIterableDataset(
            samples=z,
            targets=np.arange(z.shape[0], dtype=np.int64),
            selected_chunk_indexes=mine,
            shuffle_chunks=True,
            chunks_shuffle_seed=spec["seed"],
            shuffle_buffer=True,
            buffer_shuffle_seed=spec["seed"],
        )
        w = spec["workers"]
        loader = ZarrDataLoader(
            dataset=ds,
            num_workers=w,
            batch_size=spec["batch_size"],
            prefetch_factor=2 if w else None,
        )
        return loader, f"ZarrIterableDataset over chunks {rank}::{world} of {spec['array']}"
    raise ValueError(f"unknown loader {kind!r}")


def _rows(batch: Any) -> int:
    if isinstance(batch, dict):
        batch = next(iter(batch.values()))
    if isinstance(batch, (list, tuple)):
        batch = batch[0]
    return int(batch.shape[0])


def run(spec: dict[str, Any]) -> dict[str, Any]:
    loader, _ = build(spec)
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(1)
    compute_s, cap = float(spec["compute_s"]), spec.get("max_batches")
    t_go = time.perf_counter()
    cpu_go = _cpu_s()
    it = iter(loader)
    batches = rows = 0
    wait_s = busy_s = 0.0
    t_first = None
    epochs_left = int(spec.get("epochs") or 1) - 1
    while cap is None or batches < cap:
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            if epochs_left == 0:
                break
            epochs_left -= 1
            it = iter(loader)  # the next epoch (a wait like any other, charged to the loader)
            continue
        now = time.perf_counter()
        if t_first is None:
            t_first = now
        else:
            wait_s += now - t0
        batches += 1
        rows += _rows(batch)
        del batch
        t0 = time.perf_counter()
        time.sleep(compute_s)  # the emulated accelerator computes
        busy_s += time.perf_counter() - t0
    t_end = time.perf_counter()
    del it  # its workers exit and are reaped: their CPU time counts in _cpu_s()
    gc.collect()
    cpu_s = _cpu_s() - cpu_go
    first = (t_first or t_end) - t_go
    wall = t_end - (t_first or t_end)
    return {
        "rank": spec["rank"],
        "batches": batches,
        "rows": rows,
        "first_batch_s": first,
        "wall_s": wall,
        "wait_s": wait_s,
        "busy_s": busy_s,
        "au": busy_s / wall if wall > 0 else 0.0,
        "cpu_s": cpu_s,
    }


def _cpu_s() -> float:
    """CPU seconds of this process and of its children that have exited."""
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + kids.ru_utime + kids.ru_stime


def main() -> None:
    spec = json.loads(sys.argv[1])
    out = run(spec)
    print("result " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
