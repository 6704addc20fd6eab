"""Variable-length (ragged) arrays: values + offsets, in any format that declares them
(``ragged=True`` in :mod:`shardload.formats.registry`).

A ragged array ``NAME`` of a store with ``N`` samples is stored as its values (1-D, the rows
concatenated) and ``N + 1`` int64 offsets (global: row ``i`` is
``values[offsets[i]:offsets[i+1]]``). Where each lies is the format's own (its writer's
``finish_ragged`` and its reader's ``open_ragged``): npy keeps one ``.npy`` of values per sample
chunk, Zarr a group of two arrays, HDF5 a file of its own, ``ragged.h5``.

Writing goes through the commit protocol (:mod:`shardload.prep.commit`). A write task writes the
values of its sample chunks, one ``.npy`` per chunk (temporary file, fsync, rename): in place
(npy) or into ``_ragged/NAME/`` (staging, the writer's ``ragged_staged``); the block's row
lengths go into its progress record. Once every block is recorded, the driver
(:func:`~shardload.formats.ragged.write.finish_ragged`) computes the global offsets from the
records (a prefix sum), has the writer write them (and the staged values, from scratch), marks
``_progress/ragged.json`` and removes the staging. A run killed there redoes this step.

Checksums: unit ``c`` of a ragged array is sample chunk ``c``'s values, over their C-ordered
bytes as a reader decodes them (in every format); unit ``num_chunks`` is the offsets array.
Readers check them as ``verify`` says; ``"auto"`` is ``"first-epoch"`` (the reader holds a
chunk's values anyway).
"""
