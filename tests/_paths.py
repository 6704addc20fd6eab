"""One randomized equivalence harness over every read path (imported by tests and benchmarks).

:func:`random_case` draws a small store (rows, row shapes, dtypes, format, compression, chunk
rows, shards) and read options (batch size, shuffle, drop_last, mode, world, epoch) from a
seed; :func:`make_case_store` prepares it from a netCDF file, keeping the source arrays as the
truth. The checks read the store the ways a user does and assert, per epoch:

- *rows*: every selected row served once across ranks and workers (less the plan's reported
  drops; ``mode="pad"``: plus its reported repeats);
- *values*: each served row equals the source's row at its ``index`` (not the store's own read);
- *order*: the same store, seed, epoch and world give the same batches on every path
  (in-process with 0-2 simulated workers, by URL, through a node cache, through
  ``StreamingDataLoader`` with 0-2 workers forked or spawned);
- *resume*: a state saved after ``k`` batches resumes to exactly the remaining batches;
- *held*: the last batches (and views of them) a caller keeps never change while it reads on.
"""

from __future__ import annotations

import contextlib
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import shardload
from shardload.load.spec import LoadSpec

Batch = dict[str, np.ndarray]

FORMATS = ("zarr", "npy", "hdf5")
COMPRESSIONS = ("auto", "lz4", "none")
#: held batches a reader keeps (references, not copies), checked when the epoch ends
HOLD = 6


@dataclass(frozen=True)
class Case:
    """One drawn configuration: the store, then how it is read."""

    seed: int
    rows: int
    fmt: str
    compression: str
    chunk_rows: int | None
    shard_chunks: int | None
    feat: int  # float32 x: (rows, feat)
    lev: tuple[int, ...]  # float64 z: (rows, *lev)
    split: str | None
    batch_size: int
    shuffle: bool | str
    drop_last: bool
    mode: str
    world: int
    epoch: int
    piece_rows: int | None
    load_seed: int = 0
    shuffle_chunks: int | None = None
    threads: int | None = None
    rows_range: tuple[int, int] | None = None  # rows=(start, stop) instead of a split
    arrays: tuple[str, ...] | None = None  # a subset of x, y, z

    def select_kw(self) -> dict[str, Any]:
        """What to read (also MapDataset's)."""
        kw: dict[str, Any] = {"split": self.split}
        if self.rows_range is not None:
            kw["rows"] = self.rows_range
        if self.arrays is not None:
            kw["arrays"] = list(self.arrays)
        return kw

    def load_kw(self) -> dict[str, Any]:
        return dict(
            batch_size=self.batch_size,
            **self.select_kw(),
            shuffle=self.shuffle,
            seed=self.load_seed,
            mode=self.mode,
            drop_last=self.drop_last,
            piece_rows=self.piece_rows,
            shuffle_chunks=self.shuffle_chunks,
            threads=self.threads,
        )


def random_case(seed: int, *, max_rows: int = 5000, min_rows: int = 500) -> Case:
    """A configuration drawn from ``seed`` (the same seed, the same case)."""
    rng = np.random.default_rng(seed)
    fmt = str(rng.choice(FORMATS))
    compression = "none" if fmt == "npy" else str(rng.choice(COMPRESSIONS))
    rows = int(rng.integers(min_rows, max_rows + 1))
    chunk_rows = [None, 7, 64, 333, 1000][int(rng.integers(5))]
    shard_chunks = None
    if fmt == "zarr" and chunk_rows is not None and rng.random() < 0.3:
        shard_chunks = int(rng.integers(2, 5))
    if fmt == "zarr" and chunk_rows is None and compression == "none" and rng.random() < 0.5:
        chunk_rows = 128
    world = int(rng.choice([1, 2, 4]))
    split = [None, "train"][int(rng.integers(2))]
    rows_range = None
    if split is None and rng.random() < 0.3:  # rows cut inside chunks
        start = int(rng.integers(0, rows // 3))
        rows_range = (start, int(rng.integers(start + rows // 2, rows + 1)))
    arrays = None
    if rng.random() < 0.2:
        arrays = tuple(sorted(rng.choice(["x", "y", "z"], size=2, replace=False).tolist()))
    batch_size = int(rng.choice([1, 3, 8, 32, 100]))
    batch_size = max(batch_size, -(-rows // 400))  # at most about 400 batches an epoch
    mode = "pad" if rng.random() < 0.2 else "drop"
    shuffle: bool | str = bool(rng.random() < 0.8)
    raw = fmt == "npy" or (fmt == "zarr" and compression == "none" and shard_chunks is None)
    if raw and shuffle and rng.random() < 0.25:
        shuffle = "uniform"  # rows one by one: raw rows only
    return Case(
        seed=seed,
        rows=rows,
        fmt=fmt,
        compression=compression,
        chunk_rows=chunk_rows,
        shard_chunks=shard_chunks,
        feat=int(rng.integers(1, 6)),
        lev=tuple(int(v) for v in rng.integers(1, 4, size=int(rng.integers(1, 3)))),
        split=split,
        batch_size=batch_size,
        shuffle=shuffle,
        drop_last=bool(rng.random() < 0.3) and mode == "drop",
        mode=mode,
        world=world,
        epoch=int(rng.integers(0, 3)),
        piece_rows=[None, None, 0, 5][int(rng.integers(4))],
        load_seed=int(rng.integers(0, 100)),
        shuffle_chunks=[None, None, 1, 3][int(rng.integers(4))],
        threads=[None, 1, 3][int(rng.integers(3))],
        rows_range=rows_range,
        arrays=arrays,
    )


def source_arrays(case: Case) -> dict[str, np.ndarray]:
    """The truth: what each stored array's rows must be (row i of the store is sample i)."""
    rng = np.random.default_rng(case.seed + 1)
    n = case.rows
    return {
        "x": rng.standard_normal((n, case.feat)).astype("f4"),
        "y": rng.integers(-30000, 30000, size=n).astype("i2"),
        "z": (
            np.arange(n, dtype="f8")[(slice(None),) + (None,) * len(case.lev)]
            + rng.random((n, *case.lev))
        ),
    }


def make_case_store(case: Case, root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """Prepare the case's store under ``root`` (its folder, and the source arrays)."""
    src = source_arrays(case)
    lev_dims = tuple(f"l{i}" for i in range(len(case.lev)))
    ds = xr.Dataset(
        {
            "a": (("sample", "f"), src["x"]),
            "b": (("sample",), src["y"]),
            "c": (("sample", *lev_dims), src["z"]),
        }
    )
    root.mkdir(parents=True, exist_ok=True)
    nc = root / f"case{case.seed}.nc"
    ds.to_netcdf(nc)
    config: dict[str, Any] = {
        "source": {"paths": [str(nc)]},
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a"], "y": ["b"], "z": ["c"]},
        "format": case.fmt,
        "compression": case.compression,
        "out": str(root / f"case{case.seed}"),
        "splits": {"train": 0.7, "val": 0.2, "test": 0.1},
    }
    if case.chunk_rows is not None:
        config["chunk_rows"] = case.chunk_rows
    if case.shard_chunks is not None:
        config["shard_chunks"] = case.shard_chunks
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    store = prepare(config)
    with contextlib.suppress(Exception):
        store.close()
    return root / f"case{case.seed}", _expected(src, store)


def _expected(src: dict[str, np.ndarray], store: Any) -> dict[str, np.ndarray]:
    """The source arrays in the store's row shapes (a flat view keeps shapes; checked)."""
    out = {}
    for name, values in src.items():
        want = store.manifest.arrays[name]
        out[name] = values.reshape(values.shape[0], *want.shape[1:]) if values.ndim else values
    return out


# -- reading ------------------------------------------------------------------------------------


class Holder:
    """Keeps the last ``n`` batches a reader yielded, with copies taken when they came, so a
    later change to any of them is seen: every other batch is kept whole (the object itself
    and a view of each array), the others by views alone (a view must hold the memory too)."""

    def __init__(self, n: int = HOLD) -> None:
        self.kept: deque[tuple[Any, dict[str, Any], Batch]] = deque(maxlen=n)
        self.checked = self.seen = 0

    def keep(self, batch: Any) -> Batch:
        copy = {k: np.array(_np(v), copy=True) for k, v in batch.items()}
        views = {k: v[1:] for k, v in batch.items()}
        if len(self.kept) == self.kept.maxlen:
            self.check_one(self.kept[0])
        self.seen += 1
        self.kept.append((batch if self.seen % 2 else None, views, copy))
        return copy

    def check_one(self, item: tuple[Any, dict[str, Any], Batch]) -> None:
        batch, views, copy = item
        for k, want in copy.items():
            if batch is not None:
                got = _np(batch[k])
                np.testing.assert_array_equal(got, want, err_msg=f"held batch {k} changed")
            np.testing.assert_array_equal(_np(views[k]), want[1:], err_msg=f"held view {k}")
        self.checked += 1

    def check(self) -> int:
        for item in self.kept:
            self.check_one(item)
        self.kept.clear()
        return self.checked


def _np(v: Any) -> np.ndarray:
    return v.numpy() if hasattr(v, "numpy") and not isinstance(v, np.ndarray) else np.asarray(v)


def rank_batches(
    store: Any,
    kw: dict[str, Any],
    *,
    rank: int,
    world: int,
    workers: int,
    epoch: int,
    state: Any = None,
    take: int | None = None,
    holder: Holder | None = None,
) -> list[Batch]:
    """A rank's batches in-process as a DataLoader yields them (batch ``j`` is worker
    ``j % W``'s next); copies, the originals held by ``holder``."""
    holder = holder or Holder()
    its = [
        shardload.iter_batches(
            store,
            rank=rank,
            world_size=world,
            worker=w,
            num_workers=workers,
            epoch=epoch,
            state=state,
            **kw,
        )
        for w in range(max(1, workers))
    ]
    out: list[Batch] = []
    try:
        while take is None or len(out) < take:
            b = next(its[len(out) % len(its)], None)
            if b is None:
                break
            out.append(holder.keep(b))
    finally:
        for it in its:
            it.close()
    holder.check()
    return out


def torch_batches(
    store: Any,
    kw: dict[str, Any],
    *,
    rank: int,
    world: int,
    workers: int,
    epoch: int,
    context: str | None = None,
    take: int | None = None,
    state: dict[str, Any] | None = None,
    holder: Holder | None = None,
    epochs: int = 1,
    persistent: bool = True,
) -> tuple[list[list[Batch]], dict[str, Any] | None]:
    """A rank's batches through one ``StreamingDataLoader``, ``epochs`` epochs from ``epoch``
    on (held batches kept across epochs: with ``persistent=False`` new workers each epoch
    reclaim the ring slots of the last epoch's, which are dead); with ``take``, the first epoch
    stops after ``take`` batches and the state the loader saves then is returned too."""
    from shardload.torch import StreamingDataLoader, StreamingDataset

    holder = holder or Holder()
    ds = StreamingDataset(store, rank=rank, world_size=world, **kw)
    extra: dict[str, Any] = {}
    if workers:
        extra = dict(multiprocessing_context=context, persistent_workers=persistent)
    loader = StreamingDataLoader(ds, num_workers=workers, **extra)
    saved = None
    out: list[list[Batch]] = []
    try:
        if state is not None:
            loader.load_state_dict(state)
        for e in range(epochs):
            if state is None or e:
                ds.set_epoch(epoch + e)
            mine: list[Batch] = []
            out.append(mine)
            it = iter(loader)
            for b in it:
                mine.append(holder.keep(b))
                if take is not None and len(mine) == take:
                    saved = loader.state_dict()
                    break
            it = b = None  # drop the iterator and the last batch before the check
        holder.check()
    finally:
        ds.close()
        del loader
    return out, saved


# -- checks -------------------------------------------------------------------------------------


def check_values(batches: Sequence[Batch], want: dict[str, np.ndarray], arrays: Sequence[str]):
    for b in batches:
        idx = np.asarray(b["index"])
        assert sorted(b) == sorted([*arrays, "index"]), sorted(b)
        for a in arrays:
            got = np.asarray(b[a])
            assert got.dtype == want[a].dtype, (a, got.dtype, want[a].dtype)
            np.testing.assert_array_equal(got, want[a][idx], err_msg=f"values of {a}")


def assert_same(got: Sequence[Batch], want: Sequence[Batch], what: str) -> None:
    assert len(got) == len(want), f"{what}: {len(got)} batches, want {len(want)}"
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert sorted(g) == sorted(w), what
        for k in w:
            np.testing.assert_array_equal(g[k], w[k], err_msg=f"{what}: batch {i} {k}")


def check_rows(case: Case, spec: LoadSpec, ranks: Sequence[Sequence[Batch]], workers: int):
    """Each selected row once across ``ranks`` (less drops / plus padding, as the plan says)."""
    plan = spec.plan(world_size=case.world, num_workers=workers, epoch=case.epoch)
    for mine in ranks:
        assert len(mine) == plan.batches_per_rank, (len(mine), plan.batches_per_rank)
        for b in mine:
            assert 0 < len(b["index"]) <= case.batch_size
            if case.drop_last:
                assert len(b["index"]) == case.batch_size, "a short batch with drop_last"
    rows = np.concatenate([b["index"] for mine in ranks for b in mine] or [np.zeros(0, "i8")])
    every = spec.selection.global_rows()
    counts = Counter(rows.tolist())
    assert set(counts) <= set(every.tolist()), "a row outside the selection"
    if case.mode == "drop":
        assert max(counts.values(), default=1) == 1, "a row served twice"
        assert len(rows) == len(every) - plan.num_dropped, (len(rows), len(every), plan.num_dropped)
    else:
        assert set(counts) == set(every.tolist()), "a row never served"
        assert len(rows) == len(every) + plan.num_padded


@dataclass
class Report:
    epochs: int = 0
    batches: int = 0
    held_checked: int = 0
    paths: Counter = field(default_factory=Counter)

    def add(self, path: str, ranks: Sequence[Sequence[Batch]], holder: Holder | None = None):
        self.epochs += 1
        self.batches += sum(len(r) for r in ranks)
        self.paths[path] += 1
        if holder is not None:
            self.held_checked += holder.checked
