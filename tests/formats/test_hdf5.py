"""HDF5 passes the format conformance tests (one file holds every chunk)."""

from __future__ import annotations

from shardload.testing.formats import FormatTests


class TestHdf5(FormatTests):
    format = "hdf5"
    compressions = ("none", "zstd")
    file_per_chunk = False

    def chunk_file(self, root, name, chunk):
        return root / "data.h5"

    def corrupt(self, root, name, chunk):
        """Chunk ``chunk``'s stored bytes replaced by chunk 0's (valid, other rows)."""
        import h5py

        path = self.chunk_file(root, name, chunk)
        with h5py.File(path, "r+") as f:
            ds = f[name]
            mask, data = ds.id.read_direct_chunk((0, 0))
            ds.id.write_direct_chunk((chunk * ds.chunks[0], 0), data, mask)
        return path
