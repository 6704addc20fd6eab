"""The optional compiled part of shardload (everything else is in pyproject.toml).

``shardload.formats.zarr._decode_rows`` decodes a compressed shard's inner chunks straight into
the batch rows their rows go to (formats/zarr/shard_rows.py), and reads raw rows the page cache
holds through a small buffer into their batch rows (load/runs.py). ``optional=True``: where it
does not build (no C compiler), the install goes on and the loader reads those shards into group
buffers and gathers batches out of them, and raw rows through io_uring, as it did before, with
the same batches.
``stats_f32`` (``_stats_f32.c``, in the same module) computes prepare's statistics sums of a
float32 block in numpy's order (prep/stats/block.py; without it, numpy computes the same bits).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "shardload.formats.zarr._decode_rows",
            [
                "src/shardload/formats/zarr/_decode_rows.c",
                "src/shardload/formats/zarr/_stats_f32.c",
            ],
            # the statistics add in numpy's order, bit for bit: no contracted multiply-adds
            extra_compile_args=["-ffp-contract=off"],
            optional=True,
        )
    ]
)
