"""The loaders compared by ``bench_load.py``; each case runs alone in a fresh subprocess.

A case name is ``LOADER:CODEC:wWORKERS`` (``shardload-dl:none:w2``). Every loader yields
batches of ``batch_size`` samples of one shuffled epoch, and the global row index of each
sample, so the shuffle quality (distinct chunks per batch) and the completeness of the epoch
are checked for all of them the same way. Peak memory is sampled with psutil over the process
and all its children (DataLoader workers), every 20 ms.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

LOADERS = {
    "shardload-iter": "shardload.iter_batches, in-process (no torch)",
    "shardload-dl": "shardload.torch.StreamingDataset + DataLoader(batch_size=None)",
    "shardload-sdl": "shardload.torch.StreamingDataLoader",
    "shardload-iter-legacy": "iter_batches(shuffle_chunks=4): the default before small pieces",
    "shardload-sdl-legacy": "StreamingDataLoader, StreamingDataset(shuffle_chunks=4): the default before small pieces",
    "shardload-iter-uniform": "iter_batches(shuffle='uniform'): a uniform permutation of rows",
    "shardload-sdl-uniform": "StreamingDataLoader, StreamingDataset(shuffle='uniform')",
    "shardload-iter-pool8": "iter_batches(shuffle_chunks=8): a group of 8 whole (decoded) chunks",
    "shardload-iter-mem": "iter_batches(shuffle_chunks=prefetch=K): whole chunks, K = the rows of the "
    "zstd default's group (4 chunks of the base chunk rows) / the store's chunk rows: equal memory",
    "shardload-sdl-mem": "StreamingDataLoader, StreamingDataset(shuffle_chunks=prefetch=K), K as -mem",
    "shardload-iter-memgroup": "iter_batches(shuffle_chunks=K), K as -mem, default prefetch (4 chunks)",
    "shardload-sdl-memgroup": "StreamingDataLoader, StreamingDataset(shuffle_chunks=K), K as -mem",
    "shardload-sdl-r4": "StreamingDataLoader, 4 ranks read one after the other (quality over all ranks)",
    "shardload-sdl-r16": "StreamingDataLoader, 16 ranks read one after the other (quality over all ranks)",
    "naive-zarr": "map Dataset, zarr x[i] per sample + DataLoader(shuffle=True)",
    "naive-h5py": "map Dataset, h5py x[i] per sample + DataLoader(shuffle=True)",
    "naive-npy": "map Dataset, mmap'd npy chunks x[i] per sample + DataLoader(shuffle=True)",
    "xbatcher": "xbatcher BatchGenerator + xbatcher.loaders.torch.MapDataset, DataLoader(shuffle=True)",
    "zarr-torch-dataset": "zarrdataset.ZarrIterableDataset (chunk + buffer shuffle) + ZarrDataLoader",
    "torch-handoff": "DataLoader hand-off only: workers yield fresh tensors, no I/O",
    "mosaic-streaming": "MosaicML streaming.StreamingDataset (MDS) + DataLoader, in --peer-python",
    "litdata": "litdata.StreamingDataset(shuffle=True) + StreamingDataLoader, in --peer-python",
}
#: Loaders run by benchmarks/loadbench_peers.py in another interpreter (``--peer-python``).
PEER = {"mosaic-streaming", "litdata"}
#: Loaders that read the uncompressed data from their own copy (not from a Zarr store).
OWN_COPY = {"naive-h5py": "hdf5", "naive-npy": "npy"}
NO_IO = {"torch-handoff"}


def parse_case(name: str) -> tuple[str, str, int]:
    """``LOADER:CODEC:wN``; CODEC ``none``, ``zstd``, or ``zstd-cR`` / ``zstd-sR`` (zstd
    chunks of R rows, alone or inside shards of the base chunk rows: ``loadbench_data``)."""
    from loadbench_data import small_chunk_kind

    loader, codec, w = name.split(":")
    ok_codec = codec in ("none", "zstd") or small_chunk_kind(f"zarr-{codec}") is not None
    if loader not in LOADERS or not ok_codec or not w.startswith("w"):
        raise ValueError(
            f"bad case name {name!r}: expected LOADER:none|zstd|zstd-cR|zstd-sR:wN, LOADER in "
            f"{list(LOADERS)}"
        )
    return loader, codec, int(w[1:])


def case_store(work: Path, loader: str, codec: str) -> Path:
    if loader in PEER:  # converted from zarr-none by loadbench_peers.py on first use
        return work / ("peer-mds" if loader == "mosaic-streaming" else "peer-litdata")
    return work / OWN_COPY.get(loader, f"zarr-{codec}")


# -- memory -------------------------------------------------------------------------------------
class PeakRSS:
    """Peak of (RSS of this process + RSS of its lasting descendants), sampled in a thread.

    The RSS sum counts pages shared between the parent and forked workers (libraries, torch)
    once per process, as ``ps`` does; the PSS sum (sampled less often, it costs more) splits
    shared pages between the processes that map them. The main process's own peak
    (``VmHWM``) bounds the sum from below, so a short spike between samples is not lost.

    The sampler shares the CPUs with the loader it measures, so on Linux it reads
    ``/proc/PID/statm`` (RSS, ~0.03 ms a process) and ``/proc/PID/smaps_rollup`` (PSS) rather
    than psutil's ``memory_full_info`` (a full ``smaps`` parse, ~10 ms a process here), and
    looks for new child processes every ``children_every`` samples.
    """

    def __init__(
        self, interval_s: float = 0.05, pss_every: int = 10, children_every: int = 4
    ) -> None:
        import psutil

        self._proc = psutil.Process()
        self._psutil = psutil
        self.interval_s, self.pss_every = interval_s, pss_every
        self.children_every = children_every
        self._proc_fs = os.path.exists(f"/proc/{os.getpid()}/smaps_rollup")
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._children: list[Any] = []
        self._seen: set[int] = set()  # the pids of the last scan's descendants
        self.peak = self.now()
        self.peak_pss = self.now_pss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _refresh_children(self) -> None:
        """The descendants to sum: those seen by this scan and the one before. A process that
        forks a helper (``ctypes.util.find_library`` runs ``ldconfig``) has a child whose RSS
        is the forking process's own until it execs: summed, it added a whole worker (~270 MiB)
        to the peak now and then (docs/benchmarks.md, issue 25). The loader's workers live
        for the whole run."""
        with contextlib.suppress(self._psutil.Error):
            now = self._proc.children(recursive=True)
            self._children = [c for c in now if c.pid in self._seen]
            self._seen = {c.pid for c in now}

    def _sum(self, get: Callable[[Any], int]) -> int:
        total = get(self._proc)
        for c in self._children:
            with contextlib.suppress(self._psutil.Error, OSError, ValueError):
                total += get(c)
        return total

    def _rss(self, p: Any) -> int:
        if self._proc_fs:
            with open(f"/proc/{p.pid}/statm", "rb") as f:
                return int(f.read().split()[1]) * self._page
        return int(p.memory_info().rss)

    def _pss(self, p: Any) -> int:
        if self._proc_fs:
            with open(f"/proc/{p.pid}/smaps_rollup", "rb") as f:
                for line in f:
                    if line.startswith(b"Pss:"):
                        return int(line.split()[1]) * 1024
            return 0
        return int(p.memory_full_info().pss)

    def now(self) -> int:
        self._refresh_children()
        return self._sum(self._rss)

    def now_pss(self) -> int:
        self._refresh_children()
        return self._sum(self._pss)

    def _run(self) -> None:
        k = 0
        while not self._stop.wait(self.interval_s):
            k += 1
            if k % self.children_every == 0:
                self._refresh_children()
            if k % self.pss_every == 0:
                self.peak_pss = max(self.peak_pss, self._sum(self._pss))
            self.peak = max(self.peak, self._sum(self._rss))

    def __enter__(self) -> PeakRSS:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.now())


def _vm_hwm_bytes() -> int:
    """This process's peak RSS since exec (``VmHWM``; ``ru_maxrss`` would include the parent's
    peak from before exec, on Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


# -- the loaders --------------------------------------------------------------------------------
# Each builder returns (iterable of batches, function batch -> int64 numpy row indices, notes).
Builder = Callable[..., tuple[Iterable[Any], Callable[[Any], np.ndarray], str]]


def _torch_generator(seed: int):
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    return g


def _dl_kwargs(workers: int) -> dict[str, Any]:
    return {"num_workers": workers, "prefetch_factor": 2} if workers else {"num_workers": 0}


#: shardload loader name suffix -> options (the same run measures the defaults against them)
PRESETS: dict[str, dict[str, Any]] = {
    "legacy": {"shuffle_chunks": 4},
    "uniform": {"shuffle": "uniform"},
    "pool8": {"shuffle_chunks": 8},
}


def equal_memory_chunks(store: Path) -> int:
    """Chunks per group (and read ahead) holding as many decoded rows as the zstd default on the
    base chunking (``DEFAULT_SHUFFLE_CHUNKS`` chunks of ``bench-spec.json``'s chunk rows)."""
    import json

    from shardload.plan.epoch import DEFAULT_SHUFFLE_CHUNKS

    base = json.loads((store.parent / "bench-spec.json").read_text())["chunk_rows"]
    bounds = json.loads((store / "shardload.json").read_text())["chunk_bounds"]
    return max(1, DEFAULT_SHUFFLE_CHUNKS * int(base) // int(bounds[1] - bounds[0]))


def build_shardload(
    store: Path, loader: str, workers: int, batch_size: int, seed: int, epoch: int = 0
):
    base, _, preset = loader.partition("-")[2].partition("-")
    opts: dict[str, Any] = {"shuffle": True, **PRESETS.get(preset, {})}
    if preset in ("mem", "memgroup"):  # the decoded pool at the zstd default's memory
        k = equal_memory_chunks(store)
        opts["shuffle_chunks"] = k
        if preset == "mem":  # and read a whole group ahead
            opts["prefetch"] = k
    if base == "iter":
        import shardload

        batches = shardload.iter_batches(
            store, batch_size=batch_size, seed=seed, epoch=epoch, **opts
        )
        note = "numpy batches in the main process"
        return batches, lambda b: b["index"], note
    from torch.utils.data import DataLoader

    from shardload.torch import StreamingDataLoader, StreamingDataset

    if preset.startswith("r"):  # every rank of a world, one after the other

        def ranks(world: int = int(preset[1:])):
            for r in range(world):
                ds = StreamingDataset(
                    store, batch_size=batch_size, seed=seed, rank=r, world_size=world, **opts
                )
                ds.set_epoch(epoch)
                yield from StreamingDataLoader(ds, batch_size=None, **_dl_kwargs(workers))

        return ranks(), lambda b: b["index"].numpy(), "ranks read one after the other"
    ds = StreamingDataset(store, batch_size=batch_size, seed=seed, **opts)
    ds.set_epoch(epoch)
    cls = StreamingDataLoader if base == "sdl" else DataLoader
    dl = cls(ds, batch_size=None, **_dl_kwargs(workers))
    return dl, lambda b: b["index"].numpy(), ""


class _NaiveMap:
    """Map-style dataset: one sample per ``__getitem__``, opened lazily (after fork)."""

    def __init__(self, store: Path, kind: str, length: int, chunk_rows: int) -> None:
        self.store, self.kind, self.length, self.chunk_rows = store, kind, length, chunk_rows
        self._x: Any = None
        if kind == "npy":
            from loadbench_data import npy_chunk_files

            self._files = npy_chunk_files(store)
        else:  # imported in the parent, as a training script would, so forked workers share it
            __import__("zarr" if kind == "zarr" else "h5py")

    def __len__(self) -> int:
        return self.length

    def _open(self) -> Any:
        if self.kind == "zarr":
            import zarr

            return zarr.open_array(str(self.store / "x"), mode="r")
        if self.kind == "h5py":
            import h5py

            return h5py.File(self.store / "data.h5", "r")["x"]
        return [np.load(p, mmap_mode="r") for p in self._files]

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        if self._x is None:
            self._x = self._open()
        if self.kind == "npy":
            c, r = divmod(i, self.chunk_rows)
            return np.array(self._x[c][r]), i
        return self._x[i], i

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_x": None}


def build_naive(
    store: Path,
    loader: str,
    workers: int,
    batch_size: int,
    seed: int,
    *,
    length: int,
    chunk_rows: int,
):
    from torch.utils.data import DataLoader

    ds = _NaiveMap(store, loader.split("-")[1], length, chunk_rows)
    dl = DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        generator=_torch_generator(seed),
        **_dl_kwargs(workers),
    )
    return dl, lambda b: b[1].numpy(), "RandomSampler over samples; default collate"


def _open_x_dataarray(store: Path):
    """The store's ``x`` as a lazy DataArray (dims sample, feature), the way a user would."""
    import warnings

    import xarray as xr

    try:
        with warnings.catch_warnings():  # zarr: "shardload.json is not a Zarr component"
            warnings.simplefilter("ignore")
            ds = xr.open_dataset(store, engine="zarr", consolidated=False, chunks={})
        return ds["x"].rename(
            {ds["x"].dims[0]: "sample", ds["x"].dims[1]: "feature"}
        ), "xr.open_dataset(engine='zarr')"
    except Exception as exc:  # shardload's Zarr v3 arrays carry no dimension_names
        import dask.array as da

        how = f"xr.DataArray(dask.array.from_zarr(...)) (xr.open_dataset failed: {type(exc).__name__})"
        return xr.DataArray(da.from_zarr(str(store / "x")), dims=("sample", "feature")), how


def build_xbatcher(
    store: Path,
    loader: str,
    workers: int,
    batch_size: int,
    seed: int,
    *,
    length: int,
    chunk_rows: int,
):
    import xarray as xr
    import xbatcher
    from torch.utils.data import DataLoader
    from xbatcher.loaders.torch import MapDataset

    x, how = _open_x_dataarray(store)
    idx = xr.DataArray(np.arange(length, dtype=np.int64), dims="sample")
    nfeat = x.sizes["feature"]
    gx = xbatcher.BatchGenerator(x, input_dims={"sample": batch_size, "feature": nfeat})
    gy = xbatcher.BatchGenerator(idx, input_dims={"sample": batch_size})
    ds = MapDataset(gx, gy)
    dl = DataLoader(
        ds, batch_size=None, shuffle=True, generator=_torch_generator(seed), **_dl_kwargs(workers)
    )
    note = (
        f"xbatcher cuts consecutive {batch_size}-row windows; DataLoader(shuffle=True) "
        f"shuffles the order of the windows only; rows not filling a window are dropped; {how}"
    )
    return dl, lambda b: b[1].numpy().reshape(-1), note


def build_ztd(
    store: Path,
    loader: str,
    workers: int,
    batch_size: int,
    seed: int,
    *,
    length: int,
    chunk_rows: int,
):
    import zarr
    from zarrdataset import ZarrDataLoader, ZarrIterableDataset

    z = zarr.open_array(str(store / "x"), mode="r")
    ds = ZarrIterableDataset(
        samples=z,
        targets=np.arange(length, dtype=np.int64),
        shuffle_chunks=True,
        chunks_shuffle_seed=seed,
        shuffle_buffer=True,
        buffer_shuffle_seed=seed,
    )
    dl = ZarrDataLoader(
        dataset=ds,
        num_workers=workers,
        batch_size=batch_size,
        prefetch_factor=2 if workers else None,
    )
    note = (
        "each worker loads all of its (shuffled) chunks into memory, then yields its rows in "
        "a random order; targets = the row index array (numpy), to check the shuffle"
    )
    return dl, lambda b: b[1].numpy(), note


class _Handoff:
    """Workers yield fresh (batch, features) tensors and their indices: no I/O at all."""

    def __init__(self, length: int, features: int, batch_size: int) -> None:
        self.length, self.features, self.batch_size = length, features, batch_size

    def __iter__(self):
        import torch
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        w, n = (0, 1) if info is None else (info.id, info.num_workers)
        b = self.batch_size
        for k in range(w, self.length // b, n):
            yield {"x": torch.empty((b, self.features)), "index": torch.arange(k * b, (k + 1) * b)}


def build_handoff(
    store: Path,
    loader: str,
    workers: int,
    batch_size: int,
    seed: int,
    *,
    length: int,
    chunk_rows: int,
    features: int,
):
    from torch.utils.data import DataLoader, IterableDataset

    ds = type("HandoffDataset", (_Handoff, IterableDataset), {})(length, features, batch_size)
    dl = DataLoader(ds, batch_size=None, **_dl_kwargs(workers))
    return dl, lambda b: b["index"].numpy(), "reference: the cost of moving batches from workers"


# -- running one case ---------------------------------------------------------------------------
def run_case(
    name: str, work: Path, *, batch_size: int, max_seconds: float, seed: int = 0
) -> dict[str, Any]:
    """Time one shuffled epoch (or its first ``max_seconds``) of one case; return its record."""
    import json

    loader, codec, workers = parse_case(name)
    store = case_store(work, loader, codec)
    m = json.loads((store / "shardload.json").read_text())
    length = int(m["chunk_bounds"][-1])
    chunk_rows = int(m["chunk_bounds"][1] - m["chunk_bounds"][0])
    x = m["arrays"]["x"]
    features = int(np.prod(x["shape"][1:]))
    row_bytes = features * np.dtype(x["dtype"]).itemsize
    kw = {"length": length, "chunk_rows": chunk_rows}
    if loader.startswith("shardload"):
        made = build_shardload(store, loader, workers, batch_size, seed)
    elif loader.startswith("naive"):
        made = build_naive(store, loader, workers, batch_size, seed, **kw)
    elif loader == "xbatcher":
        made = build_xbatcher(store, loader, workers, batch_size, seed, **kw)
    elif loader == "zarr-torch-dataset":
        made = build_ztd(store, loader, workers, batch_size, seed, **kw)
    else:
        made = build_handoff(store, loader, workers, batch_size, seed, features=features, **kw)
    batches, index_of, note = made
    idxs: list[np.ndarray] = []
    samples, truncated, first_s, b = 0, False, None, None
    with PeakRSS() as mem:
        rss_start = mem.peak
        t0 = time.perf_counter()
        it = iter(batches)
        for b in it:
            idx = np.asarray(index_of(b), dtype=np.int64).copy()
            idxs.append(idx)
            samples += len(idx)
            now = time.perf_counter() - t0
            if first_s is None:
                first_s = now
            if max_seconds and now > max_seconds:
                truncated = True
                break
        seconds = time.perf_counter() - t0
        # one last sample while the workers still live (short runs may see no periodic one)
        mem.peak, mem.peak_pss = max(mem.peak, mem.now()), max(mem.peak_pss, mem.now_pss())
        del it, b
    rec: dict[str, Any] = {
        "case": name,
        "loader": loader,
        "codec": codec,
        "workers": workers,
        "store": store.name,
        "what": LOADERS[loader],
        "note": note,
        "samples": samples,
        "seconds": seconds,
        "first_batch_s": first_s,
        "samples_per_s": samples / seconds if seconds else 0.0,
        "MBps": samples * row_bytes / seconds / 1e6 if seconds else 0.0,
        "row_bytes": row_bytes,
        "epoch_samples": length,
        "truncated": truncated,
        "epoch_fraction": samples / length,
        "peak_rss_MiB": max(mem.peak, _vm_hwm_bytes()) / 2**20,
        "rss_at_start_MiB": rss_start / 2**20,
        "peak_pss_MiB": mem.peak_pss / 2**20,
        "peak_rss_self_MiB": _vm_hwm_bytes() / 2**20,
    }
    if loader.endswith(("-mem", "-memgroup")):
        rec["shuffle_chunks"] = equal_memory_chunks(store)
        rec["prefetch"] = rec["shuffle_chunks"] if loader.endswith("-mem") else "default"
    rec["chunk_rows"] = chunk_rows
    rec.update(
        shuffle_stats(
            idxs, length=length, chunk_rows=chunk_rows, batch_size=batch_size, truncated=truncated
        )
    )
    # the next epoch (untimed), for the recurrence of batch-mates: the same DataLoader
    # iterated again (its sampler draws a new order), or shardload's epoch 1
    nxt: list[np.ndarray] = []
    if not truncated:
        if loader.startswith("shardload"):
            again, index_of, _ = build_shardload(store, loader, workers, batch_size, seed, epoch=1)
        else:
            again = batches
        t1 = time.perf_counter()
        for b in again:
            nxt.append(np.asarray(index_of(b), dtype=np.int64).copy())
            if max_seconds and time.perf_counter() - t1 > 2 * max_seconds:
                nxt = []
                break
    rec.update(quality_stats(idxs, nxt, length=length, chunk_rows=chunk_rows, truncated=truncated))
    rec["sample_batches"] = [i.tolist() for i in idxs[:48]]
    return rec


#: VIFs of a time-limited prefix with fewer batches than this are not reported (NaN).
MIN_VIF_BATCHES = 32


def quality_stats(
    epoch0: list[np.ndarray],
    epoch1: list[np.ndarray],
    *,
    length: int,
    chunk_rows: int,
    truncated: bool = False,
) -> dict[str, Any]:
    """The five shuffle-quality figures (``shardload.plan.quality``) of a loader's batches;
    recurrence needs a complete second epoch (else NaN)."""
    from shardload.plan.quality import quality

    if not epoch0:
        return {}
    chunk_of = np.arange(length) // chunk_rows
    q = quality([epoch0, epoch1] if epoch1 else [epoch0], chunk_of)
    if truncated and len(epoch0) < MIN_VIF_BATCHES:  # a handful of batch means says little
        q["vif_pos"] = q["vif_ar"] = float("nan")
    return {k: v for k, v in q.items() if k != "chunks_per_batch"}


def shuffle_stats(
    idxs: list[np.ndarray], *, length: int, chunk_rows: int, batch_size: int, truncated: bool
) -> dict[str, Any]:
    """Mean distinct chunks per full batch, and whether the epoch held every row exactly once."""
    full = [i for i in idxs if len(i) == batch_size] or idxs
    per_batch = [len(np.unique(i // chunk_rows)) for i in full]
    num_chunks = -(-length // chunk_rows)
    out: dict[str, Any] = {
        "chunks_per_batch": float(np.mean(per_batch)) if per_batch else float("nan"),
        "chunks_per_batch_max_possible": min(batch_size, num_chunks),
    }
    seen = np.concatenate(idxs) if idxs else np.empty(0, np.int64)
    counts = np.bincount(seen, minlength=length) if seen.size else np.zeros(length, np.int64)
    out["duplicates"] = int((counts > 1).sum())
    out["missing"] = int((counts == 0).sum())
    if truncated:
        out["complete_epoch"] = "n/a (time-limited prefix)"
    else:
        out["complete_epoch"] = bool(out["duplicates"] == 0 and out["missing"] == 0)
    return out
