"""The equivalence harness over dated windows, ragged arrays, read groups and elastic resume
(tests/_paths_more.py, beside tests/_paths.py's plain arrays).

Per epoch: every window / row once (less reported drops, plus padding), values the source's
(a window's states the consecutive dates of its start, never a missing date's, never NaN), the
same batches in-process with 0 and 2 workers, by URL, through ``StreamingDataLoader`` with 2
forked workers and as ``window_views``; resume exact; a state resumed on other world shapes
(twice, chained) serves every row not yet consumed once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import _paths as P
import _paths_groups as G
import _paths_more as M
import _paths_run as R

pytestmark = pytest.mark.timeout(600)


def _dated(seed: int, **kw) -> M.DatedCase:
    base = dict(
        seed=seed, n=90, chunk_rows=5, fmt="npy", missing=(0, 1, 30, 31, 32, 61, 89),
        window=3, step=2, views=True, batch_size=7, shuffle=True, mode="drop",
        drop_last=False, split="train", world=2, epoch=1,
    )  # fmt: skip
    return M.DatedCase(**{**base, **kw})


DATED = {
    "npy-window3-step2-views": _dated(1),
    "sharded-window5-pad-4ranks": _dated(
        2, fmt="zarr-sharded", chunk_rows=3, window=5, step=1, mode="pad", world=4, views=False
    ),
    "zarr-none-rows-drop-last": _dated(
        3, fmt="zarr-none", window=None, step=None, views=False, drop_last=True, split=None
    ),
    "zstd-window1-in-order": _dated(
        4, fmt="zarr-zstd", chunk_rows=16, window=1, step=1, shuffle=False, world=1, split="val"
    ),
}


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[tuple[Path, str]]:
    root = tmp_path_factory.mktemp("more")
    with R.served(root) as base:
        yield root, base


@pytest.mark.parametrize("name", list(DATED))
def test_dated_windows_on_every_path(url, name):
    root, base = url
    ctx = ("fork", "spawn") if name.startswith("zstd") else ("fork",)  # spawn: one rank
    assert M.check_dated(DATED[name], root / name, url=f"{base}{name}/", contexts=ctx) >= 5


@pytest.mark.parametrize("seed", [3, 8])
def test_ragged_on_every_path(url, seed):
    root, base = url
    assert M.check_ragged(seed, root / f"g{seed}", url=f"{base}g{seed}/") >= 5


@pytest.mark.parametrize("seed", [0, 1])
def test_read_groups_slices_and_workers(url, seed):
    root, base = url
    assert G.check_read_groups(seed, root, url=base) == 4


ELASTIC = {  # (case seed, new world, new workers, fraction read, then)
    "1-to-4-ranks-then-2": (0, 4, 1, 0.5, (2, 2, 0.5)),
    "4-to-3-ranks-2-workers": (1, 3, 2, 0.2, (1, 0, 0.7)),
    "pad-2-to-1": (2, 1, 0, 0.9, None),
}


@pytest.mark.parametrize("name", list(ELASTIC))
def test_elastic_resume_serves_every_row_not_yet_consumed_once(url, name):
    root, base = url
    seed, world, workers, frac, then = ELASTIC[name]
    case = P.random_case(seed, max_rows=1200)
    if name.startswith("pad"):
        case = P.Case(**{**case.__dict__, "mode": "pad", "drop_last": False, "world": 2})
    folder = root / f"e-{name}"
    assert (
        G.check_elastic(case, folder, world, workers, frac, then=then, url=f"{base}e-{name}/") == 2
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(200, 215))
def test_random_dated_ragged_groups_elastic(url, seed):
    """benchmarks/stress_paths.py --more's checks for one seed."""
    root, base = url
    rng = np.random.default_rng(seed + 10**6)
    folder = root / f"m{seed}"
    M.check_dated(M.random_dated(seed), folder / "d", url=f"{base}m{seed}/d/")
    M.check_ragged(seed, folder / "g", url=f"{base}m{seed}/g/")
    G.check_read_groups(seed, folder / "rg", url=f"{base}m{seed}/rg/")
    then = (int(rng.choice([1, 2, 3])), int(rng.choice([0, 2])), float(rng.choice([0.3, 0.7])))
    G.check_elastic(
        P.random_case(seed, max_rows=2000), folder / "e", int(rng.choice([1, 2, 3, 4])),
        int(rng.choice([0, 1, 2])), float(rng.choice([0.1, 0.5, 0.9])), then=then,
        url=f"{base}m{seed}/e/",
    )  # fmt: skip
