"""Reader threads per DataLoader worker: the workers of a rank share the machine's CPUs
(docs/benchmarks.md, session 11)."""

from __future__ import annotations

import pytest

import shardload
from _stores import check_values, make_store
from shardload.load import gather as gather_mod
from shardload.load import options as options_mod

ROWS, CHUNK = 96, 8


@pytest.fixture(scope="module")
def zstd(tmp_path_factory):
    return make_store(
        tmp_path_factory.mktemp("zstd"),
        fmt="zarr",
        compression="zstd",
        n=ROWS,
        chunk_rows=CHUNK,
        splits={"train": 1.0},
    )


@pytest.mark.parametrize(
    ("cpus", "readers", "local", "prefetch", "want"),
    [
        (2, 1, True, 4, 2),  # in-process: as before
        (2, 2, True, 4, 1),  # 2 workers on 2 CPUs: one thread each
        (16, 2, True, 4, 4),  # many CPUs: at most 4
        (16, 8, True, 4, 2),
        (2, 4, True, 4, 1),  # more workers than CPUs: still one
        (2, 2, False, 4, 32),  # remote: threads wait on the network (URL_IN_FLIGHT)
        (16, 2, True, 1, 1),  # never more than the read-ahead
    ],
)
def test_default_threads_share_the_cpus_among_workers(
    monkeypatch, cpus, readers, local, prefetch, want
):
    monkeypatch.setattr(options_mod, "_cores", lambda: cpus)
    assert options_mod.default_threads(prefetch, readers, local=local) == want


def test_iter_batches_uses_the_default_threads(zstd, monkeypatch):
    """The reader of a worker of 2 on 2 CPUs runs one reader thread (it started 2 before)."""
    seen = []
    real = gather_mod.GatherReader

    def spy(*args, **kwargs):
        seen.append(kwargs["threads"])
        return real(*args, **kwargs)

    monkeypatch.setattr(options_mod, "_cores", lambda: 2)
    monkeypatch.setattr(gather_mod, "GatherReader", spy)
    for workers, want in ((0, 2), (2, 1)):
        seen.clear()
        out = [
            b["index"]
            for w in range(max(1, workers))
            for b in shardload.iter_batches(zstd, batch_size=8, worker=w, num_workers=workers)
        ]
        assert seen == [want] * max(1, workers)
        assert sorted(int(i) for b in out for i in b) == list(range(ROWS))
    seen.clear()
    list(shardload.iter_batches(zstd, batch_size=8, worker=1, num_workers=2, threads=3))
    assert seen == [3]  # given threads win


@pytest.mark.parametrize("ctx", ["fork", "spawn"])
@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_workers_with_one_thread_each_yield_every_row_once(tmp_path, monkeypatch, compression, ctx):
    """2 StreamingDataLoader workers on 2 CPUs (one reader thread each): every row once, with
    its values, for a store read by whole chunks and one read by scatter reads, from forked
    and spawned workers (a spawned worker counts this machine's own CPUs)."""
    pytest.importorskip("torch")
    import multiprocessing

    if ctx not in multiprocessing.get_all_start_methods():
        pytest.skip(f"no {ctx} start method here")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    monkeypatch.setattr(options_mod, "_cores", lambda: 2)
    store = make_store(
        tmp_path,
        fmt="zarr",
        compression=compression,
        n=ROWS,
        chunk_rows=CHUNK,
        splits={"train": 1.0},
    )
    rows = []
    ds = StreamingDataset(store, batch_size=8, seed=2)
    for b in StreamingDataLoader(ds, num_workers=2, multiprocessing_context=ctx):
        check_values(store, {k: v.numpy() for k, v in b.items()})
        rows += b["index"].tolist()
    assert sorted(rows) == list(range(ROWS))
