"""Peer loaders for ``bench_load.py``, run in their own interpreter (``--peer-python``).

MosaicML Streaming and litdata pin numpy and torch versions our venv does not have, so they
live in a separate venv (see docs/benchmarks.md); this script imports neither shardload nor
anything of ours. ``bench_load.py`` runs it once per case as a subprocess::

    PEER_PY benchmarks/loadbench_peers.py --case mosaic-streaming:none:w2 --workdir DIR \\
        --batch-size 256 --seed 0 --max-seconds 20 --indices OUT.npz

It converts the benchmark's uncompressed Zarr store (``DIR/zarr-none``, read with zarr) into
the peer's own format once (``DIR/peer-mds``, ``DIR/peer-litdata``: uncompressed, as their
docs advise for local speed), then times one shuffled epoch through the peer's loader at its
documented settings (shuffle on, its default shuffle algorithm and block sizes, 2 DataLoader
workers for ``w2``), reads a second epoch (untimed) for the recurrence of batch-mates, and
writes the sample index of every row of every batch to ``--indices``. It prints one JSON
record (speed, peak RSS/PSS of the process tree); ``bench_load.py`` computes the quality
figures from the indices with ``shardload.plan.quality``, as for every other loader.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

PEERS = {
    "mosaic-streaming": "streaming.StreamingDataset (MDS, uncompressed; shuffle_algo default "
    "py1e) + torch DataLoader",
    "litdata": "litdata.StreamingDataset(shuffle=True) + litdata.StreamingDataLoader "
    "(optimize()d chunks, uncompressed)",
}


class PeakMem:
    """Peak RSS and PSS summed over this process and its children (sampled every 50 ms)."""

    def __init__(self) -> None:
        import psutil

        self.proc, self.peak, self.peak_pss = psutil.Process(), 0, 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        procs = [self.proc, *self.proc.children(recursive=True)]
        rss = pss = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                with open(f"/proc/{p.pid}/smaps_rollup", "rb") as f:
                    for line in f:
                        if line.startswith(b"Pss:"):
                            pss += int(line.split()[1]) * 1024
            except Exception:  # a worker that just exited
                pass
        self.peak, self.peak_pss = max(self.peak, rss), max(self.peak_pss, pss)

    def _run(self) -> None:
        k = 0
        while not self._stop.wait(0.05):
            k += 1
            self.sample()

    def __enter__(self) -> PeakMem:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()


def _source(work: Path):
    import zarr

    return zarr.open_array(str(work / "zarr-none" / "x"), mode="r")


def _import_streaming() -> None:
    """``import streaming`` imports its vision datasets, hence torchvision; the torchvision
    wheel on PyPI is linked against the CUDA torch build and cannot load beside the CPU one we
    install (``libtorch_cuda.so`` not found). The loader does not use them: stand in an empty
    ``streaming.vision`` so the rest imports."""
    import sys
    import types

    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))


def convert_mds(work: Path) -> Path:
    out = work / "peer-mds"
    if (out / "index.json").exists():
        return out
    _import_streaming()
    from streaming import MDSWriter

    x = _source(work)
    tmp = work / "peer-mds.partial"
    cols = {"x": f"ndarray:float32:{x.shape[1]}", "index": "int64"}
    with MDSWriter(out=str(tmp), columns=cols, compression=None) as w:
        step = x.chunks[0]
        for a in range(0, x.shape[0], step):
            block = np.asarray(x[a : a + step])
            for i, row in enumerate(block):
                w.write({"x": row, "index": a + i})
    tmp.rename(out)
    return out


def convert_litdata(work: Path) -> Path:
    out = work / "peer-litdata"
    if (out / "index.json").exists():
        return out
    from litdata.streaming.writer import BinaryWriter

    x = _source(work)
    tmp = work / "peer-litdata.partial"
    tmp.mkdir(parents=True, exist_ok=True)
    w = BinaryWriter(str(tmp), chunk_bytes="64MB")
    k = 0
    step = x.chunks[0]
    for a in range(0, x.shape[0], step):
        block = np.asarray(x[a : a + step])
        for i, row in enumerate(block):
            w.add_item(k, {"x": row, "index": a + i})
            k += 1
    w.done()
    w.merge()
    tmp.rename(out)
    return out


def build(work: Path, loader: str, workers: int, batch_size: int, seed: int):
    import torch  # noqa: F401

    if loader == "mosaic-streaming":
        _import_streaming()
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory
        from torch.utils.data import DataLoader

        clean_stale_shared_memory()
        ds = StreamingDataset(
            local=str(convert_mds(work)), shuffle=True, shuffle_seed=seed, batch_size=batch_size
        )
        kw: dict[str, Any] = {"num_workers": workers}
        if workers:
            kw["prefetch_factor"] = 2
        dl = DataLoader(ds, batch_size=batch_size, **kw)
        return dl, lambda b: b["index"].numpy()
    if loader == "litdata":
        from litdata import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(input_dir=str(convert_litdata(work)), shuffle=True, seed=seed)
        dl = StreamingDataLoader(ds, batch_size=batch_size, num_workers=workers)
        return dl, lambda b: b["index"].numpy()
    raise SystemExit(f"unknown peer loader {loader!r}; one of {list(PEERS)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--case", required=True)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-seconds", type=float, default=20.0)
    ap.add_argument("--indices", required=True)
    args = ap.parse_args()
    loader, codec, w = args.case.split(":")
    workers = int(w[1:])
    work = Path(args.workdir)
    meta = json.loads((work / "zarr-none" / "shardload.json").read_text())
    length = int(meta["chunk_bounds"][-1])
    row_bytes = int(np.prod(meta["arrays"]["x"]["shape"][1:])) * 4
    t = time.perf_counter()
    dl, index_of = build(work, loader, workers, args.batch_size, args.seed)
    setup_s = time.perf_counter() - t
    epochs: list[list[np.ndarray]] = [[], []]
    samples, truncated, first_s = 0, False, None
    with PeakMem() as mem:
        t0 = time.perf_counter()
        for b in dl:
            idx = np.asarray(index_of(b), np.int64).copy()
            epochs[0].append(idx)
            samples += len(idx)
            now = time.perf_counter() - t0
            first_s = now if first_s is None else first_s
            if args.max_seconds and now > args.max_seconds:
                truncated = True
                break
        seconds = time.perf_counter() - t0
        mem.sample()
    if not truncated:  # the next epoch, untimed: the same loader iterated again
        if hasattr(dl.dataset, "set_epoch"):
            dl.dataset.set_epoch(1)
        t1 = time.perf_counter()
        for b in dl:
            epochs[1].append(np.asarray(index_of(b), np.int64).copy())
            if time.perf_counter() - t1 > 2 * args.max_seconds:
                epochs[1] = []
                break
    np.savez(args.indices, **{f"e{e}_{k}": a for e in (0, 1) for k, a in enumerate(epochs[e])})
    print(
        json.dumps(
            {
                "case": args.case,
                "loader": loader,
                "codec": codec,
                "workers": workers,
                "store": f"peer-{'mds' if loader == 'mosaic-streaming' else 'litdata'}",
                "what": PEERS[loader],
                "note": f"peer venv; conversion/setup {setup_s:.1f} s",
                "samples": samples,
                "seconds": seconds,
                "first_batch_s": first_s,
                "samples_per_s": samples / seconds if seconds else 0.0,
                "MBps": samples * row_bytes / seconds / 1e6 if seconds else 0.0,
                "row_bytes": row_bytes,
                "epoch_samples": length,
                "truncated": truncated,
                "epoch_fraction": samples / length,
                "peak_rss_MiB": mem.peak / 2**20,
                "peak_pss_MiB": mem.peak_pss / 2**20,
                "indices": args.indices,
                "peer_versions": _versions(),
            }
        )
    )


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("mosaicml-streaming", "litdata", "torch", "numpy"):
        with contextlib.suppress(PackageNotFoundError):
            out[p] = version(p)
    return out


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
