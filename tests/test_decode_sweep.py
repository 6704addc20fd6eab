"""Seeded sweep of the decode reader (Zarr shards of Blosc inner chunks decoded straight into
their batches, locally and by URL) and of raw shards (scatter reads): every served value equal
to the source's, through elastic and chained resumes left at 0 batches, mid-epoch or at the
last batch, mode pad or drop, drop_last, verify settings, small URL request and keep bounds, and
``StreamingDataLoader`` workers forked and spawned (see tests/_decode_sweep.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import _decode_sweep as D
from _paths_run import served
from shardload.errors import PlanError

pytestmark = pytest.mark.timeout(600)

#: seeds of the fast run: 154 saves a padded epoch of 7 ranks before any batch and resumes it on
#: 3 (a row twice in one group: the bug fixed in 9ecb361 served recycled batch memory there);
#: 87 a chain of zstd resumes with the tight URL knobs; 5 a state saved after the last batch
FAST = (154, 87, 5)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("decode-sweep")


@pytest.fixture(scope="module")
def url(root: Path) -> Iterator[str]:
    with served(root) as base:
        yield base


def _run(seeds: range | tuple[int, ...], root: Path, url: str, *, cache: bool) -> Counter:
    seen: Counter = Counter()
    for seed in seeds:
        try:
            seen += D.run_seed(seed, root, url, cache=cache)
        except PlanError:  # e.g. drop_last with fewer rows a rank than a batch
            seen["refused"] += 1
    return seen


def test_fast_cases_serve_the_source_values(root: Path, url: str) -> None:
    seen = _run(FAST[1:], root, url, cache=False)  # locally and by URL
    assert seen["local"] == seen["url"] > 0
    assert _run(FAST[:1], root, None, cache=False)["local"] > 0  # 7 ranks: locally only


def test_fast_cases_cover_what_they_say() -> None:
    cases = [D.random_case(s) for s in FAST]
    assert {c.compression for c in cases} >= {"lz4", "zstd"}
    assert {c.mode for c in cases} == {"pad", "drop"}
    assert any(c.rows % c.chunk_rows for c in cases)  # a partial last chunk
    assert any(len(c.legs) > 1 for c in cases)  # a resumed chain


@pytest.mark.slow
def test_sweep_serves_the_source_values(root: Path, url: str) -> None:
    seen = _run(range(100, 120), root, url, cache=True)
    assert seen["local"] == seen["url"] == seen["url+cache"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_dataloader_resumes_serve_the_source_values(root: Path, url: str, seed: int) -> None:
    rng = np.random.default_rng(seed + 99)
    case = D.random_case(seed)
    context = "spawn" if seed % 3 == 2 else "fork"
    workers = (int(rng.integers(0, 3)), int(rng.integers(1, 3)))
    stop = D.STOPS[seed % 3]
    path, want = D.make_store(case, root / "torch")  # (the fast run's stores are in root)
    store = f"{url}torch/{path.name}" if seed % 2 else str(path)
    with D.tight(seed):
        try:
            got = D.check_torch(case, store, want, workers=workers, context=context, stop=stop)
        except PlanError:
            pytest.skip("the case's plan is refused (drop_last with too few rows)")
    assert got >= 0


class _Refusing:
    """The compiled kernel serving at most one chunk a call and refusing every third it is
    asked for first: the Python fallbacks (``shard_rows._one_chunk`` locally, the pieces left
    to the staging path by URL) serve those chunks."""

    ABI = 3

    def __init__(self, real: object) -> None:
        self.real, self.calls, self.refused = real, 0, 0

    def _serve(self, fn: object, i: int, n: int, call: object) -> int:
        self.calls += 1
        if i >= n or self.calls % 3 == 0:
            self.refused += i < n
            return i
        return int(call(i, i + 1))

    def decode_rows(self, fn, fd, offs, sizes, i, n, *rest):
        return self._serve(
            fn, i, n, lambda a, b: self.real.decode_rows(fn, fd, offs, sizes, a, b, *rest)
        )

    def decode_rows_buf(self, fn, buf, nbuf, offs, sizes, i, n, *rest):
        return self._serve(
            fn,
            i,
            n,
            lambda a, b: self.real.decode_rows_buf(fn, buf, nbuf, offs, sizes, a, b, *rest),
        )


@pytest.mark.slow
def test_chunks_the_kernel_refuses_serve_the_source_values(
    root: Path, url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from shardload.formats.zarr import shard_rows

    if shard_rows.KERNEL is None:
        pytest.skip("shardload's compiled kernel is not built (setup.py build_ext)")
    refusing = _Refusing(shard_rows.KERNEL)
    monkeypatch.setattr(shard_rows, "KERNEL", refusing)
    seen = Counter()
    for seed in (154, 87, 5):
        case = D.random_case(seed)
        path, want = D.make_store(case, root / "refused")
        with D.tight(seed):
            seen["local"] += D.check_case(case, str(path), want)
            seen["url"] += D.check_case(case, f"{url}refused/{path.name}", want)
    assert seen["local"] == seen["url"] > 0
    assert refusing.refused > 0
