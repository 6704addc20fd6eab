"""Parquet passes the format conformance tests, and pyarrow alone reads what Store.read serves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from shardload.testing.formats import FormatTests

pq = pytest.importorskip("pyarrow.parquet")


class TestParquet(FormatTests):
    format = "parquet"
    compressions = ("none", "zstd", "lz4")

    def chunk_file(self, root, name, chunk):
        return root / name / f"{chunk:06d}.parquet"

    def test_pyarrow_reads_the_same_values(self, store, compression):
        codec = {"none": "UNCOMPRESSED", "zstd": "ZSTD", "lz4": "LZ4"}[compression]
        for name in store.arrays:
            table = pq.read_table(f"{store.root}/{name}")  # the folder: a Parquet dataset
            column = table.column(name).combine_chunks()
            want = store.read(name)
            got = column.values.to_numpy().reshape(want.shape)  # FixedSizeList of each row
            np.testing.assert_array_equal(got, want)
            meta = pq.ParquetFile(self.chunk_file(Path(store.root), name, 0)).metadata
            assert meta.num_row_groups == 1 and meta.num_rows == 7
            assert meta.row_group(0).column(0).compression == codec


def test_without_pyarrow_the_error_names_the_extra(monkeypatch):
    import sys

    from shardload.errors import MissingDependencyError
    from shardload.formats.registry import get_writer

    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import pyarrow raises ImportError
    with pytest.raises(MissingDependencyError, match=r"pip install 'shardload\[parquet\]'"):
        get_writer("parquet")
