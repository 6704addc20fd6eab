"""A seeded sweep of the decode reader (load/decoded.py, formats/zarr/shard_rows.py locally,
formats/zarr/url_rows.py by URL): Zarr shards of Blosc inner chunks, every served value compared
to the source (imported by tests/test_decode_sweep.py and run long by hand).

:func:`random_case` draws a store (lz4, zstd or auto; inner chunks of 1 to 9 rows; 1 to 5 to a
shard; a row count leaving the last chunk and shard partial) and a read: batch size, shuffle,
groups (``shuffle_chunks``, ``piece_rows``), threads, ``mode`` pad or drop, ``drop_last``,
``verify``, and a chain of world shapes, each left at 0 batches, mid-epoch or at its last batch
and resumed on the next (elastic, chained). :func:`check_case` reads it locally, by URL or by
URL through a node cache and checks each rank's batches: the plan's rows in the plan's order,
every value the source's, and across the chain each row of the selection once (less reported
drops, plus reported padding).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import xarray as xr

import shardload
from shardload.formats.zarr import shard_rows
from shardload.load.decoded import decoded_sources
from shardload.load.spec import LoadSpec
from shardload.plan.groups import iter_worker_batches
from shardload.plan.resume import plan_state

#: where a leg of the chain stops: before any batch, mid-epoch, before its last batch, after
#: it (a state saved at the end of the epoch), at the end (the chain's last leg)
STOPS = ("zero", "mid", "last", "done", "end")
TAKE = {"zero": lambda n: 0, "mid": lambda n: n // 2, "last": lambda n: max(0, n - 1),
        "done": lambda n: n}  # fmt: skip


@dataclass(frozen=True)
class Case:
    seed: int
    rows: int
    compression: str
    chunk_rows: int
    shard_chunks: int
    feat: int
    lev: int
    batch_size: int
    shuffle: bool
    shuffle_chunks: int | None
    piece_rows: int | None
    threads: int | None
    mode: str
    drop_last: bool
    load_seed: int
    epoch: int
    split: str | None
    arrays: tuple[str, ...] | None
    verify: str
    legs: tuple[tuple[int, int, str], ...]  # (world, workers, stop); the last stop is "end"

    def load_kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = dict(
            batch_size=self.batch_size,
            shuffle=self.shuffle,
            shuffle_chunks=self.shuffle_chunks,
            piece_rows=self.piece_rows,
            threads=self.threads,
            mode=self.mode,
            drop_last=self.drop_last,
            seed=self.load_seed,
            epoch=self.epoch,
            split=self.split,
        )
        if self.arrays is not None:
            kw["arrays"] = list(self.arrays)
        return kw


def random_case(seed: int) -> Case:
    """The case drawn from ``seed`` (the same seed, the same case)."""
    rng = np.random.default_rng(seed)
    chunk_rows = int(rng.integers(1, 10))
    shard_chunks = int(rng.integers(1, 6))
    rows = int(rng.integers(3 * chunk_rows, 40 * chunk_rows * shard_chunks // 2 + 60))
    mode = "pad" if rng.random() < 0.4 else "drop"
    legs = []
    for i in range(int(rng.integers(1, 4))):
        stop = "end" if i == 0 else str(rng.choice(STOPS[:4]))
        legs.insert(0, (int(rng.choice([1, 1, 2, 3, 5, 7])), int(rng.integers(0, 4)), stop))
    return Case(
        seed=seed,
        rows=rows,
        compression=str(rng.choice(["lz4", "zstd", "auto", "lz4", "zstd", "none"])),
        chunk_rows=chunk_rows,
        shard_chunks=shard_chunks,
        feat=int(rng.integers(1, 5)),
        lev=int(rng.integers(1, 4)),
        batch_size=int(rng.choice([1, 2, 3, 5, 8, 16])),
        shuffle=bool(rng.random() < 0.8),
        shuffle_chunks=[None, 1, 2, 3, 5][int(rng.integers(5))],
        piece_rows=[None, None, 0, 1, 2, 5][int(rng.integers(6))],
        threads=[None, 1, 2, 3][int(rng.integers(4))],
        mode=mode,
        drop_last=mode == "drop" and bool(rng.random() < 0.3),
        load_seed=int(rng.integers(0, 50)),
        epoch=int(rng.integers(0, 3)),
        split=[None, "train"][int(rng.integers(2))],
        arrays=[None, None, ("x",), ("y", "z")][int(rng.integers(4))],
        verify=str(rng.choice(["auto", "always", "first-epoch", "never"])),
        legs=tuple(legs),
    )


def source_arrays(case: Case) -> dict[str, np.ndarray]:
    """The truth (values that compress, distinct per row)."""
    rng = np.random.default_rng(case.seed + 1)
    n = case.rows
    return {
        "x": np.round(rng.normal(size=(n, case.feat)) * 4).astype("f4"),
        "y": np.arange(n, dtype="i8") * 3 + 1,
        "z": np.arange(n, dtype="f8")[:, None] + np.arange(case.lev) / 8.0,
    }


def make_store(case: Case, root: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """The case's store under ``root``, and its source arrays."""
    src = source_arrays(case)
    root.mkdir(parents=True, exist_ok=True)
    nc = root / f"d{case.seed}.nc"
    xr.Dataset(
        {
            "a": (("sample", "f"), src["x"]),
            "b": (("sample",), src["y"]),
            "c": (("sample", "l"), src["z"]),
        }
    ).to_netcdf(nc)
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    store = prepare(
        {
            "source": {"paths": [str(nc)]},
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a"], "y": ["b"], "z": ["c"]},
            "format": "zarr",
            "compression": case.compression,
            "chunk_rows": case.chunk_rows,
            "shard_chunks": case.shard_chunks,
            "out": str(root / f"d{case.seed}"),
            "splits": {"train": 0.7, "val": 0.3},
        }
    )
    with contextlib.suppress(Exception):
        store.close()
    return root / f"d{case.seed}", src


def _rank(store: Any, kw: dict[str, Any], state: Any, rank: int, world: int, workers: int,
          take: int | None) -> tuple[list[dict[str, np.ndarray]], list[list[np.ndarray]]]:  # fmt: skip
    """The first ``take`` batches of a rank (all with None) in DataLoader order, copied, and
    each worker's index rows."""
    readers = max(1, workers)
    its = [
        shardload.iter_batches(
            store, rank=rank, world_size=world, worker=w, num_workers=workers, state=state, **kw
        )
        for w in range(readers)
    ]
    got: list[dict[str, np.ndarray]] = []
    per_worker: list[list[np.ndarray]] = [[] for _ in range(readers)]
    try:
        while take is None or len(got) < take:
            j = len(got)
            b = next(its[j % readers], None)
            if b is None:
                break
            b = {k: np.array(v) for k, v in b.items()}
            got.append(b)
            per_worker[j % readers].append(b["index"])
    finally:
        for it in its:
            it.close()
    return got, per_worker


def check_case(
    case: Case, store: Any, want: dict[str, np.ndarray], *, decoded: bool | None = True
) -> int:
    """Read the case's chain on ``store`` (a path, URL or Store; ``decoded``: whether it must
    be read by the decode reader, None: either); the batches checked."""
    kw = case.load_kw()
    spec = LoadSpec.build(store, **{k: v for k, v in kw.items() if k != "epoch"})
    arrays = list(spec.selection.arrays)
    opened = spec.store
    if decoded is not None:
        assert decoded_sources(opened, arrays) == decoded, "not the reader expected"
    yielded: list[np.ndarray] = []
    dropped = padded = checked = 0
    state = None
    for world, workers, stop in case.legs:
        plan = spec.plan(world_size=world, num_workers=workers, epoch=case.epoch, state=state)
        n = plan.batches_per_rank
        take = None if stop == "end" else TAKE[stop](n)
        dropped, padded = dropped + plan.num_dropped, padded + plan.num_padded
        for rank in range(world):
            got, per_worker = _rank(store, kw, state, rank, world, workers, take)
            assert len(got) == (n if take is None else take), (len(got), n, take)
            for w, mine in enumerate(per_worker):
                plan_rows = list(iter_worker_batches(plan, rank, w))[: len(mine)]
                assert [m.tolist() for m in mine] == [p.tolist() for p in plan_rows], (rank, w)
            for b in got:
                idx = b["index"]
                assert sorted(b) == sorted([*arrays, "index"])
                for a in arrays:
                    exp = want[a][idx].reshape(b[a].shape)
                    np.testing.assert_array_equal(b[a], exp, err_msg=f"{a} leg {world}x{workers}")
                yielded.append(idx)
                checked += 1
        if take is not None:
            state = plan_state(plan, take).to_dict()
            state["dataset"] = spec.fingerprint
    checked += _check_skip(case, store, want, kw, spec, arrays)
    rows = np.concatenate(yielded) if yielded else np.zeros(0, np.int64)
    every = spec.selection.global_rows()
    counts = Counter(rows.tolist())
    assert set(counts) <= set(every.tolist()), "a row outside the selection"
    if case.mode == "drop":
        assert max(counts.values(), default=1) == 1, "a row served twice"
        assert len(rows) == len(every) - dropped
    else:
        assert set(counts) == set(every.tolist()), "a row never served"
        assert len(rows) == len(every) + padded
    return checked


#: the URL and kernel knobs a tight seed sets small (module, attribute, values drawn from)
TIGHT: tuple[tuple[str, str, tuple[Any, ...]], ...] = (
    ("shardload.formats.zarr.streamed", "STREAM_MIN_BYTES", (0, 1 << 20)),
    ("shardload.formats.zarr.shard_fetch", "URL_GAP_BYTES", (0, 64, 1 << 20)),
    ("shardload.formats.zarr.shard_fetch", "URL_RUN_BYTES", (1, 300, 8 << 20)),
    ("shardload.formats.zarr.shard_fetch", "URL_WHOLE_SHARE", (0.0, 0.5, 2.0)),
    ("shardload.formats.zarr.shard_fetch", "URL_THREADS", (1, 8)),
    ("shardload.formats.zarr.shard_rows", "RUN_BYTES", (1, 200, 1 << 20)),
    ("shardload.formats.zarr.shard_spans", "RUN_BYTES", (1, 200, 1 << 20)),
    ("shardload.move.http_get", "PIECE_BYTES", (64, 1 << 20)),
)
KEEP_BYTES = (None, "0", "200", "2000")


@contextlib.contextmanager
def tight(seed: int) -> Any:
    """The knobs of :data:`TIGHT` and ``SHARDLOAD_URL_KEEP_BYTES`` drawn from ``seed`` (odd
    seeds only; even seeds run the defaults)."""
    import importlib
    import os
    from unittest import mock

    if seed % 2 == 0:
        yield {}
        return
    rng = np.random.default_rng(seed + 7)
    drawn = {f"{m.rsplit('.', 1)[1]}.{a}": v[int(rng.integers(len(v)))] for m, a, v in TIGHT}
    keep = KEEP_BYTES[int(rng.integers(len(KEEP_BYTES)))]
    with contextlib.ExitStack() as stack:
        for (m, a, _), v in zip(TIGHT, drawn.values(), strict=True):
            stack.enter_context(mock.patch.object(importlib.import_module(m), a, v))
        if keep is not None:
            stack.enter_context(mock.patch.dict(os.environ, {"SHARDLOAD_URL_KEEP_BYTES": keep}))
        yield {**drawn, "keep": keep}


def _check_skip(case: Case, store: Any, want: dict[str, np.ndarray], kw: dict[str, Any],
                spec: LoadSpec, arrays: list[str]) -> int:  # fmt: skip
    """The first world's last rank, each worker from ``skip_batches`` (a worker's own position,
    as torchdata restores it) of 1 and of all but one: its plan's rows, the source's values."""
    world, workers, _ = case.legs[0]
    plan = spec.plan(world_size=world, num_workers=workers, epoch=case.epoch)
    rank, n = world - 1, 0
    for w in range(max(1, workers)):
        mine = list(iter_worker_batches(plan, rank, w))
        for skip in sorted({1, len(mine) - 1} & set(range(1, len(mine) + 1))):
            it = shardload.iter_batches(store, rank=rank, world_size=world, worker=w,
                                        num_workers=workers, skip_batches=skip, **kw)  # fmt: skip
            got = [{k: np.array(v) for k, v in b.items()} for b in it]
            assert [b["index"].tolist() for b in got] == [m.tolist() for m in mine[skip:]]
            for b in got:
                for a in arrays:
                    exp = want[a][b["index"]].reshape(b[a].shape)
                    np.testing.assert_array_equal(b[a], exp, err_msg=f"{a} skip {skip} w{w}")
            n += len(got)
    return n


def run_seed(seed: int, root: Path, url: str | None = None, *, cache: bool = True) -> Counter:
    """One seed's case read locally, and by URL (``url``: ``root`` served, ending in ``/``),
    directly and through a node cache; batches checked per path (odd seeds with the knobs of
    :func:`tight`)."""
    case = random_case(seed)
    path, want = make_store(case, root)
    with tight(seed):
        return _run_paths(case, path, want, url, cache)


def _run_paths(case: Case, path: Path, want: dict[str, np.ndarray], url: str | None,
               cache: bool) -> Counter:  # fmt: skip
    root, seed = path.parent, case.seed
    out: Counter = Counter()
    # auto may store some raw; raw inner chunks are scatter reads (load/scatter.py)
    must = {"auto": None, "none": False}.get(case.compression, True)
    if must and shard_rows.KERNEL is None:  # not built here: the gather reader, same values
        must = None
    with shardload.open_store(str(path), verify=case.verify) as s:
        out["local"] += check_case(case, s, want, decoded=must)
    if url is not None:
        # by URL raw inner chunks in shards are copied into place by the kernel too (url_rows.py)
        by_url = must
        if case.compression == "none":
            by_url = True if shard_rows.KERNEL is not None and case.shard_chunks else None
        with shardload.open_store(f"{url}{path.name}", verify=case.verify) as s:
            out["url"] += check_case(case, s, want, decoded=by_url)
        if cache:
            cache_dir = root / f"cache{seed}"
            with shardload.open_store(
                f"{url}{path.name}", verify=case.verify, cache_dir=cache_dir
            ) as s:
                out["url+cache"] += check_case(case, s, want, decoded=None)
    return out


def check_torch(case: Case, store: str, want: dict[str, np.ndarray], *, workers: tuple[int, int],
                context: str | None, stop: str, rank: int = 0) -> int:  # fmt: skip
    """Rank ``rank`` of the case's first world through ``StreamingDataLoader`` with
    ``workers[0]`` DataLoader workers, left at ``stop`` with its saved state, resumed by a new
    loader with ``workers[1]``: every value the source's, and the rows served before and after
    exactly the plan's rows of that rank (padding included); the batches checked."""
    from _paths import torch_batches

    kw = {k: v for k, v in case.load_kw().items() if k != "epoch"}
    world = case.legs[0][0]
    rank = min(rank, world - 1)
    spec = LoadSpec.build(store, **kw)
    plan = spec.plan(world_size=world, num_workers=workers[0], epoch=case.epoch)
    n = plan.batches_per_rank
    take = TAKE[stop](n)
    common = dict(rank=rank, world=world, epoch=case.epoch)
    if take:
        head, state = torch_batches(
            store, kw, workers=workers[0], context=context, take=take, **common
        )
        first = head[0]
    else:
        from shardload.torch import StreamingDataLoader, StreamingDataset

        ds = StreamingDataset(store, rank=rank, world_size=world, **kw)
        try:
            ds.set_epoch(case.epoch)
            first, state = [], StreamingDataLoader(ds, num_workers=workers[0]).state_dict()
        finally:
            ds.close()
    assert state is not None and len(first) == take
    rest, _ = torch_batches(store, kw, workers=workers[1], context=context, state=state, **common)
    got = first + rest[0]
    for b in got:
        idx = np.asarray(b["index"])
        for a in spec.selection.arrays:
            exp = want[a][idx].reshape(np.asarray(b[a]).shape)
            np.testing.assert_array_equal(np.asarray(b[a]), exp, err_msg=f"{a} torch {workers}")
    rows = sorted(np.concatenate([np.asarray(b["index"]) for b in got]).tolist()) if got else []
    mine = [x for w in range(max(1, workers[0])) for x in iter_worker_batches(plan, rank, w)]
    planned = sorted(np.concatenate(mine).tolist()) if mine else []
    assert rows == planned, "rows served before and after the resume are not the plan's"
    return len(got)


def check_torch_epochs(case: Case, store: str, want: dict[str, np.ndarray], *, workers: int,
                       context: str | None, persistent: bool) -> int:  # fmt: skip
    """Two epochs of the first world's rank 0 through one ``StreamingDataLoader`` (workers
    ``persistent`` or new each epoch, batches of both held): each epoch its plan's batches,
    every value the source's; the batches checked."""
    from _paths import torch_batches

    kw = {k: v for k, v in case.load_kw().items() if k != "epoch"}
    world = case.legs[0][0]
    spec = LoadSpec.build(store, **kw)
    got, _ = torch_batches(store, kw, rank=0, world=world, workers=workers, epoch=case.epoch,
                           context=context, epochs=2, persistent=persistent)  # fmt: skip
    n = 0
    for e, batches in enumerate(got):
        plan = spec.plan(world_size=world, num_workers=workers, epoch=case.epoch + e)
        readers = max(1, workers)
        per = [list(iter_worker_batches(plan, 0, w)) for w in range(readers)]
        assert [np.asarray(b["index"]).tolist() for b in batches] == [
            per[j % readers][j // readers].tolist() for j in range(plan.batches_per_rank)
        ], f"epoch +{e}"
        for b in batches:
            for a in spec.selection.arrays:
                exp = want[a][np.asarray(b["index"])].reshape(np.asarray(b[a]).shape)
                np.testing.assert_array_equal(np.asarray(b[a]), exp, err_msg=f"{a} epoch +{e}")
            n += 1
    return n
