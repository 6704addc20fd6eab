"""Zarr v3 (the default format): chunk files, shards, CF decoding."""
