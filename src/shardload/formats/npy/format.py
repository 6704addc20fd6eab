"""Old home of the npy reader, kept only for ``tests/test_loader.py``'s two imports (owned by
the loader's branch): delete once they import ``shardload.formats.npy.read``."""

from shardload.formats.npy.read import NpyReader

__all__ = ["NpyReader"]
