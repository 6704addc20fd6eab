"""The default layout (issue 25): ``prepare`` with no layout key writes compressed Zarr v3 shards
of small inner chunks, and the default load of such a store mixes like a uniform shuffle (the
quality goals of ``plan.quality``) in-process, split over 2 DataLoader workers, on 1, 4 and 16
ranks, through ``StreamingDataLoader`` and by URL; an old store of big compressed chunks says
once, at load, that it cannot mix well and how to fix it.

The store is bigger than one default shuffle group (64 MiB decoded), so a load that mixed only
within a few chunks would show it: 20,000 rows of 4 KiB.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ShuffleQualityWarning
from shardload.load import options as load_options
from shardload.plan.default_layout import (
    DEFAULT_INNER_CHUNK_BYTES,
    DEFAULT_MIN_CHUNKS,
    DEFAULT_SHARD_BYTES,
    plan_default_layout,
)
from shardload.plan.quality import quality
from shardload.prep.config import load_config
from shardload.prep.planning import resolve_layout

N, F, B = 20_000, 1024, 256  # rows, float32 per row, batch size
GOALS = {"chunks_per_batch_ratio": 0.9, "vif_pos": 1.5, "vif_ar": 2.0, "recurrence": 1.5}

prepare = getattr(shardload.prepare, "prepare", shardload.prepare)


def _dataset() -> xr.Dataset:
    # row i holds i in its first column; the rest compresses well (the test is about layout)
    x = np.zeros((N, F), np.float32)
    x[:, 0] = np.arange(N)
    x[:, 1:] = (np.arange(N)[:, None] % 7).astype(np.float32)
    return xr.Dataset({"a": (("sample", "feat"), x)})


def _config(out: Path, **layout: object) -> dict[str, object]:
    return {
        "sample_dims": ["sample"],
        "view": "flat",
        "arrays": {"x": ["a"]},
        "out": str(out),
        "splits": {},
        **layout,
    }


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, Path]:
    """``default``: prepared with no layout key; ``chunks16``: the default before (16 MiB)."""
    root = tmp_path_factory.mktemp("layout")
    ds = _dataset()
    prepare(_config(root / "default"), dataset=ds)
    prepare(_config(root / "chunks16", target_chunk_bytes="16MiB"), dataset=ds)
    return {"default": root / "default", "chunks16": root / "chunks16"}


def _epochs(load, epochs=(0, 1)) -> list[list[np.ndarray]]:
    return [[np.asarray(b["index"], np.int64).copy() for b in load(e)] for e in epochs]


def _quality(store: Path, epochs: list[list[np.ndarray]]) -> dict[str, float]:
    bounds = np.asarray(shardload.open_store(store).manifest.chunk_bounds)
    chunk_of = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))
    rows = np.sort(np.concatenate(epochs[0]))
    assert len(np.unique(rows)) == len(rows)  # every row at most once an epoch
    return quality(epochs, chunk_of)


def _meets(q: dict[str, float]) -> list[str]:
    bad = [] if q["chunks_per_batch_ratio"] >= GOALS["chunks_per_batch_ratio"] else ["cpb"]
    return bad + [k for k in ("vif_pos", "vif_ar", "recurrence") if not q[k] <= GOALS[k]]


# -- the layout ------------------------------------------------------------------------------


def test_default_prepare_writes_shards_of_small_inner_chunks(stores):
    m = shardload.open_store(stores["default"]).manifest
    rows, per_shard = plan_default_layout(F * 4, length=N)
    # 82 MB, under 8,192 chunks of 128 KiB: 8,192 chunks or more, of 2 rows (8 KiB)
    assert m.arrays["x"].chunk_rows == rows == N // DEFAULT_MIN_CHUNKS == 2
    assert m.options["shard_chunks"] == per_shard == DEFAULT_SHARD_BYTES // (rows * F * 4)
    assert m.options["compression"] == "auto" and m.options["array_compression"] == {"x": "lz4"}
    files = sorted(p for p in (stores["default"] / "x" / "c").rglob("*") if p.is_file())
    num_chunks = len(m.chunk_bounds) - 1
    assert len(files) == -(-num_chunks // per_shard) == 2  # 82 MB: 2 shards of 64 MiB
    old = shardload.open_store(stores["chunks16"]).manifest
    assert "shard_chunks" not in old.options or not old.options["shard_chunks"]
    assert old.arrays["x"].chunk_rows == 16 * 2**20 // (F * 4)


def test_default_store_reads_back_as_written(stores):
    got = shardload.open_store(stores["default"]).read("x", 0, N)
    want = _dataset()["a"].values
    np.testing.assert_array_equal(got, want)


def _view(row_bytes: int, length: int, *, ragged: bool = False) -> SimpleNamespace:
    spec = SimpleNamespace(row_bytes=row_bytes, ragged=ragged)
    return SimpleNamespace(specs={"x": spec}, length=length)


@pytest.mark.parametrize(
    ("keys", "sharded"),
    [
        ({}, True),
        ({"compression": "zstd"}, True),
        ({"chunk_rows": 100}, False),
        ({"target_chunk_bytes": "16MiB"}, False),
        ({"shard_chunks": 4}, False),  # as before: chunks of target_chunk_bytes, 4 to a shard
        ({"compression": "none"}, False),  # raw rows: read in small pieces already
        ({"format": "npy"}, False),
        ({"format": "hdf5"}, False),
    ],
)
def test_the_default_layout_only_when_no_layout_key_is_given(tmp_path, keys, sharded):
    cfg = load_config(
        {"source": {"paths": ["x.nc"]}, **_config(tmp_path / "s"), **keys}, base_dir=tmp_path
    )
    got = resolve_layout(cfg, _view(6200, 65_536))  # type: ignore[arg-type]
    if sharded:
        assert (got.chunk_rows, got.shard_chunks) == plan_default_layout(6200, length=65_536)
    else:
        assert got == cfg
    ragged = resolve_layout(cfg, _view(6200, 65_536, ragged=True))  # type: ignore[arg-type]
    assert ragged == cfg  # variable-length arrays keep their own layout


def test_plan_default_layout_sizes():
    big = 2**30 // 6200 * 4  # 4 GiB: inner chunks of 128 KiB, 64 MiB shards
    assert plan_default_layout(6200, length=big) == (21, 515)
    assert 21 * 6200 <= DEFAULT_INNER_CHUNK_BYTES < 22 * 6200
    # under 8,192 chunks of 128 KiB: 8,192 chunks of fewer rows (every worker of 16 ranks x 2
    # workers then holds 256 chunks, one for each row of a batch of 256)
    assert plan_default_layout(6200, length=65_536) == (8, 1353)
    assert plan_default_layout(6200, length=100) == (1, 100)  # a small store: one shard
    assert plan_default_layout(4, length=10_000) == (1024, 10)  # inner chunks of >= 4 KiB
    assert plan_default_layout(10**7, length=50) == (1, 6)  # rows bigger than an inner chunk


# -- the default load mixes -------------------------------------------------------------------


@pytest.mark.parametrize("world", [1, 4, 16])
def test_default_load_mixes_like_uniform_on_ranks_and_workers(stores, world):
    """Every rank's 2 DataLoader workers (as ``StreamingDataLoader`` splits them), in-process."""
    store = stores["default"]

    def load(epoch):
        for rank in range(world):
            for worker in range(2):
                yield from shardload.iter_batches(
                    store,
                    batch_size=B,
                    epoch=epoch,
                    rank=rank,
                    world_size=world,
                    worker=worker,
                    num_workers=2,
                )

    q = _quality(store, _epochs(load))
    assert not _meets(q), q


def test_default_load_mixes_like_uniform_in_process(stores):
    store = stores["default"]
    epochs = _epochs(lambda e: shardload.iter_batches(store, batch_size=B, epoch=e))
    assert sum(len(b) for b in epochs[0]) == N  # the last batch short (drop_last=False)
    q = _quality(store, epochs)
    assert not _meets(q), q


def test_the_old_default_did_not_mix(stores):
    """The reference the goals are measured against: 16 MiB chunks, 4 to a group."""
    store = stores["chunks16"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        epochs = _epochs(lambda e: shardload.iter_batches(store, batch_size=B, epoch=e))
    q = _quality(store, epochs)
    assert {"cpb", "vif_pos"} <= set(_meets(q)), q


def test_default_load_mixes_through_streaming_dataloader(stores):
    torch = pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    store = stores["default"]

    def load(epoch):
        ds = StreamingDataset(store, batch_size=B)
        ds.set_epoch(epoch)
        for b in StreamingDataLoader(ds, batch_size=None, num_workers=2):
            assert isinstance(b["index"], torch.Tensor)
            yield {"index": b["index"].numpy()}

    q = _quality(store, _epochs(load))
    assert not _meets(q), q


def _by_url(store: Path, epochs=(0, 1)) -> tuple[list, list]:
    """The batches of ``epochs`` by URL (``shardload serve`` on loopback) and locally."""
    from shardload.move.serve import serving

    with serving(store.parent) as url:
        remote = _epochs(
            lambda e: shardload.iter_batches(url + store.name, batch_size=B, epoch=e), epochs
        )
    local = _epochs(lambda e: shardload.iter_batches(store, batch_size=B, epoch=e), epochs)
    return remote, local


def test_default_store_by_url_gives_the_local_batches(tmp_path):
    """A small default store (one shard of 1-row inner chunks): by URL, each inner chunk one
    range request, the batches those read locally, so the local quality holds by URL."""
    store = prepare(_config(tmp_path / "small"), dataset=_dataset().isel(sample=slice(0, 1000)))
    assert store.manifest.options["shard_chunks"] == 1000
    remote, local = _by_url(tmp_path / "small", (0,))
    assert len(remote[0]) == -(-1000 // B)
    for r, lo in zip(remote[0], local[0], strict=True):
        np.testing.assert_array_equal(r, lo)


@pytest.mark.slow  # 10,000 inner chunks of 8 KiB, a range request each: about 50 s here
def test_default_load_mixes_by_url(stores):
    remote, local = _by_url(stores["default"])
    q = _quality(stores["default"], remote)
    assert not _meets(q), q
    for r, lo in zip(remote[1], local[1], strict=True):
        np.testing.assert_array_equal(r, lo)


# -- a store that cannot mix says so ----------------------------------------------------------


def test_an_unmixable_store_warns_once_with_the_fix(stores, monkeypatch):
    monkeypatch.setattr(load_options, "_WARNED", set())
    store = stores["chunks16"]
    with pytest.warns(ShuffleQualityWarning) as got:
        list(shardload.iter_batches(store, batch_size=B))
        list(shardload.iter_batches(store, batch_size=B, epoch=1))
    msgs = [str(w.message) for w in got if "shardload copy" in str(w.message)]
    assert len(msgs) == 1, msgs
    assert str(store) in msgs[0] and "default layout" in msgs[0]
    assert "at most 4 chunks" in msgs[0]


def test_the_default_store_and_explicit_options_do_not_warn(stores, monkeypatch):
    monkeypatch.setattr(load_options, "_WARNED", set())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(shardload.iter_batches(stores["default"], batch_size=B))
        # the user chose the group: no advice
        list(shardload.iter_batches(stores["chunks16"], batch_size=B, shuffle_chunks=2))
        list(shardload.iter_batches(stores["chunks16"], batch_size=B, shuffle=False))


def test_default_layout_doctests():
    import doctest

    import shardload.plan.chunks as chunks_mod
    import shardload.plan.default_layout as layout_mod

    for mod in (layout_mod, chunks_mod):
        assert doctest.testmod(mod).attempted > 0 and doctest.testmod(mod).failed == 0
