"""What xarray and dask users hold is accepted (issue 13, item 13): ``prepare(config,
dataset=ds)``, an active ``distributed.Client``, an fsspec mapper for ``open_store``, and
``Store.to_xarray()``."""

from __future__ import annotations

import fsspec
import numpy as np
import pytest
import xarray as xr

import shardload
from _stores import make_store


@pytest.mark.parametrize(("fmt", "comp"), [("npy", "none"), ("zarr", "lz4"), ("hdf5", "none")])
def test_open_store_accepts_an_fsspec_mapper(tmp_path, fmt, comp):
    store = make_store(tmp_path, fmt=fmt, compression=comp, n=30)
    local = shardload.open_store(fsspec.get_mapper(str(store.root)))
    np.testing.assert_array_equal(local.read("x"), store.read("x"))
    # a non-local filesystem: the store copied into fsspec's memory filesystem
    mem = fsspec.filesystem("memory")
    mem.put(str(store.root), f"/m-{fmt}", recursive=True)
    remote = shardload.open_store(fsspec.get_mapper(f"memory://m-{fmt}"))
    assert not remote.is_local and remote.url == f"memory:///m-{fmt}"
    np.testing.assert_array_equal(remote.read("x", 3, 17), store.read("x", 3, 17))
    assert remote.manifest.stats["x"] == store.manifest.stats["x"]  # feature files: same fs
    mem.rm(f"/m-{fmt}", recursive=True)


def test_to_xarray_is_lazy_with_feature_coordinates(tmp_path):
    store = make_store(tmp_path, fmt="zarr", compression="lz4", n=30, chunk_rows=7)
    ds = store.to_xarray()
    x = ds["x"]
    assert x.dims == ("sample", "x_feature") and x.chunks[0] == (7, 7, 7, 7, 2)
    assert list(ds["x_feature"].values) == list(store.manifest.arrays["x"].features)
    assert x.sel(x_feature="a").dims == ("sample",)
    np.testing.assert_array_equal(x.values, store.read("x"))
    np.testing.assert_array_equal(x[9:20].values, store.read("x", 9, 20))
    np.testing.assert_array_equal(ds["y"].values, store.read("y"))
    assert x.attrs["variables"] == ["a", "b"]
    assert list(store.to_xarray(["y"]).data_vars) == ["y"]


def test_to_xarray_reads_only_the_chunks_it_needs(tmp_path):
    store = make_store(tmp_path, fmt="npy", n=30, chunk_rows=7)
    reads: list[tuple[int, int]] = []
    real = type(store).read

    def counting(self, name, start=0, stop=None):
        reads.append((start, stop))
        return real(self, name, start, stop)

    type(store).read = counting
    try:
        x = store.to_xarray()["x"]
        assert reads == []  # lazy
        x[8:12].load(scheduler="sync")
        assert len(reads) == 1 and 7 <= reads[0][0] <= 8 and 12 <= reads[0][1] <= 14  # chunk 1
    finally:
        type(store).read = real


def _lazy_dataset(tmp_path, n=40):
    if not (tmp_path / "src.nc").exists():
        _write_source(tmp_path, n)
    return xr.open_dataset(tmp_path / "src.nc", chunks={"sample": 16})  # dask-backed, lazy


def _write_source(tmp_path, n):
    rng = np.random.default_rng(3)
    xr.Dataset(
        {"a": ("sample", np.arange(n, dtype="f4")), "b": (("sample", "k"), rng.random((n, 3)))},
        coords={"k": ["u", "v", "w"]},
    ).to_netcdf(tmp_path / "src.nc")


def test_prepare_takes_a_lazy_dataset(tmp_path):
    ref = _lazy_dataset(tmp_path).load()
    ds = _lazy_dataset(tmp_path)
    assert ds["b"].chunks is not None
    cfg = {
        "sample_dims": ["sample"],
        "arrays": {"x": ["a", "b"]},
        "chunk_rows": 7,
        "out": str(tmp_path / "s"),
    }
    store = shardload.prepare(cfg, dataset=ds)
    want = np.concatenate([ref.a.values[:, None], ref.b.values], axis=1)
    np.testing.assert_array_equal(store.read("x"), want.astype(store.manifest.arrays["x"].dtype))
    assert store.manifest.arrays["x"].features == ("a", "b[u]", "b[v]", "b[w]")
    assert store.manifest.provenance["files"] == ["xarray.Dataset passed to prepare(dataset=...)"]
    with pytest.raises(shardload.errors.ConfigError, match="replaces the config's source"):
        shardload.prepare({**cfg, "source": "x.nc"}, dataset=ds)
    with pytest.raises(shardload.errors.ConfigError, match=r"expected an xarray\.Dataset"):
        shardload.prepare(cfg, dataset=ds["a"])


@pytest.mark.distributed
def test_an_active_distributed_client_runs_the_tasks(tmp_path):
    distributed = pytest.importorskip("distributed")
    ds = _lazy_dataset(tmp_path)
    cfg = {"sample_dims": ["sample"], "arrays": {"x": ["a", "b"]}, "chunk_rows": 8}
    with (
        distributed.LocalCluster(
            n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        for i, extra in enumerate([{}, {"execution": {"scheduler": "distributed"}}]):
            with distributed.get_task_stream(client) as ts:
                store = shardload.prepare(
                    {**cfg, **extra, "out": str(tmp_path / f"s{i}")}, dataset=ds
                )
            blocks = [t for t in ts.data if str(t["key"]).startswith("run_task")]
            assert len(blocks) == store.num_chunks == 5  # every write task ran on the client
            assert client.status == "running"  # not closed: it is the user's
        with distributed.get_task_stream(client) as ts:  # threads asked for: none reach it
            shardload.prepare(
                {**cfg, "execution": "threads", "out": str(tmp_path / "t")}, dataset=ds
            )
        assert not [t for t in ts.data if str(t["key"]).startswith("run_task")]
        np.testing.assert_array_equal(
            shardload.open_store(tmp_path / "s0").read("x"),
            shardload.open_store(tmp_path / "t").read("x"),
        )
