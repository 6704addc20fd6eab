"""Zarr passes the format conformance tests (chunk files, and shards)."""

from __future__ import annotations

from shardload.testing.formats import FormatTests


class TestZarr(FormatTests):
    format = "zarr"
    compressions = ("none", "zstd", "lz4")

    def chunk_file(self, root, name, chunk):
        return root / name / "c" / str(chunk) / "0"


class TestZarrSharded(FormatTests):
    format = "zarr"
    compressions = ("lz4",)
    shard_chunks = 3

    def prepare(self, out, compression, **config):
        return super().prepare(out, compression, shard_chunks=self.shard_chunks, **config)

    def chunk_file(self, root, name, chunk):
        return root / name / "c" / str(chunk // self.shard_chunks) / "0"
