"""The equivalence harness (tests/_paths.py) over dated windows, ragged arrays, read groups and
elastic resume.

Each ``random_*`` draws a case from a seed; each ``check_*`` prepares its store, keeps the
source arrays as the truth and asserts, per epoch: every window / row served once across ranks
and workers (less the plan's reported drops, plus its padding), values equal to the *source*
(a window: its states are the consecutive dates ``s, s + step, ...``, none a missing date's, no
NaN), the same batches on every path (in-process with 0 and 2 simulated workers, by URL,
``StreamingDataLoader`` with 2 forked workers, ``window_views=True``), resume giving exactly the
rest, held batches unchanged. Elastic: a state saved on one world shape and resumed on another
serves every row not yet consumed, once (less reported drops, plus padding).
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import xarray as xr

import _paths as P
import shardload
from shardload.errors import PlanError
from shardload.load.spec import LoadSpec
from shardload.plan.resume import plan_state

TESTS = Path(__file__).resolve().parent
Check = Callable[[P.Batch], None]
#: what the checks counted (batches checked against the source, held batches checked, cases by
#: kind), for benchmarks/stress_paths.py --more's totals
COUNT: Counter[str] = Counter()


def _epoch(
    path: Path,
    kw: dict[str, Any],
    world: int,
    workers: int,
    epoch: int,
    check: Check,
    state: Any = None,
) -> list[list[P.Batch]]:
    holder = P.Holder()
    ranks = [
        P.rank_batches(
            str(path),
            kw,
            rank=r,
            world=world,
            workers=workers,
            epoch=epoch,
            state=state,
            holder=holder,
        )
        for r in range(world)
    ]
    for mine in ranks:
        for b in mine:
            check(b)
    COUNT["batches"] += sum(len(m) for m in ranks)
    COUNT["held"] += holder.checked
    return ranks


def check_once(ranks, every: Sequence[int], plan: Any, mode: str, group: int = 1) -> None:
    """Each id of ``every`` once over the ranks (one rank per read group), as ``plan`` says."""
    assert len({len(m) for m in ranks}) <= 1, "unequal batch counts"
    ids = np.concatenate(
        [b["index"] for r, mine in enumerate(ranks) if r % group == 0 for b in mine]
        or [np.zeros(0, "i8")]
    )
    counts = Counter(ids.tolist())
    assert set(counts) <= set(every), "an id outside the expected ones"
    if mode == "drop":
        assert max(counts.values(), default=1) == 1, "an id served twice"
        assert len(ids) == len(every) - plan.num_dropped, (len(ids), len(every), plan.num_dropped)
    else:
        assert set(counts) == set(every), "an id never served"
        assert len(ids) == len(every) + plan.num_padded


def _same_paths(path, kw, world, epoch, check, ref, url=None, contexts=("fork",)) -> int:
    """The reference batches again by URL and through ``StreamingDataLoader`` with 2 workers
    of each start method in ``contexts``; returns the epochs compared."""
    n = 0
    if url is not None:
        got = _epoch(url, kw, world, 0, epoch, check)  # type: ignore[arg-type]
        for r in range(world):
            P.assert_same(got[r], ref[r], f"url rank {r}")
        n += 1
    want2 = _epoch(path, kw, world, 2, epoch, check) if contexts else []
    for ctx in contexts:
        holder = P.Holder()
        for r in range(world):
            got_t, _ = P.torch_batches(
                str(path), kw, rank=r, world=world, workers=2, epoch=epoch,
                context=ctx, holder=holder,
            )  # fmt: skip
            P.assert_same(got_t[0], _as_torch(want2[r]), f"torch 2w {ctx} rank {r}")
            COUNT["batches"] += len(got_t[0])
        COUNT["held"] += holder.checked
        n += 1
    return n + bool(contexts)


def refused(
    path: Path, kw: dict[str, Any], spec: Any, world: int, epoch: int, plan_world: int = 0
) -> bool:
    """Whether the plan refuses the case (e.g. ``drop_last`` leaving a rank no batch); if so,
    reading it raises the same error (never an empty or short epoch served)."""
    try:
        spec.plan(world_size=plan_world or world, num_workers=0, epoch=epoch)
    except PlanError as exc:
        with pytest.raises(PlanError, match=str(exc).split(":")[0]):
            next(iter(shardload.iter_batches(str(path), world_size=world, epoch=epoch, **kw)))
        COUNT["refused"] += 1
        return True
    return False


def _as_torch(batches: Sequence[P.Batch]) -> list[P.Batch]:
    """Batches as torch gives them: dates as int64 seconds (torch has no date type)."""
    return [
        {k: v.astype("M8[s]").astype("i8") if v.dtype.kind == "M" else v for k, v in b.items()}
        for b in batches
    ]


def _resume(path, kw, spec, world, epoch, check, ref) -> int:
    plan = spec.plan(world_size=world, num_workers=0, epoch=epoch)
    n = 0
    for k in sorted({1, plan.batches_per_rank // 2} - {0}):
        if k >= plan.batches_per_rank:
            continue
        state = plan_state(plan, k).to_dict()
        state["dataset"] = spec.fingerprint
        rest = _epoch(path, kw, world, 0, epoch, check, state=state)
        for r in range(world):
            P.assert_same(rest[r], ref[r][k:], f"resume after {k} rank {r}")
        n += 1
    k = plan.batches_per_rank // 2
    if 0 < k < plan.batches_per_rank:  # a StreamingDataLoader's own state, rank 0, 2 workers
        opts = dict(rank=0, world=world, workers=2, epoch=epoch, context="fork")
        (full,), _ = P.torch_batches(str(path), kw, **opts)  # type: ignore[arg-type]
        (first,), saved = P.torch_batches(str(path), kw, take=k, **opts)  # type: ignore[arg-type]
        (rest,), _ = P.torch_batches(str(path), kw, state=saved, **opts)  # type: ignore[arg-type]
        P.assert_same(first + rest, full, f"torch resumed after {k}")
        n += 1
    return n


# -- dated stores, windows ----------------------------------------------------------------------


@dataclass(frozen=True)
class DatedCase:
    seed: int
    n: int
    chunk_rows: int
    fmt: str  # npy | zarr-none | zarr-zstd | zarr-sharded
    missing: tuple[int, ...]
    window: int | None
    step: int | None
    views: bool
    batch_size: int
    shuffle: bool
    mode: str
    drop_last: bool
    split: str | None
    world: int
    epoch: int


def random_dated(seed: int) -> DatedCase:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(30, 300))
    missing: set[int] = set()
    for _ in range(int(rng.integers(0, 5))):  # runs of missing dates, edges included
        s = int(rng.integers(0, n))
        missing |= set(range(s, min(n, s + int(rng.integers(1, 4)))))
    window = [None, 1, 2, 3, 5][int(rng.integers(5))]
    mode = "pad" if rng.random() < 0.2 else "drop"
    return DatedCase(
        seed=seed,
        n=n,
        chunk_rows=int(rng.choice([1, 3, 5, 16, 64])),
        fmt=str(rng.choice(["npy", "zarr-none", "zarr-zstd", "zarr-sharded"])),
        missing=tuple(sorted(missing)),
        window=window,
        step=None if window is None else int(rng.choice([1, 1, 2, 3])),
        views=window is not None and bool(rng.random() < 0.4),
        batch_size=int(rng.choice([1, 3, 7, 16])),
        shuffle=bool(rng.random() < 0.7),
        mode=mode,
        drop_last=mode == "drop" and bool(rng.random() < 0.3),
        split=[None, "train", "val"][int(rng.integers(3))],
        world=int(rng.choice([1, 2, 4])),
        epoch=int(rng.integers(0, 3)),
    )


def dated_truth(n: int, missing: Sequence[int], grid=(3, 4)) -> dict[str, np.ndarray]:
    """``dated_fixtures.dated_store``'s arrays by its formula (NaN at missing dates)."""
    rows = np.arange(n, dtype="f8")[:, None, None]
    t2m = (rows + np.arange(grid[0] * grid[1], dtype="f8").reshape(1, *grid) / 1000).astype("f4")
    t2m[list(missing)] = np.nan
    x = np.concatenate([t2m.reshape(n, -1), (-t2m).reshape(n, -1)], axis=1)
    return {"x": x, "y": (np.arange(n, dtype="i8") * 10)[:, None]}


def check_dated(
    case: DatedCase, root: Path, url: str | None = None, contexts: Sequence[str] = ("fork",)
) -> int:
    """Every check of a dated case; returns the epochs checked."""
    from dated_fixtures import dated_store

    fmt, _, how = case.fmt.partition("-")
    extra = {"shard_chunks": 3} if how == "sharded" else {}
    comp = {"none": "none", "zstd": "zstd", "sharded": "zstd"}.get(how, "none")
    name = f"d{case.seed}"
    st = dated_store(
        root, n=case.n, missing=case.missing, chunk_rows=case.chunk_rows, fmt=fmt,
        compression=comp, name=name, **extra,
    )  # fmt: skip
    truth = dated_truth(case.n, case.missing)
    dates, gone = st.time.dates, set(case.missing)
    win, step = case.window or 1, case.step or 1
    rows = set(range(case.n))
    m = st.manifest
    if case.split in m.split_rows:  # a split of row ranges (one it would get no whole chunk)
        rows = set(range(*m.split_rows[case.split]))
    elif case.split is not None:
        b = np.asarray(m.chunk_bounds)
        rows = {r for c in m.split_chunks(case.split) for r in range(b[c], b[c + 1])}
    every = [s for s in range(case.n) if all(s + j * step in rows - gone for j in range(win))]
    st.close()

    def check(b: P.Batch) -> None:
        x, y, idx = np.asarray(b["x"]), np.asarray(b["y"]), np.asarray(b["index"])
        assert not np.isnan(x).any(), "NaN served (a missing date's state)"
        for i, s in enumerate(idx.tolist()):
            sel = slice(s, s + win * step, step) if case.window else s
            assert not gone & {s + j * step for j in range(win)}, f"window {s} has a missing date"
            np.testing.assert_array_equal(x[i], truth["x"][sel], err_msg=f"x of {s}")
            np.testing.assert_array_equal(y[i], truth["y"][sel], err_msg=f"y of {s}")
            if case.window:
                got = np.asarray(b["dates"][i]).astype("datetime64[s]")
                np.testing.assert_array_equal(got, dates[sel], err_msg=f"dates of {s}")

    path = root / name
    kw: dict[str, Any] = dict(
        batch_size=case.batch_size, split=case.split, shuffle=case.shuffle, seed=case.seed % 7,
        mode=case.mode, drop_last=case.drop_last,
    )  # fmt: skip
    if case.window:
        kw.update(window=case.window, window_step=case.step)
    if case.window and not every:  # no window fits: refused, by name
        with pytest.raises(PlanError, match="fits nowhere"):
            LoadSpec.build(str(path), **kw)
        return 0
    spec = LoadSpec.build(str(path), **kw)
    COUNT["dated windows" if case.window else "dated rows"] += 1
    COUNT["window_views"] += case.views
    if refused(path, kw, spec, case.world, case.epoch):
        return 0
    n = 0
    ref = None
    for workers in (0, 2):
        ranks = _epoch(path, kw, case.world, workers, case.epoch, check)
        plan = spec.plan(world_size=case.world, num_workers=workers, epoch=case.epoch)
        check_once(ranks, every, plan, case.mode)
        ref = ref or ranks
        n += 1
    assert ref is not None
    if case.views:  # the same batches as read-only views
        got = _epoch(path, {**kw, "window_views": True}, case.world, 0, case.epoch, check)
        for r in range(case.world):
            P.assert_same(got[r], ref[r], f"window_views rank {r}")
        n += 1
    u = f"{url}{name}" if url else None
    n += _same_paths(path, kw, case.world, case.epoch, check, ref, url=u, contexts=contexts)
    return n + _resume(path, kw, spec, case.world, case.epoch, check, ref)


# -- ragged arrays ------------------------------------------------------------------------------


def check_ragged(
    seed: int, root: Path, url: str | None = None, contexts: Sequence[str] = ("fork",)
) -> int:
    """A ragged store drawn from ``seed`` (``userfuncs:ragged_tokens``); returns epochs."""
    sys.path.insert(0, str(TESTS))
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(20, 300)), int(rng.integers(2, 20))
    fmt, comp, shard = [("npy", "none", None), ("zarr", "none", None), ("zarr", "zstd", 2),
                        ("hdf5", "lz4", None), ("zarr", "lz4", None)][int(rng.integers(5))]  # fmt: skip
    x = rng.normal(size=(n, k)).astype("f4")
    src = xr.Dataset({"x": (("s", "k"), x), "y": (("s",), np.arange(n, dtype="f8"))})
    name = f"g{seed}"
    cfg: dict[str, Any] = {
        "view": "userfuncs:ragged_tokens", "sample_dims": ["s"], "format": fmt,
        "compression": comp, "chunk_rows": int(rng.choice([1, 4, 8, 33])),
        "out": str(root / name), "splits": {"train": 0.7, "val": 0.3},
    }  # fmt: skip
    if shard:
        cfg["shard_chunks"] = shard
    shardload.prepare(cfg, dataset=src, progress=False).close()
    want = [x[i, : (i * 7) % 13] for i in range(n)]
    mode = "pad" if rng.random() < 0.3 else "drop"
    world = int(rng.choice([1, 2, 4]))
    epoch = int(rng.integers(0, 3))
    kw: dict[str, Any] = dict(
        batch_size=int(rng.choice([1, 4, 9])), split=[None, "train"][int(rng.integers(2))],
        shuffle=bool(rng.random() < 0.7), seed=seed % 5, mode=mode,
        drop_last=mode == "drop" and bool(rng.random() < 0.3),
    )  # fmt: skip
    if kw["shuffle"] and rng.random() < 0.3:
        kw["bucket"] = True

    def check(b: P.Batch) -> None:
        tok, lens = np.asarray(b["tok"]), np.asarray(b["tok_length"])
        assert tok.shape == (len(b["index"]), max(lens.max(initial=0), tok.shape[1]))
        for j, i in enumerate(np.asarray(b["index"]).tolist()):
            assert lens[j] == len(want[i]), (i, lens[j], len(want[i]))
            np.testing.assert_array_equal(tok[j, : lens[j]], want[i], err_msg=f"tok of {i}")
            assert not tok[j, lens[j] :].any(), f"padding of {i} not zero"
            assert np.asarray(b["y"])[j] == i

    path = root / name
    spec = LoadSpec.build(str(path), **kw)
    COUNT["ragged"] += 1
    if refused(path, kw, spec, world, epoch):
        return 0
    every = spec.selection.global_rows().tolist()
    ref = None
    for workers in (0, 2):
        ranks = _epoch(path, kw, world, workers, epoch, check)
        check_once(
            ranks, every, spec.plan(world_size=world, num_workers=workers, epoch=epoch), mode
        )
        ref = ref or ranks
    u = f"{url}{name}" if url else None
    n_ep = 2 + _same_paths(path, kw, world, epoch, check, ref, url=u, contexts=contexts)
    return n_ep + _resume(path, kw, spec, world, epoch, check, ref)
