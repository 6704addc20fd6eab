"""Windows cut at load time (``view: {name: window, at_load: true}``): the store holds the
series once; every loader path serves, for the same ``index``, the values of written windows."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ChunkReadError
from shardload.store.windows import WindowReader

pytestmark = pytest.mark.timeout(180)

T, LAT, LON = 60, 3, 4
S = LAT * LON
VIEW = {
    "name": "window",
    "time_dim": "time",
    "lookback": 4,
    "stride": 1,
    "horizon": 1,
    "targets": {"y": ["t"]},
}


def _source(tmp: Path, steps: int = T, lat: int = LAT, lon: int = LON) -> Path:
    rng = np.random.default_rng(3)
    ds = xr.Dataset(
        {
            "t": (
                ("time", "lat", "lon", "lev"),
                rng.normal(size=(steps, lat, lon, 2)).astype("f4"),
            ),
            "z": (("time", "lat", "lon"), rng.normal(size=(steps, lat, lon)).astype("f4")),
        },
        coords={"lev": [500, 850]},
    )
    path = tmp / "series.nc"
    ds.to_netcdf(path)
    return path


def _prepare(src: Path, out: Path, *, at_load: bool, view=VIEW, **kw):
    prepare = getattr(shardload.prepare, "prepare", shardload.prepare)
    cfg = {
        "source": {"paths": [str(src)]},
        "sample_dims": ["lat", "lon"],
        "view": {**view, "at_load": at_load},
        "arrays": {"x": ["t", "z"]},
        "chunk_rows": 40,
        "format": "npy",
        "compression": "none",
        "splits": {"train": 0.6, "val": 0.2, "test": 0.2},
        "out": str(out),
        **kw,
    }
    return prepare(cfg)


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("win")
    src = _source(tmp)
    written = _prepare(src, tmp / "written", at_load=False)
    out = {"written": written, "npy": _prepare(src, tmp / "npy", at_load=True)}
    out["zarr-zstd"] = _prepare(src, tmp / "zarr", at_load=True, format="zarr", compression="zstd")
    out["full"] = {a: written.read(a) for a in written.arrays}  # type: ignore[assignment]
    return out


def _check(batch, full):
    idx = np.asarray(batch["index"])
    for a, arr in full.items():
        np.testing.assert_array_equal(np.asarray(batch[a]), arr[idx], err_msg=f"array {a}")


@pytest.mark.parametrize("name", ["npy", "zarr-zstd"])
def test_values_layout_and_splits_equal_written_windows(stores, name):
    w, s = stores["written"], stores[name]
    m, mw = s.manifest, w.manifest
    assert len(s) == len(w) and m.chunk_bounds == mw.chunk_bounds
    assert {a: i.shape for a, i in m.arrays.items()} == {a: i.shape for a, i in mw.arrays.items()}
    assert m.splits == mw.splits and m.split_rows == mw.split_rows  # time ranges, reused
    assert list(m.arrays["x"].features) == list(mw.arrays["x"].features)
    for a in ("x", "y"):
        np.testing.assert_array_equal(s.read(a), w.read(a))
        np.testing.assert_array_equal(s.read(a, 17, 53), w.read(a, 17, 53))
    # t is stored once though both x and y use it: two series arrays (t, z)
    series = m.static["window"]["series"]["arrays"]
    assert sorted(v["attrs"]["variable"] for v in series.values()) == ["t", "z"]
    assert isinstance(s.reader, WindowReader)
    # raw local rows go through preadv; compressed chunks through the format's reader
    assert (s.reader.raw("series-00", 0) is not None) == (name == "npy")


@pytest.mark.parametrize("name", ["npy", "zarr-zstd"])
def test_iter_batches_every_split_rank_and_worker(stores, name):
    s, full = stores[name], stores["full"]
    for split in ("train", "val", "test"):
        a, b = s.manifest.split_rows[split]
        for world, workers in ((1, 0), (2, 2)):
            seen, counts = [], []
            for rank in range(world):
                n = 0
                for w in range(max(1, workers)):
                    for batch in shardload.iter_batches(
                        s,
                        batch_size=7,
                        split=split,
                        seed=1,
                        epoch=2,
                        rank=rank,
                        world_size=world,
                        worker=w,
                        num_workers=workers,
                        mode="pad",
                    ):
                        _check(batch, full)
                        seen.extend(batch["index"].tolist())
                        n += 1
                counts.append(n)
            assert len(set(counts)) == 1  # every rank the same number of batches
            assert set(seen) == set(range(a, b))  # the split's windows, no other


def test_no_window_of_test_time_in_train(stores):
    s = stores["npy"]
    g = s.reader.geometry
    steps = {}
    for split in ("train", "val", "test"):
        rows = np.concatenate(
            [b["index"] for b in shardload.iter_batches(s, batch_size=16, split=split)]
        )
        w = np.unique(rows // S)
        steps[split] = {t for k in w for t in range(k, k + g.lookback + g.horizon)}
    assert not steps["train"] & steps["val"] and not steps["val"] & steps["test"]
    assert max(steps["train"]) < min(steps["test"])


def test_default_shuffle_mixes_the_whole_split(stores):
    """A batch draws windows from all over the split (all times and space points), not from a
    few neighbouring windows."""
    s = stores["npy"]
    a, b = s.manifest.split_rows["train"]
    first = [
        next(iter(shardload.iter_batches(s, batch_size=32, split="train", epoch=e)))
        for e in range(4)
    ]
    for batch in first:
        w = batch["index"] // S
        assert len(np.unique(w)) >= 16  # 32 draws over 31 windows: ~20 distinct
        assert w.max() - w.min() >= (b - a) // S // 2
    orders = {tuple(batch["index"].tolist()) for batch in first}
    assert len(orders) == 4  # a new order every epoch


def test_uniform_shuffle_and_no_shuffle(stores):
    s, full = stores["npy"], stores["full"]
    for shuffle in ("uniform", False):
        rows = []
        for batch in shardload.iter_batches(s, batch_size=9, split="val", shuffle=shuffle):
            _check(batch, full)
            rows.extend(batch["index"].tolist())
        a, b = s.manifest.split_rows["val"]
        assert sorted(rows) == list(range(a, b))
        assert (rows == list(range(a, b))) == (shuffle is False)


def test_elastic_resume_reads_each_row_once(stores):
    from test_resume_property import check_resume

    # (names other than check_resume's raw-row stores: windows never take the scatter path)
    both = {
        "window-npy": (stores["npy"], stores["full"]),
        "window-zarr-zstd": (stores["zarr-zstd"], stores["full"]),
    }
    for name in both:
        for first, resumes, shuffle in (
            ((2, 2), [((1, 0), 0.4)], True),
            ((1, 3), [((3, 1), 0.3), ((2, 0), 0.5)], "uniform"),
        ):
            check_resume(
                both,
                name,
                "scatter",
                first=first,
                resumes=resumes,
                batch_size=5,
                shuffle_chunks=None,
                piece_rows=None,
                seed=2,
                shuffle=shuffle,
                mode_last=("drop", False),
            )


def test_size_on_disk_is_the_series_once(tmp_path):
    src = _source(tmp_path, steps=400, lat=6, lon=10)
    source_bytes = sum(v.nbytes for v in xr.open_dataset(src).data_vars.values())
    s = _prepare(src, tmp_path / "s", at_load=True, chunk_rows=None)
    w = _prepare(src, tmp_path / "w", at_load=False, chunk_rows=None)

    def du(p):
        return int(subprocess.check_output(["du", "-sb", str(p)]).split()[0])

    assert du(s.url) <= 1.3 * source_bytes
    assert du(w.url) > 4 * source_bytes  # written windows: every step lookback + 1 times


def test_a_truncated_series_chunk_is_an_error_naming_it(tmp_path):
    s = _prepare(_source(tmp_path), tmp_path / "s", at_load=True, splits={"train": 1.0})
    victim = sorted(Path(s.url, "series-01").glob("*.npy"))[0]
    victim.write_bytes(victim.read_bytes()[:200])
    with pytest.raises(ChunkReadError, match=str(victim)):
        for _ in shardload.iter_batches(s, batch_size=8, split="train"):
            pass


def test_verify_cli_checks_the_series(tmp_path):
    from shardload.cli.app import main

    s = _prepare(_source(tmp_path), tmp_path / "s", at_load=True, splits={"train": 1.0})
    assert main(["verify", s.url]) == 0
    victim = sorted(Path(s.url, "series-00").glob("*.npy"))[-1]
    data = bytearray(victim.read_bytes())
    data[-3] ^= 0x10
    victim.write_bytes(bytes(data))
    assert main(["verify", s.url]) == 1


@pytest.mark.parametrize(
    "context",
    ["fork", pytest.param("spawn", marks=pytest.mark.slow)],  # spawn: ~45 s here
)
def test_streaming_dataloader_workers_and_mid_epoch_resume(stores, context):
    """Through StreamingDataLoader with forked (shared-memory ring) and spawned workers: the
    values of written windows, each train window once, and a mid-epoch state resumes with
    exactly the unseen windows on another worker count."""
    torch = pytest.importorskip("torch")
    from shardload.torch import StreamingDataLoader, StreamingDataset

    s, full = stores["npy"], stores["full"]

    def loader(workers):
        ds = StreamingDataset(s, batch_size=8, split="train", seed=4)
        return StreamingDataLoader(
            ds, num_workers=workers, multiprocessing_context=context if workers else None
        )

    first = loader(2)
    got = []
    for batch in first:
        assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape[1:] == (4, 3)
        _check(batch, full)
        got.extend(batch["index"].tolist())
    a, b = s.manifest.split_rows["train"]
    assert sorted(got) == list(range(a, b))
    again = loader(2)
    it = iter(again)
    head = [next(it)["index"].tolist() for _ in range(5)]
    state = again.state_dict()
    del it
    rest = loader(0)
    rest.load_state_dict(state)
    tail = [b["index"].tolist() for b in rest]
    seen = [r for bt in head + tail for r in bt]
    assert sorted(seen) == list(range(a, b)) and len(seen) == len(set(seen))


@pytest.mark.slow
def test_spawned_workers_stopped_mid_epoch_leave_without_aborting(stores, capfd):
    """A DataLoader stopped mid-epoch shuts its spawned workers down while their queue feeder
    threads may still pickle batches into shared memory; interpreter finalization used to end
    such a thread by unwinding it through C++, aborting the worker ("terminate called without
    an active exception"; in the main process "worker ... is killed by signal: Aborted", about
    one stop in three). Each worker must leave cleanly."""
    import gc
    import warnings

    from shardload.torch import StreamingDataLoader, StreamingDataset

    gc.collect()  # what earlier tests in this process left for the collector is not ours
    for _ in range(6):
        ds = StreamingDataset(stores["npy"], batch_size=8, split="train", seed=4)
        loader = StreamingDataLoader(ds, num_workers=2, multiprocessing_context="spawn")
        it = iter(loader)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # an error in the iterator's __del__ shows as one
            [next(it) for _ in range(5)]
            # the loader holds its iterator (workers persist by default): both go
            del it, loader
            gc.collect()
    err = capfd.readouterr().err
    assert "terminate called" not in err and "killed by signal" not in err, err


def test_datamodule_serves_windows_cut_at_load_time(stores):
    pytest.importorskip("lightning")
    from types import SimpleNamespace

    from shardload.torch.lightning import ShardloadDataModule

    s, full = stores["npy"], stores["full"]
    dm = ShardloadDataModule(s, batch_size=8, seed=1, num_workers=1)
    dm.trainer = SimpleNamespace(current_epoch=0, training=True)
    rows = []
    for batch in dm.train_dataloader():
        _check(batch, full)
        rows.extend(batch["index"].tolist())
    a, b = s.manifest.split_rows["train"]
    assert sorted(rows) == list(range(a, b))
    for batch in dm.val_dataloader():
        _check(batch, full)
