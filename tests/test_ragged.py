"""Variable-length (ragged) arrays: prepare to every format, read back, padded batches with
``NAME_length``, every row once per epoch over ranks, resume, shuffle, corruption, inspect."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ChunkReadError, PlanError, ViewError
from shardload.load.batches import iter_batches
from shardload.load.ragged import PaddingStats

TESTS = Path(__file__).resolve().parent
N, K, MAXLEN = 61, 13, 13
FORMATS = [
    ("npy", "none", None),
    ("zarr", "none", None),
    ("zarr", "zstd", 2),
    ("hdf5", "lz4", None),
]


def source() -> xr.Dataset:
    rng = np.random.default_rng(0)
    return xr.Dataset(
        {
            "x": (("s", "k"), rng.normal(size=(N, K)).astype("float32")),
            "y": (("s",), np.arange(N, dtype="float64")),
        }
    )


def expected(ds: xr.Dataset) -> list[np.ndarray]:
    x = ds.x.values
    return [x[i, : (i * 7) % MAXLEN] for i in range(N)]


def make(tmp_path: Path, fmt: str, comp: str, shard: int | None, **kw) -> shardload.Store:
    sys.path.insert(0, str(TESTS))
    cfg = {
        "view": "userfuncs:ragged_tokens",
        "sample_dims": ["s"],
        "format": fmt,
        "compression": comp,
        "chunk_rows": 8,
        "out": str(tmp_path / f"{fmt}-{comp}-{shard}"),
        "execution": {"scheduler": "threads", "num_workers": 2},
        **kw,
    }
    if shard:
        cfg["shard_chunks"] = shard
    return shardload.prepare(cfg, dataset=source(), progress=False)


@pytest.fixture(scope="module")
def stores(tmp_path_factory) -> dict[str, shardload.Store]:
    root = tmp_path_factory.mktemp("ragged")
    return {f"{f}-{c}-{s}": make(root, f, c, s) for f, c, s in FORMATS}


@pytest.fixture(scope="module")
def npy(stores) -> shardload.Store:
    return stores["npy-none-None"]


@pytest.mark.parametrize("key", [f"{f}-{c}-{s}" for f, c, s in FORMATS])
def test_prepare_every_format_reads_back_equal(stores, key):
    st = stores[key]
    ds, want = source(), expected(source())
    info = st.manifest.arrays["tok"]
    lengths = np.array([len(w) for w in want])
    assert info.is_ragged and info.shape == (N,) and info.dtype == "float32"
    assert info.ragged == {
        "max_length": int(lengths.max()),
        "min_length": 0,
        "mean_length": float(lengths.mean()),
        "num_values": int(lengths.sum()),
    }
    assert st.ragged == ("tok",) and f"tok[{N}, *]:float32" in repr(st)
    rows = st.read("tok")
    assert rows.lengths.dtype == np.int64 and rows.lengths.tolist() == lengths.tolist()
    for got, w in zip(rows.to_list(), want, strict=True):
        np.testing.assert_array_equal(got, w)  # value for value
    part = st.read("tok", 5, 27)  # across chunk edges
    for got, w in zip(part.to_list(), want[5:27], strict=True):
        np.testing.assert_array_equal(got, w)
    padded, lens = st.read_padded("tok", 3, 9)
    assert padded.shape == (6, lengths[3:9].max())
    for r in range(6):
        np.testing.assert_array_equal(padded[r, : lens[r]], want[3 + r])
        assert not padded[r, lens[r] :].any()
    np.testing.assert_array_equal(st.read("y"), ds.y.values)
    allv = np.concatenate(want).astype(np.float64)
    s = st.manifest.stats["tok"]
    assert s.count == len(allv)
    np.testing.assert_allclose(
        [s.mean[0], s.std[0], s.min[0], s.max[0]],
        [allv.mean(), allv.std(), allv.min(), allv.max()],
        rtol=1e-6,
    )
    with pytest.raises(shardload.errors.StoreError, match="variable-length"):
        st.to_xarray(["tok"])
    assert list(st.to_xarray().data_vars) == ["y"]


def epoch_rows(st, *, world, workers, epoch=0, batch_size=5, **kw):
    """All batches of all ranks: checks padding and values on the way."""
    want = expected(source())
    per_rank = []
    for r in range(world):
        its = [
            iter_batches(
                st,
                batch_size=batch_size,
                rank=r,
                world_size=world,
                worker=w,
                num_workers=workers,
                epoch=epoch,
                **kw,
            )
            for w in range(max(1, workers))
        ]
        batches = []
        for k in range(10**6):  # DataLoader round robin
            b = next(its[k % len(its)], None)
            if b is None:
                break
            assert b["tok"].shape == (len(b["index"]), b["tok_length"].max())
            assert b["tok_length"].dtype == np.int64 and b["tok"].dtype == np.float32
            for j, i in enumerate(b["index"]):
                n = b["tok_length"][j]
                np.testing.assert_array_equal(b["tok"][j, :n], want[i])
                assert not b["tok"][j, n:].any()
                assert b["y"][j] == i
            batches.append(b["index"].tolist())
        per_rank.append(batches)
    return per_rank


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_row_once_equal_batches(npy, world):
    ranks = epoch_rows(npy, world=world, workers=2, mode="pad")
    assert len({len(b) for b in ranks}) == 1  # equal batch counts per rank
    rows = [i for b in ranks for batch in b for i in batch]
    pad = (-N) % world
    assert sorted(set(rows)) == list(range(N)) and len(rows) == N + pad


def test_shuffle_varies_by_epoch_same_seed_same_order(stores):
    st = stores["zarr-zstd-2"]
    e0, e1 = (epoch_rows(st, world=1, workers=0, epoch=e)[0] for e in (0, 1))
    assert e0 != e1 and sorted(i for b in e0 for i in b) == sorted(
        i for b in e1 for i in b
    ) == list(range(N))
    assert epoch_rows(st, world=1, workers=0, epoch=1)[0] == e1


@pytest.mark.parametrize(
    ("world", "new_world", "workers", "new_workers"),
    [pytest.param(1, 1, 2, 2, marks=pytest.mark.slow), (2, 2, 0, 0), (2, 1, 2, 0), (1, 4, 0, 2)],
)
def test_resume_mid_epoch_and_elastic(npy, world, new_world, workers, new_workers):
    from shardload.torch import StreamingDataLoader, StreamingDataset

    def loaders(w, rk, ws):
        return StreamingDataLoader(
            StreamingDataset(npy, batch_size=4, seed=5, rank=rk, world_size=ws, mode="pad"),
            num_workers=w,
        )

    full = [[b["index"].tolist() for b in loaders(workers, r, world)] for r in range(world)]
    heads, states = [], []
    for r in range(world):
        dl = loaders(workers, r, world)
        it = iter(dl)
        heads.append([next(it)["index"].tolist() for _ in range(3)])
        states.append(dl.state_dict())
        del it
    for r in range(world):
        assert heads[r] == full[r][:3]
    rest = []
    for r in range(new_world):
        dl = loaders(new_workers, r, new_world)
        dl.load_state_dict(states[0])
        rest.append([b["index"].tolist() for b in dl])
        assert all(len(b) > 0 for b in rest[-1])
    assert len({len(b) for b in rest}) == 1  # equal batches per rank after the resume
    if (world, workers) == (new_world, new_workers):
        assert [h + r for h, r in zip(heads, rest, strict=True)] == full  # exact continuation
    seen = sorted(i for part in (heads, rest) for rk in part for b in rk for i in b)
    assert set(seen) == set(range(N))
    pad = len(seen) - N  # rows repeated are padding only (mode="pad"), never a lost row
    assert 0 <= pad < new_world * 4 + world


@pytest.mark.parametrize("ctx", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_dataloader_workers_fork_and_spawn(stores, ctx):
    from shardload.torch import StreamingDataLoader, StreamingDataset

    st = stores["hdf5-lz4-None"]
    want = expected(source())
    if True:
        ds = StreamingDataset(st, batch_size=8, rank=0, world_size=1)
        dl = StreamingDataLoader(ds, num_workers=2, multiprocessing_context=ctx)
        seen = []
        for b in dl:
            for j, i in enumerate(b["index"].tolist()):
                n = int(b["tok_length"][j])
                np.testing.assert_array_equal(b["tok"][j, :n].numpy(), want[i])
                assert not b["tok"][j, n:].any()
            seen += b["index"].tolist()
        assert sorted(seen) == list(range(N)), ctx


@pytest.mark.parametrize("key", [f"{f}-{c}-{s}" for f, c, s in FORMATS])
def test_missing_or_corrupt_chunk_is_an_error_naming_it(stores, key, tmp_path):
    st0 = stores[key]
    root = tmp_path / "copy"
    shutil.copytree(st0.root, root)
    fmt = st0.manifest.format
    if fmt == "npy":
        (root / "tok/values/000002.npy").unlink()
        match = r"chunk 2 .*tok.*missing.*000002\.npy"
    elif fmt == "zarr":
        (root / "tok/values/c/0").unlink()  # small data: one Zarr chunk of values
        match = r"tok.*missing a Zarr chunk.*values/c/0"
    else:  # change one value inside the file: the checksum of its chunk catches it
        import h5py

        with h5py.File(root / "ragged.h5", "r+") as f:
            f["tok/values"][20] += 1.0
        match = r"chunk 0 of array 'tok' is corrupt: .*ragged\.h5/tok/values"
    st = shardload.open_store(root, verify="first-epoch")
    with pytest.raises(ChunkReadError, match=match):
        st.read("tok")
    with pytest.raises(ChunkReadError, match=match):
        for _ in iter_batches(st, batch_size=4, shuffle=False):
            pass


def test_corrupt_npy_values_caught_by_checksum(npy, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(npy.root, root)
    path = root / "tok/values/000003.npy"
    arr = np.load(path)
    arr[0] += 1
    np.save(path, arr)
    with pytest.raises(ChunkReadError, match=r"chunk 3 of array 'tok' is corrupt.*000003\.npy"):
        shardload.open_store(root).read("tok")  # "auto": ragged values are always hashed
    bad = root / "tok/offsets.npy"
    off = np.load(bad)
    off[5] += 1
    np.save(bad, off)
    with pytest.raises(ChunkReadError, match="offsets"):
        shardload.open_store(root).read("tok", 0, 2)


def test_view_refuses_not_1d_samples(tmp_path):
    sys.path.insert(0, str(TESTS))
    with pytest.raises(ViewError, match=r"'tok'.*sample 0 has shape \(2, 2\).*1-D"):
        shardload.prepare(
            {"view": "userfuncs:ragged_2d", "sample_dims": ["s"], "out": str(tmp_path / "o")},
            dataset=source(),
            progress=False,
        )


def test_uniform_shuffle_refused(npy):
    with pytest.raises(PlanError, match="variable-length"):
        iter_batches(npy, batch_size=4, shuffle="uniform")


def test_resume_of_an_interrupted_prepare(tmp_path, monkeypatch):
    from shardload.prep import tasks as pipeline

    real = pipeline.run_block

    def failing(job, block):
        if block == 3:
            raise RuntimeError("killed")
        return real(job, block)

    monkeypatch.setattr(pipeline, "run_block", failing)
    with pytest.raises(RuntimeError, match="killed"):
        make(tmp_path, "zarr", "zstd", None)
    assert (tmp_path / "zarr-zstd-None.partial").exists()
    monkeypatch.setattr(pipeline, "run_block", real)
    st = make(tmp_path, "zarr", "zstd", None)
    for got, w in zip(st.read("tok").to_list(), expected(source()), strict=True):
        np.testing.assert_array_equal(got, w)
    clean = make(tmp_path / "clean", "zarr", "zstd", None)  # statistics: a clean run's, exactly
    for name, want in clean.manifest.stats.items():
        got = st.manifest.stats[name]
        for f in ("mean", "std", "min", "max", "nan_count"):
            assert np.array_equal(getattr(got, f), getattr(want, f)), (name, f)


def test_inspect_and_verify_show_ragged(npy, capsys):
    from shardload.cli.app import main

    assert main(["inspect", npy.root]) == 0
    out = capsys.readouterr().out
    assert "tok" in out and "variable-length" in out and f"({N}, *)" in out
    assert main(["inspect", "--json", npy.root]) == 0
    js = json.loads(capsys.readouterr().out)
    assert js["arrays"]["tok"]["ragged"]["max_length"] == MAXLEN - 1
    assert main(["verify", npy.root]) == 0
    out = capsys.readouterr().out
    # every sample chunk of both arrays, plus the offsets of the ragged one
    assert "all good" in out and f"{2 * npy.num_chunks + 1} chunk" in out


def test_verify_names_a_bad_ragged_chunk(npy, tmp_path, capsys):
    from shardload.cli.app import main

    root = tmp_path / "copy"
    shutil.copytree(npy.root, root)
    arr = np.load(root / "tok/values/000004.npy")
    arr[-1] = 99
    np.save(root / "tok/values/000004.npy", arr)
    assert main(["verify", str(root)]) == 1
    assert "chunk 4 of array 'tok' is corrupt" in capsys.readouterr().out


def test_padding_stats(npy):
    stats = PaddingStats()
    for _ in iter_batches(npy, batch_size=8, padding_stats=stats):
        pass
    lengths = np.array([len(w) for w in expected(source())])
    assert stats.values == lengths.sum() and stats.cells >= stats.values
    assert 0 < stats.waste < 1


@pytest.fixture(scope="module")
def tail_store(tmp_path_factory) -> shardload.Store:
    return long_tailed(tmp_path_factory.mktemp("tail"))


def long_tailed(tmp_path: Path) -> shardload.Store:
    """A store of 400 rows with long-tailed lengths (geometric, mean 20): row ``i`` holds
    ``i, i + 1, ...``."""
    ds = xr.Dataset({"y": (("s",), np.arange(400.0))})
    cfg = {
        "view": {"name": "function", "function": "userfuncs:geometric_rows"},
        "sample_dims": ["s"],
        "format": "npy",
        "compression": "none",
        "chunk_rows": 25,
        "out": str(tmp_path / "tail"),
    }
    sys.path.insert(0, str(TESTS))
    return shardload.prepare(cfg, dataset=ds, progress=False)


def test_bucketing_cuts_padding_keeps_plan(tail_store):
    st = tail_store
    waste = {}
    for bucket in (False, True):
        stats = PaddingStats()
        rows = []
        for r in range(2):
            for w in range(2):
                for b in iter_batches(
                    st,
                    batch_size=16,
                    rank=r,
                    world_size=2,
                    worker=w,
                    num_workers=2,
                    epoch=3,
                    bucket=bucket,
                    padding_stats=stats,
                    shuffle_chunks=8,
                ):
                    for j, i in enumerate(b["index"]):
                        n = b["tok_length"][j]
                        np.testing.assert_array_equal(b["tok"][j, :n], np.arange(n) + i)
                    rows += b["index"].tolist()
        assert sorted(rows) == list(range(400))
        waste[bucket] = stats.waste
    assert waste[True] < 0.7 * waste[False], waste


@pytest.mark.parametrize(
    ("world", "new_world", "workers", "new_workers", "k"),
    [(2, 2, 2, 2, 3), (2, 1, 2, 0, 4), (1, 3, 0, 2, 5)],
)
def test_bucketed_resume_exact(tail_store, world, new_world, workers, new_workers, k):
    from shardload.plan.resume import EpochState

    st = tail_store
    kw = dict(batch_size=16, epoch=2, bucket=True, seed=4, shuffle_chunks=8, mode="pad")

    def rank_batches(r, ws, nw, state=None):
        its = [
            iter_batches(st, rank=r, world_size=ws, worker=w, num_workers=nw, state=state, **kw)
            for w in range(max(1, nw))
        ]
        out = []
        for j in range(10**6):
            b = next(its[j % len(its)], None)
            if b is None:
                return out
            out.append(b["index"].tolist())

    full = [rank_batches(r, world, workers) for r in range(world)]
    assert len({len(f) for f in full}) == 1
    from shardload.load.spec import loader_selection, plan_for

    sel = loader_selection(st, shuffle_chunks=8)[0]
    plan = plan_for(
        st,
        sel,
        world_size=world,
        num_workers=workers,
        shuffle=True,
        seed=4,
        epoch=2,
        mode="pad",
        drop_last=False,
        shuffle_chunks=8,
        batch_size=16,
        bucket=True,
    )
    state = EpochState(2, k, world, workers, plan.fingerprint).to_dict()
    rest = [rank_batches(r, new_world, new_workers, state) for r in range(new_world)]
    assert len({len(x) for x in rest}) == 1
    if (world, workers) == (new_world, new_workers):
        assert [f[k:] for f in full] == rest
    seen = [i for f in full for b in f[:k] for i in b] + [i for x in rest for b in x for i in b]
    assert set(seen) == set(range(400))
    assert len(seen) - 400 < 16 * (world + new_world)  # only padding repeats
    with pytest.raises(shardload.errors.StateError):  # a bucketed state never resumes unbucketed
        next(iter_batches(st, state=state, **{**kw, "bucket": False}))


def test_bucket_needs_ragged_and_shuffle(npy):
    with pytest.raises(PlanError, match="shuffle=True"):
        iter_batches(npy, batch_size=4, shuffle=False, bucket=True)
    with pytest.raises(PlanError, match="fixed shapes"):
        iter_batches(npy, batch_size=4, arrays=["y"], bucket=True)


def test_map_dataset_refuses_ragged(npy):
    from shardload.torch import MapDataset

    with pytest.raises(shardload.errors.StoreError, match=r"variable-length.*StreamingDataset"):
        MapDataset(npy)
    assert MapDataset(npy, arrays=["y"])[3]["y"].item() == 3.0


def test_manifest_version_and_roundtrip(npy, stores):
    from shardload.manifest.core import Manifest

    # 3 marks variable-length arrays for older readers; 4 (compact feature files) implies it
    assert json.loads(Path(npy.root, "shardload.json").read_text())["version"] >= 3
    m = npy.manifest
    again = Manifest.from_json(m.to_json())
    assert again.arrays["tok"] == m.arrays["tok"] and again.arrays["tok"].is_ragged
    assert not again.arrays["y"].is_ragged


@pytest.mark.parametrize("fmt", ["zarr", "hdf5", "npy"])
def test_crash_while_finishing_ragged_redoes_it(tmp_path, monkeypatch, fmt):
    """A run that dies after every block is recorded, inside the pass that writes the offsets
    (and the Zarr / HDF5 values), leaves the staged chunks; the next run redoes the pass."""
    from shardload.formats.ragged import write as fr
    from shardload.util import durable as commit

    real_write = commit.write_atomic

    def crash(*args, **kwargs):
        raise OSError(5, "simulated crash")

    def write_then_crash(path, data):
        real_write(path, data)
        if str(path).endswith("offsets.npy"):
            crash()

    comp = "none" if fmt == "npy" else "lz4"
    if fmt == "npy":  # offsets written, marker not
        monkeypatch.setattr(commit, "write_atomic", write_then_crash)
    else:  # values and offsets written, marker not
        from shardload.formats.registry import get_writer

        writer = type(get_writer(fmt))
        real_finish = writer.finish_ragged

        def finish_then_crash(*args, **kwargs):
            real_finish(*args, **kwargs)
            crash()

        monkeypatch.setattr(writer, "finish_ragged", finish_then_crash)
    with pytest.raises(shardload.errors.StoreError, match="simulated crash"):
        make(tmp_path, fmt, comp, None)
    partial = tmp_path / f"{fmt}-{comp}-None.partial"
    assert partial.exists() and not (partial / "_progress" / fr.MARKER).exists()
    monkeypatch.undo()
    st = make(tmp_path, fmt, comp, None)
    for got, w in zip(st.read("tok").to_list(), expected(source()), strict=True):
        np.testing.assert_array_equal(got, w)
    assert not (Path(st.root) / fr.STAGING_DIR).exists()


@pytest.mark.parametrize("key", ["npy-none-None", "zarr-zstd-2", "hdf5-lz4-None"])
def test_read_by_url(stores, key):
    from shardload.move.serve import serving

    st = stores[key]
    with serving(Path(st.root).parent) as url:
        remote = shardload.open_store(url + key, retries=1, verify="always")
        for got, w in zip(
            remote.read("tok", 2, 30).to_list(), expected(source())[2:30], strict=True
        ):
            np.testing.assert_array_equal(got, w)
        rows = [i for b in iter_batches(remote, batch_size=8, epoch=1) for i in b["index"].tolist()]
        assert sorted(rows) == list(range(N))


@pytest.mark.slow  # importing Lightning costs most of it
def test_lightning_datamodule_buckets_train_only(npy):
    from shardload.torch.lightning import ShardloadDataModule

    dm = ShardloadDataModule(npy, batch_size=4, bucket=True)
    assert dm._dataset("train", shuffle=True, mode="drop").bucket is True
    val = dm._dataset("val", shuffle=False, mode="drop")
    assert val.bucket is False
    b = next(iter(val))
    assert b["tok"].shape == (4, int(b["tok_length"].max()))


def test_normalize_keeps_padding_zero(npy):
    import pickle

    import torch

    from shardload.train.transforms import Normalize

    norm = pickle.loads(pickle.dumps(Normalize(npy.manifest, ["tok"])))
    b = next(iter_batches(npy, batch_size=8, shuffle=False))
    t = {k: torch.from_numpy(v) for k, v in b.items()}
    norm(t)
    st, want = npy.manifest.stats["tok"], expected(source())
    for j, i in enumerate(b["index"]):
        n = int(b["tok_length"][j])
        np.testing.assert_allclose(
            t["tok"][j, :n].numpy(), (want[i] - st.mean[0]) / st.std[0], rtol=1e-5
        )
        assert not t["tok"][j, n:].any()


def test_prepare_check_shows_ragged(tmp_path, capsys):
    from shardload.cli.app import main

    sys.path.insert(0, str(TESTS))
    source().to_netcdf(tmp_path / "src.nc")
    (tmp_path / "c.yaml").write_text(
        "source: src.nc\nview: userfuncs:ragged_tokens\nsample_dims: [s]\nout: st\n"
    )
    assert main(["prepare", "--check", str(tmp_path / "c.yaml")]) == 0
    out = capsys.readouterr().out
    assert f"tok          ({N}, *)" in out and "variable-length, mean" in out


def test_streaming_dataset_bucketed_resume(tail_store):
    from shardload.torch import StreamingDataLoader, StreamingDataset

    def loader(rank, world):
        ds = StreamingDataset(
            tail_store, batch_size=16, rank=rank, world_size=world, bucket=True, shuffle_chunks=8
        )
        return StreamingDataLoader(ds, num_workers=0)

    full = [b["index"].tolist() for b in loader(0, 1)]
    first = loader(0, 1)
    it = iter(first)
    head = [next(it)["index"].tolist() for _ in range(4)]
    state = first.state_dict()
    del it
    assert head == full[:4]
    same = loader(0, 1)
    same.load_state_dict(state)
    assert head + [b["index"].tolist() for b in same] == full  # exact continuation
    rest = []
    for r in range(2):  # elastic: the rest over two ranks
        dl = loader(r, 2)
        dl.load_state_dict(state)
        rest += [i for b in dl for i in b["index"].tolist()]
    seen = [i for b in head for i in b] + rest
    assert set(seen) == set(range(400)) and len(seen) == 400
