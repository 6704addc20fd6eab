"""The kind of read a store's selected arrays need: decided here, once, for every loader.

- ``"ragged"``: variable-length arrays (:mod:`.ragged`): whole segments read, batches padded.
- ``"window"``: windows cut at load time (:mod:`.windows`): each sample's run read where it lies.
- ``"dated"``: windows of dates of a dated store (``window=``, :mod:`.dated`): a batch's
  distinct states read once each (chosen by ``LoadSpec`` from the options, not the store).
- ``"scatter"``: raw rows in local files on a platform with ``preadv`` (:mod:`.scatter`): rows
  go from the page cache straight to their batch rows (chunk files, npy stacks, and the raw
  inner chunks of local Zarr shards).
- ``"gather"``: everything else (compressed chunks, HDF5, URLs, :mod:`.gather`): segments read
  into group buffers, batches gathered out of them.

:func:`reads_rows_in_place` is the *layout* fact the planner's defaults depend on (small
pieces are cheap to read). It reads the manifest only (the arrays' format and codecs as
``shardload.json`` records them), never where the store lives or the platform: the same store
read from its folder, by URL, staged or from its SquashFS image plans the same pieces and
groups, so it yields the same batches for the same seed, epoch and world. :func:`read_kind`
picks the fastest reader of those pieces here (``preadv`` scatter reads of local files; the
gather reader, with a ranged request per piece by URL, elsewhere); every reader yields the
same batches for the same plan.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from shardload.formats.base import array_compression
from shardload.load.ragged import ragged_names
from shardload.load.scatter import raw_sources
from shardload.load.windows import WindowReader
from shardload.manifest.core import Manifest
from shardload.store.core import Store

ReadKind = Literal["gather", "scatter", "ragged", "window", "dated"]
READ_KINDS: tuple[ReadKind, ...] = ("gather", "scatter", "ragged", "window", "dated")


def stores_raw_rows(manifest: Manifest, names: Sequence[str]) -> bool:
    """Whether the manifest says every array in ``names`` is stored as raw rows: an npy stack,
    or Zarr arrays shardload wrote without compression (``compression: none``, or ``auto``
    that chose none for each of them) and without shards (each chunk a file
    of C-ordered rows, a row at ``row * row_bytes``); never variable-length or CF-encoded
    arrays (pure: the manifest only).

    >>> m = Manifest(format="npy", length=4, chunk_bounds=(0, 4), arrays={})
    >>> stores_raw_rows(m, []), stores_raw_rows(m, ["x"])
    (False, False)
    """
    arrays = manifest.arrays
    if not names or any(n not in arrays for n in names):
        return False
    if any(arrays[n].is_ragged or "cf" in arrays[n].attrs for n in names):
        return False
    if manifest.format == "npy":
        return True
    if manifest.format != "zarr" or manifest.provenance.get("source") == "plain zarr":
        return False
    opts = manifest.options
    if opts.get("shard_chunks"):
        return False
    # each array's own codec: under compression auto, some arrays may be raw and others not
    return all(array_compression(opts, n) == "none" for n in names)


def reads_rows_in_place(store: Store, names: Sequence[str]) -> bool:
    """Whether a piece of a chunk costs no more per row than the whole chunk: raw rows
    (:func:`stores_raw_rows`: locally a ``preadv`` of its rows, by URL one ranged request), or
    windows cut at load time. The manifest only, so every copy of a store plans alike."""
    if "window" in store.manifest.static:  # windows cut at load time (a WindowReader)
        return True
    return stores_raw_rows(store.manifest, names)


def read_kind(store: Store, names: Sequence[str]) -> ReadKind:
    """Which group reader reads ``names`` of ``store`` on this platform."""
    if ragged_names(store, names):
        return "ragged"
    if isinstance(store.reader, WindowReader):
        return "window"
    if raw_sources(store, names) is not None:
        return "scatter"
    return "gather"
