"""A Zarr store read by URL: a chunk or shard missing on the server is an error naming it on
every read path, never the array's fill value (issue 26, row 1).

zarr-python reads an HTTP 404 as "chunk never written" and serves its fill value; a local
store has always refused a missing chunk. The same damage (one chunk file, or one shard file,
deleted) read through ``shardload serve`` with the defaults must raise ``ChunkReadError``
naming the file's URL, and every batch or row served before the error must be right.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import shardload
from shardload.errors import ChunkReadError, ShardloadError
from shardload.move.serve import serving
from test_corruption import FORMATS, LIMIT_S, PATHS, _expected, _prepare, read_all, unit_file

N = 1000  # as test_corruption: BAD_CHUNK's rows lie inside it
ZARR = ("zarr-none", "zarr-zstd", "zarr-sharded")


@pytest.fixture(scope="module")
def served(tmp_path_factory) -> Iterator[tuple[str, dict[str, dict[str, np.ndarray]]]]:
    """Each Zarr layout prepared twice (``FMT`` intact, ``FMT-damaged`` missing the file of
    chunk BAD_CHUNK of ``x``), served over HTTP; the values as written, per layout."""
    root = tmp_path_factory.mktemp("served")
    src = root / "src.nc"
    rng = np.random.default_rng(0)
    xr.Dataset(
        {
            "a": ("sample", np.arange(N, dtype="f4") + 1),  # no zero row: zeros are visible
            "b": (("sample", "lev"), rng.standard_normal((N, 3)).astype("f4")),
            "c": ("sample", np.arange(N, dtype="i8") * 10),
        }
    ).to_netcdf(src)
    expected = {}
    for fmt in ZARR:
        _prepare(root / fmt, src, FORMATS[fmt])
        expected[fmt] = _expected(root / fmt)
        shutil.copytree(root / fmt, root / f"{fmt}-damaged")
        unit_file(root / f"{fmt}-damaged", fmt).unlink()
    with serving(root) as url:
        yield url, expected


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("fmt", ZARR)
def test_missing_chunk_by_url_is_an_error_naming_it(served, fmt, path):
    url, expected = served
    bad_url = url + unit_file(Path(f"{fmt}-damaged"), fmt).as_posix()
    t0 = time.perf_counter()
    with pytest.raises(ShardloadError) as err:
        read_all(path, url + f"{fmt}-damaged", expected[fmt])
    assert time.perf_counter() - t0 < LIMIT_S
    assert bad_url in str(err.value), str(err.value)
    assert "missing" in str(err.value)
    if path in ("store_read", "iter_batches"):  # in this process: the type itself
        assert isinstance(err.value, ChunkReadError)


@pytest.mark.parametrize("fmt", ZARR)
def test_intact_store_by_url_reads_as_written(served, fmt):
    """The same reads pass on the undamaged copy (the errors above come from the damage)."""
    url, expected = served
    for path in ("store_read", "iter_batches"):
        read_all(path, url + fmt, expected[fmt])


def test_store_read_by_url_never_serves_zeros_for_a_missing_shard(served):
    url, expected = served
    s = shardload.open_store(url + "zarr-sharded-damaged")
    np.testing.assert_array_equal(s.read("x", 0, 100), expected["zarr-sharded"]["x"][:100])
    with pytest.raises(ChunkReadError, match=r"array 'x' is missing"):
        s.read("x", 100, 300)
