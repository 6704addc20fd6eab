"""npy stacks pass the format conformance tests."""

from __future__ import annotations

from shardload.testing.formats import FormatTests


class TestNpy(FormatTests):
    format = "npy"
    compressions = ("none",)

    def chunk_file(self, root, name, chunk):
        return root / name / f"{chunk:06d}.npy"
