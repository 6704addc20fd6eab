"""``FormatTests``: the conformance tests every on-disk format passes (as zarr-python ships
``StoreTests``). A format's tests subclass it and say what the format is::

    class TestParquet(FormatTests):
        format = "parquet"
        compressions = ("none", "zstd", "lz4")

        def chunk_file(self, root, name, chunk):
            return root / name / f"{chunk:06d}.parquet"

Each test runs once per compression (a store per class and compression, prepared once). Needs
pytest and xarray (the write side), as the package's own tests do.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

import shardload
from shardload.errors import ChunkReadError, ShardloadError, StoreError
from shardload.formats.registry import format_entry
from shardload.manifest.core import NUMERIC_DTYPES

N, CHUNK_ROWS = 50, 7
DTYPES = NUMERIC_DTYPES
RAGGED_N, RAGGED_MAXLEN = 61, 13


def make_dataset(n: int = N, *, seed: int = 0) -> Any:
    """Sample dim ``sample``; ``a`` (n,), ``b`` (n, 3) with a ``feat`` coordinate, ``c``
    (4, n): the sample dim not first."""
    import xarray as xr

    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n,)).astype("float32")
    b = rng.normal(size=(n, 3)).astype("float32")
    c = rng.normal(size=(4, n)).astype("float64")
    return xr.Dataset(
        {"a": (("sample",), a), "b": (("sample", "feat"), b), "c": (("level", "sample"), c)},
        coords={"feat": ["u", "v", "w"]},
    )


def expected_flat(ds: Any) -> dict[str, np.ndarray]:
    """What the flat view of :func:`make_dataset` with ``x = a, b, c`` and ``y = b`` holds."""
    x = np.concatenate([ds.a.values[:, None], ds.b.values, ds.c.values.T], axis=1)
    return {"x": x.astype(np.result_type(ds.a, ds.b, ds.c)), "y": ds.b.values}


def ragged_tokens(ds: Any, max_len: int = RAGGED_MAXLEN) -> dict[str, Any]:
    """A function view: ``tok``, sample i the first ``(i * 7) % max_len`` values of row i of
    ``x`` (some empty), beside a fixed-shape ``y``."""
    x = ds.x.values
    return {"tok": [x[i, : (i * 7) % max_len] for i in range(len(x))], "y": ds.y}


class FormatTests:
    """Subclass, set :attr:`format` and :attr:`compressions`, and say where a chunk lives
    (:meth:`chunk_file`); override :meth:`corrupt` where one file holds every chunk."""

    format: ClassVar[str]
    compressions: ClassVar[tuple[str, ...]] = ("none",)
    #: the dtypes the format stores as themselves
    dtypes: ClassVar[tuple[str, ...]] = DTYPES
    #: one file per chunk (a deleted chunk is "missing"), not one file for every chunk
    file_per_chunk: ClassVar[bool] = True

    def chunk_file(self, root: Path, name: str, chunk: int) -> Path:
        """The file holding chunk ``chunk`` of array ``name`` of the store at ``root``."""
        raise NotImplementedError

    def corrupt(self, root: Path, name: str, chunk: int) -> Path:
        """Make chunk ``chunk`` of ``name`` hold another chunk's rows in a valid file (only a
        checksum tells): the file of the nearest earlier chunk stored apart is copied over
        it. Returns the file an error must name."""
        path = self.chunk_file(root, name, chunk)
        other = next(
            self.chunk_file(root, name, k)
            for k in range(chunk - 1, -1, -1)
            if self.chunk_file(root, name, k) != path
        )
        shutil.copyfile(other, path)
        return path

    # -- fixtures ----------------------------------------------------------------------------
    def pytest_generate_tests(self, metafunc: Any) -> None:
        if "compression" in metafunc.fixturenames:
            metafunc.parametrize("compression", self.compressions, scope="class")

    def prepare(self, out: Path, compression: str, **config: Any) -> shardload.Store:
        cfg = {
            "sample_dims": ["sample"],
            "view": "flat",
            "arrays": {"x": ["a", "b", "c"], "y": ["b"]},
            "chunk_rows": CHUNK_ROWS,
            "out": str(out),
            "format": self.format,
            "compression": compression,
            **config,
        }
        dataset = cfg.pop("dataset", None)
        if dataset is None:
            return shardload.prepare(cfg)
        return shardload.prepare(cfg, dataset=dataset, progress=False)

    @pytest.fixture(scope="class")
    def source(self, tmp_path_factory: Any) -> Path:
        path = tmp_path_factory.mktemp("source") / "small.nc"
        make_dataset(N).to_netcdf(path)
        return path

    @pytest.fixture(scope="class")
    def store(self, tmp_path_factory: Any, source: Path, compression: str) -> shardload.Store:
        out = tmp_path_factory.mktemp(f"{self.format}-{compression}") / "s"
        return self.prepare(out, compression, source={"paths": [str(source)]})

    @pytest.fixture(scope="class")
    def want(self, source: Path) -> dict[str, np.ndarray]:
        import xarray as xr

        with xr.open_dataset(source) as ds:
            return expected_flat(ds.load())

    # -- round trips -------------------------------------------------------------------------
    def test_flat_round_trip(self, store, want, compression):
        """Values in == values out, chunking, statistics and feature names in the manifest."""
        assert len(store) == 50 and store.manifest.complete and store.manifest.format == self.format
        assert store.chunk_bounds == (0, 7, 14, 21, 28, 35, 42, 49, 50)
        for name, ref in want.items():
            np.testing.assert_array_equal(store.read(name), ref)
            np.testing.assert_array_equal(store.read(name, 5, 23), ref[5:23])
            assert store.manifest.arrays[name].chunk_rows == 7
        st = store.manifest.stats["x"]
        np.testing.assert_allclose(st.mean, want["x"].astype("f8").mean(0), rtol=1e-10)
        np.testing.assert_allclose(st.std, want["x"].astype("f8").std(0), rtol=1e-6)
        assert store.manifest.arrays["x"].features[:3] == ("a", "b[u]", "b[v]")
        again = shardload.open_store(store.root)  # from disk, through the public function
        np.testing.assert_array_equal(again.read("y", 48, 50), want["y"][48:50])

    def test_every_row_range_reads_as_the_source(self, store, want):
        with shardload.open_store(store.root, verify="always") as s:
            for start in range(0, N + 1, 3):
                for stop in (*range(start, N + 1, 5), N):
                    np.testing.assert_array_equal(s.read("x", start, stop), want["x"][start:stop])

    def test_iter_batches_yields_every_row_once(self, store, want):
        seen: list[int] = []
        for batch in shardload.iter_batches(store.root, batch_size=8, seed=3):
            idx = np.asarray(batch["index"])
            for name, ref in want.items():
                np.testing.assert_array_equal(np.asarray(batch[name]), ref[idx])
            seen += idx.tolist()
        assert sorted(seen) == list(range(N))

    def test_every_dtype_round_trips(self, tmp_path, compression):
        import xarray as xr

        rng = np.random.default_rng(1)
        ds = xr.Dataset(
            {f"v_{t}": ("sample", (rng.integers(0, 100, N) / 4).astype(t)) for t in self.dtypes}
        )
        arrays = {t: [f"v_{t}"] for t in self.dtypes}
        st = self.prepare(tmp_path / "s", compression, dataset=ds, arrays=arrays)
        for t in self.dtypes:
            got = st.read(t)
            assert got.dtype == np.dtype(t), t
            np.testing.assert_array_equal(got, ds[f"v_{t}"].values[:, None], err_msg=t)

    def test_ragged_round_trips_or_is_refused(self, tmp_path, compression):
        import xarray as xr

        rng = np.random.default_rng(0)
        x = rng.normal(size=(RAGGED_N, RAGGED_MAXLEN)).astype("float32")
        ds = xr.Dataset({"x": (("s", "k"), x), "y": (("s",), np.arange(RAGGED_N, dtype="f8"))})
        want = ragged_tokens(ds)["tok"]
        cfg = {"view": f"{__name__}:ragged_tokens", "sample_dims": ["s"], "chunk_rows": 8}
        if not format_entry(self.format).ragged:
            with pytest.raises(StoreError, match="cannot store variable-length arrays"):
                self.prepare(tmp_path / "s", compression, dataset=ds, **cfg)
            return
        st = self.prepare(tmp_path / "s", compression, dataset=ds, **cfg)
        rows = st.read("tok")
        for got, w in zip(rows.to_list(), want, strict=True):
            np.testing.assert_array_equal(got, w)
        for got, w in zip(st.read("tok", 5, 27).to_list(), want[5:27], strict=True):
            np.testing.assert_array_equal(got, w)
        np.testing.assert_array_equal(st.read("y"), ds.y.values)

    def test_reading_by_url_equals_local(self, store, tmp_path):
        """Through ``shardload serve`` (HTTP ranges), with and without the local cache."""
        pytest.importorskip("aiohttp")
        from shardload.move.serve import serving

        root = Path(store.root)
        with serving(root.parent, port=0) as url:
            remote = shardload.open_store(f"{url.rstrip('/')}/{root.name}")
            assert len(remote) == len(store)
            for name in store.arrays:
                np.testing.assert_array_equal(remote.read(name), store.read(name))
                np.testing.assert_array_equal(remote.read(name, 10, 40), store.read(name, 10, 40))
            cached = shardload.open_store(
                f"{url.rstrip('/')}/{root.name}", cache_dir=tmp_path / "cache", cache_bytes=10**8
            )
            np.testing.assert_array_equal(cached.read("x", 5, 45), store.read("x", 5, 45))

    # -- damage ------------------------------------------------------------------------------
    def test_checksums_catch_a_corrupt_chunk(self, store, want, tmp_path):
        root = tmp_path / "copy"
        shutil.copytree(store.root, root)
        bad = self.corrupt(root, "x", 3)
        with shardload.open_store(root, verify="never") as s:  # a valid file: it reads...
            assert not np.array_equal(s.read("x"), want["x"])  # ...other rows
        with shardload.open_store(root, verify="always") as s:
            np.testing.assert_array_equal(s.read("x", 0, 14), want["x"][:14])  # before it: fine
            with pytest.raises(ChunkReadError) as err:
                s.read("x")
        assert str(bad) in str(err.value) and "checksum" in str(err.value), str(err.value)

    def test_a_missing_chunk_is_an_error_naming_it(self, store, tmp_path):
        root = tmp_path / "copy"
        shutil.copytree(store.root, root)
        path = self.chunk_file(root, "x", 3)
        path.unlink()
        with shardload.open_store(root, verify="never") as s:
            with pytest.raises(ShardloadError) as err:
                s.read_chunk("x", 3)
            if self.file_per_chunk:
                assert "missing" in str(err.value)
                s.read_chunk("y", 3)  # the other array's chunk is there
        assert str(path) in str(err.value), str(err.value)
