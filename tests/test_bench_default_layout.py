"""benchmarks/bench_default_layout.py's read limit on the stores ``prepare`` writes by default:
``compression: auto`` stores values lz4 cannot shrink without a codec, and the limit of such a
store is its reads (decoding its raw inner chunks as Blosc failed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from _stores import make_store

pytest.importorskip("zarr")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


@pytest.mark.parametrize("compression", ["none", "lz4"])
def test_the_limit_of_a_sharded_store_raw_or_lz4(tmp_path, compression):
    import bench_default_layout as bdl

    store = make_store(
        tmp_path, fmt="zarr", compression=compression, n=64, chunk_rows=2, shard_chunks=8
    )
    root = Path(store.url)
    assert bdl.describe(root)["compression"] == compression
    got = bdl.read_decode_limit(root, repeats=1)
    assert got["limit_Bps"] > 0 and got["limit_cpu_s"] >= 0
