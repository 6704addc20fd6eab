"""Every read path serves the same right rows: a randomized equivalence harness (tests/_paths.py).

A small store (float32, int16 and float64 arrays of assorted row shapes; Zarr default layout,
Zarr lz4 / uncompressed / sharded, npy, HDF5; chunks of 7 to 1,000 rows) read in-process with
0, 1 and 2 workers per rank on 1, 2 or 4 ranks, over one open store by two iterators, by URL
(``shardload serve`` on loopback), through a node cache, through ``StreamingDataLoader`` (0 and
2 forked workers, two epochs with persistent workers), ``MapDataset``, and resumed mid-epoch:
per epoch each selected row once (less the plan's reported drops, plus its padding), each
value the *source's* (not the store's own read), the same batches on every path, exactly the
remaining batches after a resume, and no held batch (or view of one) changed while reading on.
``benchmarks/stress_paths.py`` runs the same checks over thousands of random cases.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import _paths as P
import _paths_run as R

pytestmark = pytest.mark.timeout(600)


def _case(seed: int, **kw) -> P.Case:
    base = dict(
        seed=seed,
        rows=600,
        fmt="zarr",
        compression="auto",
        chunk_rows=None,
        shard_chunks=None,
        feat=3,
        lev=(2,),
        split="train",
        batch_size=8,
        shuffle=True,
        drop_last=False,
        mode="drop",
        world=2,
        epoch=1,
        piece_rows=None,
        load_seed=5,
    )
    return P.Case(**{**base, **kw})


#: Fixed cases: every format and compression, the default layout, shards, splits cut inside a
#: chunk, uniform shuffle, pad mode, drop_last, 1 / 2 / 4 ranks, pieces and shuffle groups.
CASES = {
    "zarr-default-2ranks": _case(1, lev=(2, 3)),
    "zarr-lz4-sharded-4ranks-pad": _case(
        2, compression="lz4", chunk_rows=7, shard_chunks=3, world=4, mode="pad", batch_size=5
    ),
    "zarr-none-uniform-drop-last": _case(
        3, compression="none", chunk_rows=64, shuffle="uniform", drop_last=True, world=1
    ),
    "npy-pieces-4ranks": _case(
        4, fmt="npy", compression="none", chunk_rows=64, piece_rows=5, world=4
    ),
    "npy-no-shuffle-split-in-chunk": _case(
        5, fmt="npy", compression="none", chunk_rows=333, shuffle=False, batch_size=32
    ),
    "hdf5-lz4-groups": _case(6, fmt="hdf5", compression="lz4", chunk_rows=7, shuffle_chunks=3),
    "hdf5-none-whole-chunks": _case(
        7, fmt="hdf5", compression="none", chunk_rows=1000, piece_rows=0, split=None, world=1
    ),
}


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("paths")
    with R.served(root) as base:
        yield root, base


@pytest.mark.parametrize("name", list(CASES))
def test_every_read_path_serves_the_sources_rows_in_one_order(url, name):
    root, base = url
    case = CASES[name]
    report = R.run_case(
        case,
        root / name,
        url=f"{base}{name}/",
        cache_dir=root / name / "cache",
        cache_bytes=case.rows * 16,  # a third of the store or less: files evicted, fetched again
        # new workers each epoch for half the cases: they reclaim the dead workers' ring slots
        torch_workers=[(0, None), (2, "fork", list(CASES).index(name) % 2 == 0)],
        map_dataset=name.startswith(("zarr-default", "hdf5-lz4", "npy-no")),
        torch_epochs=2,
    )
    # every path ran (and counted what it checked)
    assert {"iter_batches/0w", "iter_batches/2w", "url", "url+cache", "url+small-cache"} <= set(
        report.paths
    )
    assert any(p.startswith("torch/2w/fork") for p in report.paths)
    assert report.held_checked > 0 and report.batches > 0


@pytest.mark.parametrize("name", ["zarr-default-2ranks", "npy-pieces-4ranks"])
def test_a_loader_resumed_from_its_saved_state_finishes_the_epoch_exactly(url, name):
    root, _ = url
    case = CASES[name]
    P.make_case_store(case, root / f"resume-{name}")
    assert R.check_torch_resume(case, root / f"resume-{name}", 2, "fork", k=3) > 3


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_random_cases_in_process_and_by_url(url, seed):
    root, base = url
    case = P.random_case(seed, max_rows=900)
    R.run_case(case, root / f"r{seed}", url=f"{base}r{seed}/", sim_workers=(0, 2))


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")  # 4 on 2 cores
@pytest.mark.parametrize("seed", range(100, 130))
def test_random_cases_every_path(url, seed):
    """The stress run's checks (benchmarks/stress_paths.py), spawned workers included."""
    root, base = url
    case = P.random_case(seed, max_rows=2000)
    folder = root / f"slow{seed}"
    spawn = [(2, "spawn")] if seed % 10 == 0 else []
    R.run_case(
        case,
        folder,
        url=f"{base}slow{seed}/",
        cache_dir=folder / "cache",
        cache_bytes=case.rows * 16,
        torch_workers=[(0, None), (1, "fork", False), (2, "fork"), (4, "fork"), *spawn],
        map_dataset=True,
        torch_epochs=2,
    )
    R.check_torch_resume(case, folder, 2, "fork", k=3)


@pytest.mark.parametrize(
    ("fmt", "shard_chunks"), [("zarr", None), ("zarr", 3), ("hdf5", None), ("npy", None)]
)
def test_a_store_of_fewer_rows_than_chunk_rows_reads_back(tmp_path, fmt, shard_chunks):
    """``chunk_rows`` above the store's rows: one chunk of all the rows, whose size the manifest
    records. Before, a Zarr store recorded the config's ``chunk_rows`` (1,000) while its
    ``zarr.json`` had the 600 rows written, and every open of it failed."""
    compression = "none" if fmt == "npy" else "lz4"
    case = _case(21, fmt=fmt, compression=compression, chunk_rows=1000, shard_chunks=shard_chunks)
    report = R.run_case(case, tmp_path, sim_workers=(0, 2), resume=False)
    assert report.batches > 0


@pytest.mark.parametrize("persistent", [True, False])
def test_an_epoch_left_early_then_a_full_one_on_the_same_loader(url, persistent):
    """``limit_train_batches``: 3 batches of an epoch, then the next epoch whole, 2 forked
    workers (persistent, or new ones reclaiming the ring slots of the first ones), the batches
    of both epochs held: the next epoch's batches exactly, none of the held ones changed."""
    root, _ = url
    case = CASES["zarr-default-2ranks"]
    folder = root / f"break-{persistent}"
    P.make_case_store(case, folder)
    assert R.check_torch_break(case, folder, 2, "fork", 3, persistent=persistent) > 3
