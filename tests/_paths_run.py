"""The harness's runs over one case (see :mod:`_paths`): every read path of one store
(:func:`run_case`), a ``StreamingDataLoader`` resumed from its state (:func:`check_torch_resume`)
or left early (:func:`check_torch_break`), ``MapDataset`` alone and under a shuffling
``DataLoader``, and the store served on loopback (:func:`served`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import shardload
from _paths import (
    Batch,
    Case,
    Holder,
    Report,
    assert_same,
    check_rows,
    check_values,
    make_case_store,
    rank_batches,
    torch_batches,
)
from shardload.load.spec import LoadSpec
from shardload.plan.resume import plan_state


def run_case(
    case: Case,
    root: Path,
    *,
    url: str | None = None,
    cache_dir: Path | None = None,
    torch_workers: Sequence[tuple[int, str | None] | tuple[int, str | None, bool]] = (),
    cache_bytes: int | None = None,
    sim_workers: Sequence[int] = (0, 1, 2),
    resume: bool = True,
    map_dataset: bool = False,
    torch_epochs: int = 1,
    report: Report | None = None,
) -> Report:
    """Every check of one case; ``url``: the server's base (the store's folder under it)."""
    report = report or Report()
    path, want = make_case_store(case, root)
    kw = case.load_kw()
    spec = LoadSpec.build(str(path), **kw)
    arrays = list(spec.selection.arrays)
    ref: list[list[Batch]] | None = None
    w0 = sim_workers[0] if sim_workers else 0
    for workers in sim_workers:
        holder = Holder()
        ranks = [
            rank_batches(
                str(path),
                kw,
                rank=r,
                world=case.world,
                workers=workers,
                epoch=case.epoch,
                holder=holder,
            )
            for r in range(case.world)
        ]
        for mine in ranks:
            check_values(mine, want, arrays)
        check_rows(case, spec, ranks, workers)
        report.add(f"iter_batches/{workers}w", ranks, holder)
        if workers == w0:
            ref = ranks
    assert ref is not None

    def same_as_ref(store: Any, what: str, workers: int = w0) -> None:
        holder = Holder()
        for r in range(case.world):
            got = rank_batches(
                store,
                kw,
                rank=r,
                world=case.world,
                workers=workers,
                epoch=case.epoch,
                holder=holder,
            )
            assert_same(got, ref[r], f"{what} rank {r}")
        report.add(what, ref, holder)

    if 2 in sim_workers:  # two iterators over one open Store (its batch memory shared)
        with shardload.open_store(str(path)) as s:
            holder = Holder()
            for r in range(case.world):
                want_r = rank_batches(
                    str(path), kw, rank=r, world=case.world, workers=2, epoch=case.epoch
                )
                got = rank_batches(
                    s, kw, rank=r, world=case.world, workers=2, epoch=case.epoch, holder=holder
                )
                assert_same(got, want_r, f"one store, 2 iterators, rank {r}")
            report.add("one-store/2w", [], holder)
    if url is not None:
        same_as_ref(f"{url}{path.name}", "url")
        if cache_dir is not None:
            with shardload.open_store(f"{url}{path.name}", cache_dir=cache_dir) as s:
                same_as_ref(s, "url+cache")
            if cache_bytes is not None:  # a cache smaller than the store: files evicted
                small = cache_dir.with_name(cache_dir.name + "-small")
                with shardload.open_store(
                    f"{url}{path.name}", cache_dir=small, cache_bytes=cache_bytes
                ) as s:
                    same_as_ref(s, "url+small-cache")
        if cache_bytes is not None and any(e[0] == 2 and e[1] == "fork" for e in torch_workers):
            _check_torch_url_cache(case, path, kw, url, cache_dir, cache_bytes, report)
    for entry in torch_workers:
        workers, ctx = entry[0], entry[1]
        persistent = bool(entry[2]) if len(entry) > 2 else True
        want_ranks = (
            ref
            if workers == w0
            else [
                rank_batches(
                    str(path), kw, rank=r, world=case.world, workers=workers, epoch=case.epoch
                )
                for r in range(case.world)
            ]
        )
        holder = Holder()
        for r in range(case.world):
            got, _ = torch_batches(
                str(path),
                kw,
                rank=r,
                world=case.world,
                workers=workers,
                epoch=case.epoch,
                context=ctx,
                holder=holder,
                epochs=torch_epochs,
                persistent=persistent,
            )
            assert_same(got[0], want_ranks[r], f"torch {workers}w {ctx} rank {r}")
            for e in range(1, torch_epochs):
                want_e = rank_batches(
                    str(path), kw, rank=r, world=case.world, workers=workers, epoch=case.epoch + e
                )
                assert_same(got[e], want_e, f"torch {workers}w {ctx} rank {r} epoch +{e}")
        report.add(
            f"torch/{workers}w/{ctx}/{'persistent' if persistent else 'fresh'}", want_ranks, holder
        )
        report.epochs += torch_epochs - 1
    if resume:
        _check_resume(case, path, kw, spec, ref, w0, report)
    if map_dataset:
        _check_map(path, case, want, arrays, report)
        if torch_workers:
            _check_map_loader(path, case, want, arrays, report)
    return report


def _check_resume(case, path, kw, spec, ref, workers, report) -> None:
    plan = spec.plan(world_size=case.world, num_workers=workers, epoch=case.epoch)
    n = plan.batches_per_rank
    for k in sorted({1, n // 2, n - 1} - {0}):
        if k >= n:
            continue
        state = plan_state(plan, k).to_dict()
        state["dataset"] = spec.fingerprint
        for r in range(case.world):
            rest = rank_batches(
                str(path),
                kw,
                rank=r,
                world=case.world,
                workers=workers,
                epoch=case.epoch,
                state=state,
            )
            assert_same(rest, ref[r][k:], f"resume after {k} rank {r}")
        report.add(f"resume/{k}", [r[k:] for r in ref])


def check_torch_resume(case: Case, root: Path, workers: int, ctx: str | None, k: int) -> int:
    """A ``StreamingDataLoader`` stopped after ``k`` batches, its state loaded into a new one:
    the rest of the epoch, exactly; returns the batches compared."""
    path = root / f"case{case.seed}"
    kw = case.load_kw()
    (full,), _ = torch_batches(
        str(path), kw, rank=0, world=case.world, workers=workers, epoch=case.epoch, context=ctx
    )
    k = min(k, len(full) - 1)
    if k < 1:
        return 0
    (first,), state = torch_batches(
        str(path),
        kw,
        rank=0,
        world=case.world,
        workers=workers,
        epoch=case.epoch,
        context=ctx,
        take=k,
    )
    assert state is not None
    assert_same(first, full[:k], "torch first leg")
    (rest,), _ = torch_batches(
        str(path),
        kw,
        rank=0,
        world=case.world,
        workers=workers,
        epoch=case.epoch,
        context=ctx,
        state=state,
    )
    assert_same(rest, full[k:], f"torch resumed after {k}")
    return len(full)


def _check_map(path: Path, case: Case, want, arrays, report: Report) -> None:
    from shardload.torch import MapDataset

    with MapDataset(str(path), **case.select_kw()) as ds:
        rows = []
        for i in range(len(ds)):
            item = ds[i]
            g = int(item["index"])
            rows.append(g)
            for a in arrays:
                np.testing.assert_array_equal(item[a].numpy(), want[a][g], err_msg=f"map {a}")
        spec = LoadSpec.build(str(path), batch_size=1, shuffle=False, **case.select_kw())
        assert rows == spec.selection.global_rows().tolist()
    report.paths["map"] += 1


def _check_torch_url_cache(case, path, kw, url, cache_dir, cache_bytes, report) -> None:
    """2 forked workers reading by URL through one small node cache (each evicting what the
    other may be reading): the local batches of every rank."""
    shared = cache_dir.with_name(cache_dir.name + "-workers")
    holder = Holder()
    for r in range(case.world):
        want = rank_batches(str(path), kw, rank=r, world=case.world, workers=2, epoch=case.epoch)
        with shardload.open_store(
            f"{url}{path.name}", cache_dir=shared, cache_bytes=cache_bytes
        ) as s:
            got, _ = torch_batches(
                s,
                kw,
                rank=r,
                world=case.world,
                workers=2,
                epoch=case.epoch,
                context="fork",
                holder=holder,
            )
        assert_same(got[0], want, f"torch 2w by URL through a small cache, rank {r}")
        report.add("torch/2w/url+small-cache", [want], holder)


def _check_map_loader(path: Path, case: Case, want, arrays, report: Report) -> None:
    """``MapDataset`` through a shuffling ``DataLoader`` of 2 forked workers (each with its
    copy of the chunk cache, memory maps included), held batches kept: each row once."""
    import torch
    from torch.utils.data import DataLoader

    from shardload.torch import MapDataset

    holder = Holder()
    with MapDataset(str(path), cache_chunks=2, **case.select_kw()) as ds:
        ds[0]  # a chunk cached (and mapped) before the fork
        g = torch.Generator().manual_seed(case.seed)
        loader = DataLoader(
            ds,
            batch_size=case.batch_size,
            shuffle=True,
            num_workers=2,
            generator=g,
            multiprocessing_context="fork",
        )
        got = [holder.keep(b) for b in loader]
        holder.check()
        check_values(got, want, arrays)
        rows = np.concatenate([b["index"] for b in got])
        assert sorted(rows.tolist()) == sorted(set(rows.tolist()))
        assert len(rows) == len(ds)
    report.add("map/DataLoader-2w", [got], holder)


@contextlib.contextmanager
def served(root: Path) -> Iterator[str]:
    """``shardload serve`` of ``root`` on loopback; yields the base URL ending in ``/``."""
    from shardload.move.serve import serving

    with serving(root) as base:
        yield base if base.endswith("/") else base + "/"


def check_torch_break(
    case: Case, root: Path, workers: int, ctx: str | None, k: int, *, persistent: bool = True
) -> int:
    """A training loop that leaves an epoch after ``k`` batches (``limit_train_batches``) and
    starts the next one on the same loader, holding batches of both: the next epoch is the
    full epoch, exactly, and no held batch changed; returns the batches compared."""
    from shardload.torch import StreamingDataLoader, StreamingDataset

    path = root / f"case{case.seed}"
    kw = case.load_kw()
    want = rank_batches(
        str(path), kw, rank=0, world=case.world, workers=workers, epoch=case.epoch + 1
    )
    first = rank_batches(str(path), kw, rank=0, world=case.world, workers=workers, epoch=case.epoch)
    holder = Holder(n=2 * k + 4)
    ds = StreamingDataset(str(path), rank=0, world_size=case.world, **kw)
    extra: dict[str, Any] = {}
    if workers:
        extra = dict(multiprocessing_context=ctx, persistent_workers=persistent)
    loader = StreamingDataLoader(ds, num_workers=workers, **extra)
    try:
        ds.set_epoch(case.epoch)
        got0: list[Batch] = []
        for b in loader:
            got0.append(holder.keep(b))
            if len(got0) == k:
                break
        b = None
        assert_same(got0, first[: len(got0)], "the epoch left early")
        ds.set_epoch(case.epoch + 1)
        got1 = [holder.keep(b) for b in loader]
        holder.check()
    finally:
        ds.close()
        del loader
    assert_same(got1, want, "the epoch after one left early")
    return len(got0) + len(got1)
