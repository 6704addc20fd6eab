"""Mid-epoch resume gives exactly the remaining batches on every read path (``_resume.py``):
gather (compressed chunks, and raw ones read by gather), scatter (raw local chunks, small
pieces and ``shuffle="uniform"``), variable-length arrays (raw and compressed), windows cut at
load time (raw and compressed)."""

from __future__ import annotations

from unittest import mock

import pytest

from _resume import assert_resumes_exactly
from _stores import make_store
from shardload.load import kinds as kinds_mod
from shardload.load.spec import LoadSpec

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    import test_ragged
    import test_window_at_load as win

    root = tmp_path_factory.mktemp("resume-paths")
    out = {
        "npy": make_store(root / "npy", fmt="npy", n=150, chunk_rows=8),
        "zarr-none": make_store(root / "zarr-none", fmt="zarr", n=150, chunk_rows=8),
        "zarr-zstd": make_store(
            root / "zarr-zstd", fmt="zarr", compression="zstd", n=150, chunk_rows=8
        ),
        "ragged-npy": test_ragged.make(root, "npy", "none", None),
        "ragged-zstd": test_ragged.make(root, "zarr", "zstd", 2),
    }
    src = win._source(root)
    out["window-npy"] = win._prepare(src, root / "win-npy", at_load=True)
    out["window-zstd"] = win._prepare(
        src, root / "win-zstd", at_load=True, format="zarr", compression="zstd"
    )
    return out


CASES = [  # (store, read kind, options)
    ("zarr-zstd", "gather", {}),
    ("zarr-zstd", "gather", {"shuffle_chunks": 2}),
    ("npy", "gather", {}),
    ("npy", "scatter", {}),
    ("zarr-none", "scatter", {"piece_rows": 3}),
    ("zarr-none", "scatter", {"shuffle": "uniform"}),
    ("npy", "scatter", {"shuffle": False, "mode": "pad"}),
    ("ragged-npy", "ragged", {}),
    ("ragged-zstd", "ragged", {"bucket": True}),
    ("window-npy", "window", {"split": "train"}),
    ("window-zstd", "window", {"split": "train", "shuffle": "chunks"}),
]


@pytest.mark.parametrize(("name", "kind", "opts"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_mid_epoch_resume_yields_exactly_the_rest(stores, name, kind, opts):
    store = stores[name]
    batch = 3 if kind == "ragged" else 5
    force_gather = kind == "gather" and name == "npy"
    with (
        mock.patch.object(kinds_mod, "raw_sources", lambda *a: None)
        if force_gather
        else (mock.patch.dict({}))
    ):
        assert LoadSpec.build(store, batch_size=batch, **opts).kind == kind
        assert_resumes_exactly(store, batch_size=batch, seed=7, **opts)
