"""The optional compiled part of shardload (everything else is in pyproject.toml).

``shardload.formats.zarr._decode_rows`` decodes a compressed shard's inner chunks straight into
the batch rows their rows go to (formats/zarr/shard_rows.py), and reads raw rows the page cache
holds through a small buffer into their batch rows (load/runs.py). ``optional=True``: where it
does not build (no C compiler), the install goes on and the loader reads those shards into group
buffers and gathers batches out of them, and raw rows through io_uring, as it did before, with
the same batches.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shardload.formats.zarr._decode_rows",
            ["src/shardload/formats/zarr/_decode_rows.c"],
            optional=True,
        )
    ]
)
